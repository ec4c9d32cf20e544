"""Timing streamed OpenAI responses (chat or completions), for the benchmarks: one parser of
SSE lines, an async request that records when each content chunk arrived and the usage, and
the (tokens, first, last) summary most benchmarks need."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field


def chunk_event(line: str) -> tuple[bool, dict | None]:
    """(whether `line` carries content (chat ``delta.content``, completions ``text``) or
    logprobs, its ``usage`` dict or None). Non-data lines and ``[DONE]`` carry neither.
    Raises `RuntimeError` for an error event."""
    if not line.startswith("data: {"):
        return False, None
    chunk = json.loads(line[6:])
    if "error" in chunk:
        raise RuntimeError(chunk["error"])
    choice = chunk["choices"][0] if chunk.get("choices") else {}
    content = bool(choice.get("delta", {}).get("content") or choice.get("text") or choice.get("logprobs"))
    return content, chunk.get("usage") or None


@dataclass
class StreamRecord:
    """One streamed request. start, end: perf_counter seconds when it was sent and when its
    stream closed; chunk_times: perf_counter seconds of each chunk carrying content; usage:
    the server's usage dict (``prompt_tokens``, ``completion_tokens``) or None when it sent none."""

    start: float
    end: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    usage: dict | None = None


async def record_stream(client, url: str, body: dict, path: str = "/v1/chat/completions") -> StreamRecord:
    """POST `body` (a streamed request; ask ``stream_options.include_usage`` for usage) to
    `url` + `path` with the httpx.AsyncClient `client` and record it. Raises `RuntimeError`
    for a non-200 status or an error event, httpx errors for a failed connection."""
    rec = StreamRecord(time.perf_counter())
    async with client.stream("POST", f"{url}{path}", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            content, usage = chunk_event(line)
            if content:
                rec.chunk_times.append(time.perf_counter())
            if usage is not None:
                rec.usage = usage
    rec.end = time.perf_counter()
    return rec


async def timed_stream(client, url: str, body: dict) -> tuple[int, float, float]:
    """POST `body` (a streamed chat request with ``stream_options.include_usage``) with the
    httpx.AsyncClient `client`; returns (completion tokens (0 without usage), perf_counter
    seconds of the first and of the last content chunk; 0.0 when none came). Raises
    `RuntimeError` for a non-200 status or an error event."""
    rec = await record_stream(client, url, body)
    n = rec.usage["completion_tokens"] if rec.usage else 0
    times = rec.chunk_times or [0.0]
    return n, times[0], times[-1]
