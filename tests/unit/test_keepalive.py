"""SSE keep-alives (tokenizer_proc/web/sse.py): comments while a stream waits, nothing
added once events flow, and closing the stream closes (aborts) the events below it."""

from __future__ import annotations

import asyncio

from tokenizer_proc.web.sse import KEEPALIVE, with_keepalive


def test_keepalives_fill_the_silence_and_events_pass_unchanged():
    gate = asyncio.Event()

    async def events():
        await gate.wait()
        yield "data: 1\n\n"
        yield "data: [DONE]\n\n"

    async def run():
        out = []
        async for item in with_keepalive(events(), 0.02):
            out.append(item)
            if out.count(KEEPALIVE) == 3:
                gate.set()
        return out

    out = asyncio.run(run())
    assert out[:3] == [KEEPALIVE] * 3 and out[-2:] == ["data: 1\n\n", "data: [DONE]\n\n"]
    assert all(x == KEEPALIVE for x in out[:-2])


def test_off_passes_through_and_closing_early_closes_the_events():
    closed = []

    async def events():
        try:
            yield "a"
            await asyncio.sleep(60)
            yield "b"
        finally:
            closed.append(True)

    async def run(interval):
        it = with_keepalive(events(), interval)
        first = await it.__anext__()
        if interval:
            assert await it.__anext__() == KEEPALIVE  # events() is now parked in its sleep
        await it.aclose()
        return first

    assert asyncio.run(run(0)) == "a" and closed == [True]
    assert asyncio.run(run(0.02)) == "a" and closed == [True, True]
