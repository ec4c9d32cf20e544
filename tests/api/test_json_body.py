"""Large JSON bodies are decoded and validated off the event loop (`tokenizer_proc.web.json_body`)
with the answers FastAPI gives when it reads them on the loop: the app runs in-process against
a fake manager (`tests.support.fake_app`), once as served and once with every body read inline."""

from __future__ import annotations

import asyncio
import json

import pytest
from fastapi import Body, FastAPI

from tests.support.fake_app import HELLO, app_client
from tokenizer_proc.web import json_body
from tokenizer_proc.web.json_body import INLINE_BODY_BYTES, JsonBodyRoute

LONG = "hello world " * (INLINE_BODY_BYTES // 12 + 1)
"""A string that makes any body larger than `INLINE_BODY_BYTES`."""
MANY = [{"role": "user", "content": "Hi"}] * (INLINE_BODY_BYTES // 30)
"""Messages that make a chat body larger than `INLINE_BODY_BYTES`."""
JSON = {"content-type": "application/json"}


def _raw(body: dict) -> bytes:
    return json.dumps(body).encode()


# (path, raw body, content-type): each larger than INLINE_BODY_BYTES
CASES = {
    "chat": ("/v1/chat/completions", _raw({"messages": MANY[:1], "max_tokens": 4, "user": LONG}), JSON),
    "chat-many": ("/v1/chat/completions", _raw({"messages": MANY, "max_tokens": 4}), JSON),
    "chat-bad-last-message": (
        "/v1/chat/completions",
        _raw({"messages": [*MANY, {"role": "user", "content": 5}], "max_tokens": 4}),
        JSON,
    ),
    "chat-surrogate": ("/v1/chat/completions", _raw({"messages": MANY, "max_tokens": 4, "user": "\ud800"}), JSON),
    "completions-vendor-json": (
        "/v1/completions",
        _raw({"prompt": LONG, "max_tokens": -1}),
        {"content-type": "application/vnd.api+json"},
    ),
    "generate-bad-id": ("/generate", _raw({"input_ids": [1] * (INLINE_BODY_BYTES // 3) + [-1]}), JSON),
    "messages": ("/v1/messages", _raw({"model": "m", "max_tokens": 4, "messages": MANY}), JSON),
    "messages-bad": ("/v1/messages", _raw({"model": "m", "max_tokens": "four", "messages": MANY}), JSON),
    "count-tokens-bad": ("/v1/messages/count_tokens", _raw({"model": "m", "messages": MANY, "x": 1}), JSON),
    "responses-bad": ("/v1/responses", _raw({"input": LONG, "temperature": 9}), JSON),
    "tokenize": ("/tokenize", _raw({"prompt": LONG}), JSON),
    "detokenize-bad": ("/detokenize", _raw({"tokens": [1] * (INLINE_BODY_BYTES // 3) + ["x"]}), JSON),
    "truncated-json": ("/v1/chat/completions", _raw({"messages": MANY})[:-3], JSON),
    "not-utf8": ("/v1/completions", b'{"prompt": "' + b"\xff" * INLINE_BODY_BYTES + b'"}', JSON),
    "too-deep": ("/v1/completions", b"[" * (INLINE_BODY_BYTES + 1), JSON),
    "form": ("/v1/completions", _raw({"prompt": LONG}), {"content-type": "application/x-www-form-urlencoded"}),
}
NOT_JSON = {"form"}
"""Cases FastAPI does not decode as JSON (not a JSON Content-Type): no thread does either."""
UNDECODABLE = {"truncated-json", "not-utf8", "too-deep"}
"""Cases whose JSON does not decode: nothing to validate."""
FIELD_ERRORS = {
    "chat-bad-last-message",
    "chat-surrogate",
    "completions-vendor-json",
    "generate-bad-id",
    "messages-bad",
    "count-tokens-bad",
    "responses-bad",
    "detokenize-bad",
}
"""Cases refused by validation: a 400 naming the field."""


def _answer(r) -> tuple[int, object]:
    """The status and body of a response, less what differs per request (ids, timestamps)."""
    body = r.json()
    if r.status_code == 200:
        for key in ("id", "created", "created_at", "system_fingerprint"):
            body.pop(key, None)
    return r.status_code, body


@pytest.fixture(scope="module")
def client(tokenizer):
    return app_client(tokenizer, HELLO)[0]


@pytest.fixture
def threaded(monkeypatch) -> list:
    """The functions the app ran through ``asyncio.to_thread`` (recorded, then run)."""
    ran, to_thread = [], asyncio.to_thread

    def spy(func, *args, **kwargs):
        ran.append(func)
        return to_thread(func, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", spy)
    return ran


@pytest.mark.parametrize("case", CASES)
def test_large_body_is_read_in_a_thread_with_the_inline_answer(client, threaded, monkeypatch, case):
    """Every case's answer (status and JSON body: the same 400 message and param, in the
    route's error shape) is the one FastAPI gives reading the body on the loop; the JSON
    ones were decoded in a worker thread, and validated there when they decode."""
    path, raw, headers = CASES[case]
    assert len(raw) > INLINE_BODY_BYTES
    served = _answer(client.post(path, content=raw, headers=headers))
    in_thread = [getattr(f, "__name__", "") for f in threaded]
    monkeypatch.setattr(json_body, "INLINE_BODY_BYTES", 1 << 40)
    threaded.clear()
    inline = _answer(client.post(path, content=raw, headers=headers))
    assert json.loads not in threaded
    assert served == inline
    assert ("loads" in in_thread, "validate" in in_thread) == (case not in NOT_JSON, case not in NOT_JSON | UNDECODABLE)
    if case in FIELD_ERRORS:
        assert served[0] == 400 and served[1]["error"]["param"] is not None, served


def test_small_body_is_read_inline(client, threaded):
    r = client.post("/v1/chat/completions", json={"messages": MANY[:10], "max_tokens": 4})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == " Hello"
    assert json.loads not in threaded


def test_large_chunked_body_over_the_limit_is_413(tokenizer, threaded):
    """A body sent without a Content-Length is read by the route's check: past the limit, the
    limit's 413, nothing decoded."""
    c, _ = app_client(tokenizer, HELLO, max_body_bytes=2 * INLINE_BODY_BYTES)
    raw = _raw({"prompt": LONG * 3})
    r = c.post("/v1/completions", content=iter([raw[i : i + 4096] for i in range(0, len(raw), 4096)]), headers=JSON)
    assert r.status_code == 413 and "--max-request-body-bytes" in r.json()["error"]["message"]
    assert json.loads not in threaded


def test_route_with_an_embedded_body_is_refused():
    """The thread validates the body whole as the route's one body parameter: a route whose
    body FastAPI splits into parameters is refused when it is added."""
    app = FastAPI()
    app.router.route_class = JsonBodyRoute

    def two(a: int = Body(), b: int = Body()) -> None:
        """A body of two parameters."""

    with pytest.raises(TypeError, match="one parameter"):
        app.post("/two")(two)
