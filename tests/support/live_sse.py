"""The events of an SSE response from a live server (httpx)."""

from __future__ import annotations

import json

import httpx


def sse_events(r: httpx.Response) -> list:
    """The ``data:`` payloads of `r`'s lines, JSON-decoded (``[DONE]`` kept as the string)."""
    out = []
    for line in r.iter_lines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out
