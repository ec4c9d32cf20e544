"""Requests with ``n`` > 1 choices (one `GenerateReq` per choice, made by `fan_out`): whether
they can start, and their deltas merged. The first error of any choice fails the whole
request; leaving early (a client disconnect) aborts every choice still running.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from protocol.messages import GenerateReq
from tokenizer_proc.errors import FieldError
from tokenizer_proc.link.request_hold import ClientGone, Hold
from tokenizer_proc.link.tokenizer_manager import Delta, TokenizerManager
from tokenizer_proc.request.builder import Built

_DONE = object()


def check_can_start(
    manager: TokenizerManager,
    reqs: list[GenerateReq],
    client_rids: tuple[str, ...] = (),
    gone: ClientGone | None = None,
) -> Hold:
    """Raises `APIError` when any choice could not start now (see
    `TokenizerManager.check_can_start`; client_rids: per choice, the id its client chose,
    () for none) or the queue has no room for them all (`TokenizerManager.check_room`);
    otherwise claims that room and those ids at once and returns the claim (`Hold`: hand it
    to `merged`, and release it if the request never runs, as `web.sse.SseResponse`
    does). Streamed routes call it before answering 200. A server shutting down says so
    (503) before any 429: the room a retry would wait for never comes. gone: whether the
    request's client has left, kept with the ids it claims (`Hold`)."""
    for i, req in enumerate(reqs):
        manager.check_can_start(req.rid, client_rids[i] if client_rids else None)
    manager.check_room(len(reqs))
    return manager.hold(len(reqs), tuple(c for c in client_rids if c is not None), gone)


async def claim(
    manager: TokenizerManager,
    reqs: list[GenerateReq],
    client_rids: tuple[str, ...] = (),
    gone: ClientGone | None = None,
) -> Hold:
    """`check_can_start` after waiting a moment for client-chosen ids still held by
    requests whose clients have left (`TokenizerManager.wait_rids_free`): an id reused at
    once after its client left a stream starts, rather than being refused as in use."""
    await manager.wait_rids_free(client_rids)
    return check_can_start(manager, reqs, client_rids, gone)


async def merged(
    manager: TokenizerManager, built: Built, hold: Hold | None = None, gone: ClientGone | None = None
) -> AsyncIterator[tuple[int, Delta]]:
    """Run every choice of `built` and yield ``(index, delta)`` in arrival order (each
    choice's own deltas in order). hold: what `check_can_start` claimed for them already
    (None: claim here, `claim`, with the ids the client chose, `Built.client_rids`, and
    `gone`, whether the client has left). Raises
    the first `APIError` any choice gets, a `FieldError` named as `built`'s body has the field
    (`Built.param`); the others are then aborted, as they are when the caller stops iterating."""
    reqs, client_rids = built.reqs, built.client_rids
    if hold is None:
        hold = await claim(manager, reqs, client_rids, gone)
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(index: int, req: GenerateReq) -> None:
        try:
            async for d in manager.generate(req, client_rids[index] if client_rids else None, hold):
                queue.put_nowait((index, d))
        except Exception as e:  # handed to the consumer, which raises it
            queue.put_nowait((index, e))
        finally:
            queue.put_nowait((index, _DONE))

    tasks = [asyncio.ensure_future(pump(i, r)) for i, r in enumerate(reqs)]
    try:
        running = len(tasks)
        while running:
            index, item = await queue.get()
            if item is _DONE:
                running -= 1
            elif isinstance(item, FieldError):
                raise item.named(built.param(index, item.field))
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        hold.release()  # choices cancelled before they started


@dataclass
class Totals:
    """Usage over a request's choices: prompt_tokens: each prompt counted once; completion
    tokens summed over the choices; cached prompt tokens as each prompt's group leader
    (`leaders`: their choice indexes) reports them."""

    prompt_tokens: int
    leaders: frozenset[int] = frozenset({0})
    completion: dict[int, int] = field(default_factory=dict)
    cached: dict[int, int] = field(default_factory=dict)

    def add(self, index: int, d: Delta) -> None:
        """Take choice `index`'s latest delta (counts are cumulative per choice)."""
        self.completion[index] = d.completion_tokens
        if index in self.leaders:
            self.cached[index] = d.cached_tokens

    @property
    def completion_tokens(self) -> int:
        """Completion tokens of all choices together."""
        return sum(self.completion.values())

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the prefix cache served, over all prompts."""
        return sum(self.cached.values())
