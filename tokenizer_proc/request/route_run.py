"""Running a checked request (`request.builder.Built`) for a route: the deltas of every
choice, with the request aborted when the client goes away. Shared by the OpenAI, native,
Anthropic and Responses routes, which differ only in how they show the deltas."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass

from fastapi import Request

from protocol.enums import FinishReason
from tokenizer_proc.errors import APIError
from tokenizer_proc.link.request_hold import ClientGone
from tokenizer_proc.link.tokenizer_manager import Delta, TokenizerManager
from tokenizer_proc.output.blocks import Block, ChoiceBlocks
from tokenizer_proc.request.builder import Built
from tokenizer_proc.request.choices import merged

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


async def collect(manager: TokenizerManager, built: Built, gone: ClientGone | None = None) -> list[list[Delta]]:
    """Every delta of every choice, by choice index. gone: whether the client has left
    (see `choices.merged`)."""
    deltas: list[list[Delta]] = [[] for _ in built.reqs]
    async for i, d in merged(manager, built, gone=gone):
        deltas[i].append(d)
    return deltas


@dataclass(frozen=True)
class Outcome:
    """A finished single-choice chat request: why it ended (reason, and the stop string or
    token id it matched), its token counts (cached: prompt tokens the prefix cache served),
    its output blocks (reasoning, text, tool calls), whether it ended with complete tool
    calls (`output.blocks.ChoiceBlocks.called_tools`) and the completion tokens spent
    reasoning (`output.blocks.ChoiceBlocks.reasoning_tokens`)."""

    reason: FinishReason
    matched: str | int | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    blocks: list[Block]
    tool_calls: bool
    reasoning_tokens: int = 0

    @classmethod
    def of(cls, built: Built, last: Delta, reader: ChoiceBlocks) -> Outcome:
        """The outcome of choice 0 of `built`, given its `last` delta and the `reader` that read them all."""
        return cls(
            last.finish_reason,
            last.matched_stop,
            len(built.reqs[0].input_ids),
            last.completion_tokens,
            last.cached_tokens,
            reader.blocks,
            reader.called_tools(last.finish_reason),
            reader.reasoning_tokens,
        )

    @property
    def text(self) -> str:
        """The text blocks joined (no reasoning, no calls)."""
        return "".join(b.text for b in self.blocks if b.kind == "text")


async def run_one(request: Request, manager: TokenizerManager, built: Built) -> Outcome:
    """Run the single choice of `built` to its end (aborted if the client leaves), its
    output read as `built.output` says."""
    deltas = (await until_disconnect(request, collect(manager, built)))[0]
    reader = ChoiceBlocks(built.output)
    for d in deltas:
        reader.step(d)
    return Outcome.of(built, deltas[-1], reader)
