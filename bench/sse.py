"""Timing streamed OpenAI chat responses, for the benchmarks: one parser of SSE lines, and
an async request that records when its first and last content chunks arrived."""

from __future__ import annotations

import json
import time


def chunk_event(line: str) -> tuple[bool, int | None]:
    """(whether `line` carries content or logprobs, the completion tokens of a usage chunk
    or None). Non-data lines and ``[DONE]`` carry neither. Raises `RuntimeError` for an
    error event."""
    if not line.startswith("data: {"):
        return False, None
    chunk = json.loads(line[6:])
    if "error" in chunk:
        raise RuntimeError(chunk["error"])
    if chunk.get("usage"):
        return False, chunk["usage"]["completion_tokens"]
    choice = chunk["choices"][0] if chunk["choices"] else {}
    return bool(choice.get("delta", {}).get("content") or choice.get("logprobs")), None


async def timed_stream(client, url: str, body: dict) -> tuple[int, float, float]:
    """POST `body` (a streamed chat request with ``stream_options.include_usage``) with the
    httpx.AsyncClient `client`; returns (completion tokens, perf_counter seconds of the first
    and of the last content chunk; 0.0 when none came). Raises `RuntimeError` for a non-200
    status or an error event."""
    first = last = 0.0
    n = 0
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            content, usage = chunk_event(line)
            if usage is not None:
                n = usage
            elif content:
                last = time.perf_counter()
                first = first or last
    return n, first, last
