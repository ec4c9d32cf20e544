"""Client side of the fault tests (test_recovery, test_tensor_parallel, test_tp_hosts): a
greedy completion streamed into a list, polling with a deadline, waiting for /health to
come back after a 503, and a process killed while a stream decodes. Imports nothing but
httpx."""

from __future__ import annotations

import asyncio
import json
import time

import httpx


def body(max_tokens: int, stream: bool) -> dict:
    """A greedy /v1/completions request of exactly `max_tokens` tokens (``ignore_eos``)."""
    return {
        "prompt": "Once upon a time",
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }


async def stream(c: httpx.AsyncClient, url: str, max_tokens: int, events: list) -> list:
    """Stream a completion into `events`: each data event's JSON, then "[DONE]"."""
    async with c.stream("POST", f"{url}/v1/completions", json=body(max_tokens, True)) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                events.append("[DONE]" if line == "data: [DONE]" else json.loads(line[6:]))
    return events


async def until(pred, timeout: float, what: str) -> None:
    """Poll the coroutine function `pred` until it returns true; AssertionError naming `what`
    after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not await pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def health_until_back(c: httpx.AsyncClient, url: str, seen: list[tuple[int, str]]) -> None:
    """Poll /health into `seen` (status, error message) until it answers 200 after a 503."""
    while not any(status == 503 for status, _ in seen) or seen[-1][0] != 200:
        r = await c.get(f"{url}/health")
        seen.append((r.status_code, r.json().get("error", {}).get("message", "")))
        await asyncio.sleep(0.05)


def kill_mid_stream(url: str, kill, after_kill=None) -> tuple[dict, float]:
    """Stream a long request from the server at `url`; once 2 events arrived call `kill()`,
    wait for the stream to end, await `after_kill()` when given, then poll /health until it
    answers 200 after a 503. Returns (the stream's error, seconds from the kill to health);
    asserts the stream ended with an error event then [DONE]."""

    async def scenario() -> tuple[list, float]:
        async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=120)) as c:
            events: list = []
            task = asyncio.create_task(stream(c, url, 1500, events))
            await until(lambda: asyncio.sleep(0, len(events) >= 2), 30, "2 streamed events")
            kill()
            killed = time.monotonic()
            await asyncio.wait_for(task, 30)
            if after_kill is not None:
                await after_kill()
            await asyncio.wait_for(health_until_back(c, url, []), 120)
            return events, time.monotonic() - killed

    events, recovery_s = asyncio.run(scenario())
    assert events[-1] == "[DONE]", events[-3:]
    return events[-2]["error"], recovery_s
