"""Running a checked request (`request_builder.Built`) for a route: the deltas of every
choice, with the request aborted when the client goes away. Shared by the OpenAI, native,
Anthropic and Responses routes, which differ only in how they show the deltas."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Awaitable

from fastapi import Request

from protocol.enums import FinishReason
from tokenizer_proc.choices import merged
from tokenizer_proc.errors import APIError
from tokenizer_proc.request_builder import Built
from tokenizer_proc.tokenizer_manager import Delta, TokenizerManager

DISCONNECT_POLL_S = 0.5


async def until_disconnect(request: Request, work: Awaitable) -> object:
    """Await `work`; cancel it (which aborts the request) if the client goes away first
    (then raises `APIError` 499)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                raise APIError("client disconnected", 499)
    finally:
        if not task.done():
            task.cancel()


async def collect(manager: TokenizerManager, built: Built) -> list[list[Delta]]:
    """Every delta of every choice, by choice index."""
    deltas: list[list[Delta]] = [[] for _ in built.reqs]
    async for i, d in merged(manager, built.reqs):
        deltas[i].append(d)
    return deltas


@dataclass(frozen=True)
class Outcome:
    """A finished single-choice request: its text, why it ended (reason, and the stop string
    or token id it matched), and its token counts (cached: prompt tokens the prefix cache served)."""

    text: str
    reason: FinishReason
    matched: str | int | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    @classmethod
    def of(cls, built: Built, deltas: list[Delta]) -> "Outcome":
        """The outcome of choice 0 of `built` from all its `deltas`."""
        last = deltas[-1]
        return cls("".join(d.text for d in deltas), last.finish_reason, last.matched_stop,
                   len(built.reqs[0].input_ids), last.completion_tokens, last.cached_tokens)


async def run_one(request: Request, manager: TokenizerManager, built: Built) -> Outcome:
    """Run the single choice of `built` to its end (aborted if the client leaves)."""
    deltas = await until_disconnect(request, collect(manager, built))
    return Outcome.of(built, deltas[0])
