"""Server-sent events: the event format (`sse`, `error_event`), and keep-alives, so that a
streamed request that is queued or prefilling stays visibly alive.

Between a stream's 200 and its first token the client would otherwise see nothing (a
queued request looked dead for minutes on a busy machine, and proxies time out idle
connections). `with_keepalive` writes an SSE comment line, which clients ignore (the SSE
format: a line starting with ``:``), whenever `interval` seconds pass without an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.responses import StreamingResponse

from tokenizer_proc.errors import APIError

if TYPE_CHECKING:
    from tokenizer_proc.link.request_hold import Hold

KEEPALIVE = ": keep-alive\n\n"


def sse(obj: dict | str) -> str:
    """One server-sent event line pair: ``data: <json>\\n\\n`` (or a literal such as [DONE])."""
    payload = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"data: {payload}\n\n"


def error_event(e: APIError) -> str:
    """`e` as the event ``{"error": {message, type, param, code}}`` that ends an OpenAI-shaped
    or native stream, before its ``[DONE]``."""
    return sse({"error": e.body()})


async def with_keepalive(events: AsyncIterator[str], interval: float) -> AsyncIterator[str]:
    """Yield `events`' items, and `KEEPALIVE` after each `interval` seconds (> 0) without one;
    interval <= 0 passes `events` through. Closing this iterator (a client that went away)
    cancels the pending read and closes `events`, so its own clean-up (the abort) runs."""
    if interval <= 0:
        async for item in events:
            yield item
        return
    pending: asyncio.Future | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(events.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=interval)
            if not done:
                yield KEEPALIVE
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            finally:
                pending = None
            yield item
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        await events.aclose()


class SseResponse(StreamingResponse):
    """A ``text/event-stream`` response of `events` with keep-alives every `interval` s
    (`with_keepalive`) that gives back what its request claimed before the 200 (`hold`:
    queue room and client ids, from `choices.check_can_start`) when it ends, also when its
    body never ran (a client that left before the first byte), so nothing is leaked."""

    def __init__(self, events: AsyncIterator[str], interval: float, hold: Hold) -> None:
        super().__init__(with_keepalive(events, interval), media_type="text/event-stream")
        self.hold = hold

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.hold.release()
