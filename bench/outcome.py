"""How one OpenAI request (chat or completions, streamed or not) ended, as its client saw
it, with every breach of the response contract noted: an SSE data line that is not JSON, a
choice finished twice, data after ``[DONE]``, a stream without ``[DONE]``. Used by
bench/load.py, bench/mixed_case.py and tests/e2e/test_streams.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from bench.client import sse_data

FINISH_REASONS = ("length", "stop")
"""The finish reasons of a request that ran to its end."""


@dataclass
class Outcome:
    """One request's end. status: the HTTP status (0: no response); finish and text: by
    choice index, its ``finish_reason`` and whole text (chat ``content``, completions
    ``text``); error: the message of an error body or SSE error event; problems: contract
    breaches; done: the stream's ``[DONE]`` arrived; closed_early: the client left before
    the end (`send`'s `close_after`); chunks: SSE data lines read; usage: the usage dict
    when one came."""

    status: int = 0
    finish: dict[int, str] = field(default_factory=dict)
    text: dict[int, str] = field(default_factory=dict)
    error: str | None = None
    problems: list[str] = field(default_factory=list)
    done: bool = False
    closed_early: bool = False
    chunks: int = 0
    usage: dict | None = None

    def complete(self, n: int, stream: bool) -> bool:
        """True when it ran to its end cleanly: a 200, every one of `n` choices finished with
        a `FINISH_REASONS` reason, no error, no breach, and ``[DONE]`` when `stream`."""
        return (
            self.status == 200
            and self.error is None
            and not self.problems
            and (self.done or not stream)
            and sorted(self.finish) == list(range(n))
            and all(r in FINISH_REASONS for r in self.finish.values())
        )

    def _choice(self, choice: dict, chat_key: str) -> None:
        i = choice.get("index", 0)
        piece = (choice.get(chat_key) or {}).get("content") if chat_key in choice else choice.get("text")
        self.text[i] = self.text.get(i, "") + (piece or "")
        reason = choice.get("finish_reason")
        if reason is not None:
            if i in self.finish:
                self.problems.append(f"choice {i} finished twice ({self.finish[i]}, {reason})")
            self.finish[i] = reason

    def _event(self, payload: str) -> None:
        """Take one SSE data payload."""
        if self.done:
            self.problems.append(f"data after [DONE]: {payload[:80]!r}")
        if payload == "[DONE]":
            self.done = True
            return
        try:
            event = json.loads(payload)
        except ValueError:
            self.problems.append(f"not JSON: {payload[:80]!r}")
            return
        if "error" in event:
            self.error = str(event["error"].get("message"))
            return
        for choice in event.get("choices") or []:
            self._choice(choice, "delta")
        self.usage = event.get("usage") or self.usage


async def send(client, url: str, path: str, body: dict, close_after: int | None = None) -> Outcome:
    """POST `body` to `url` + `path` with the httpx.AsyncClient `client` and read the whole
    answer (SSE when ``body["stream"]``). close_after: for a stream, close the connection
    after that many data lines (0: right after the headers) and mark it ``closed_early``
    if it had not ended. Connection errors propagate (httpx errors); the caller decides."""
    out = Outcome()
    if not body.get("stream"):
        r = await client.post(f"{url}{path}", json=body)
        out.status = r.status_code
        try:
            data = r.json()
        except ValueError:
            out.problems.append(f"body not JSON: {r.text[:80]!r}")
            return out
        if r.status_code != 200:
            out.error = str((data.get("error") or {}).get("message"))
            return out
        for choice in data.get("choices") or []:
            out._choice(choice, "message")
        out.usage = data.get("usage")
        return out
    async with client.stream("POST", f"{url}{path}", json=body) as r:
        out.status = r.status_code
        if r.status_code != 200:
            try:
                out.error = str(json.loads(await r.aread())["error"]["message"])
            except (ValueError, KeyError, TypeError):
                out.problems.append("error body without an error message")
            return out
        if close_after == 0:
            out.closed_early = True
            return out
        async for payload in sse_data(r):
            out.chunks += 1
            out._event(payload)
            if close_after is not None and out.chunks >= close_after and not out.done:
                out.closed_early = True
                return out
    if not out.done:
        out.problems.append("the stream closed without [DONE]")
    return out
