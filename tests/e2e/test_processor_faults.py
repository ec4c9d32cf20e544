"""A custom logit processor that fails while it runs (DESIGN.md §4: an error reaches the
affected requests as a clear HTTP error; the server stays up), through `launch.py` on the
tiny model (the session's server) with the `tests.support.faulty_processors` processors: the
request that named the processor gets a 4xx naming the processor and the exception (it got
a 500; a processor whose output failed when evaluated failed every request of its batch
with a 500, and one that raised SystemExit killed the worker), the requests beside it keep
their solo output, and the same worker serves on."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.support.faulty_processors import FAULTS

GOOD = {"prompt": "The weather today is", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
AFTER = 3
"""Tokens each faulty request writes before its processor fails (the good ones are decoding
beside it then)."""


@pytest.fixture(scope="module")
def server(tiny_server):
    """The session's tiny-model server, which loads `tests.support.faulty_processors` (conftest
    checks its clean exit)."""
    return tiny_server


def faulty(name: str, route: str, stream: bool) -> dict:
    """A request body for `route` naming processor `name`, failing after `AFTER` tokens."""
    params = {"after": AFTER}
    if route == "/generate":
        return {
            "text": "Once upon a time",
            "stream": stream,
            "custom_logit_processor": name,
            "sampling_params": {"max_new_tokens": 40, "ignore_eos": True, "custom_params": params},
        }
    body = {
        "max_tokens": 40,
        "ignore_eos": True,
        "stream": stream,
        "custom_logit_processor": name,
        "custom_params": params,
    }
    if route == "/v1/chat/completions":
        return {**body, "messages": [{"role": "user", "content": "Once upon a time"}]}
    return {**body, "prompt": "Once upon a time"}


def error_of(r: httpx.Response) -> tuple[int, dict]:
    """(status, error object) of a failed answer: the JSON body's, or for a stream (200) the
    SSE error event's (its ``code``)."""
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        events = [
            json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"
        ]
        assert r.text.rstrip().endswith("data: [DONE]"), r.text
        err = events[-1]["error"]
        return err["code"], err
    return r.status_code, r.json()["error"]


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions", "/generate"])
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_failing_processor_fails_its_request_alone_with_a_4xx(server, route, stream):
    url = server.base_url
    worker = server.child("worker")
    solo = httpx.post(f"{url}/v1/completions", json=GOOD, timeout=60).json()["choices"][0]["text"]

    async def together() -> tuple[list[httpx.Response], list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as client:
            good = [client.post("/v1/completions", json=GOOD) for _ in range(2)]
            bad = [client.post(route, json=faulty(name, route, stream)) for name in FAULTS]
            answers = await asyncio.gather(*good, *bad)
            return answers[:2], answers[2:]

    good, bad = asyncio.run(together())
    assert [r.status_code for r in good] == [200, 200], [r.text for r in good]
    assert [r.json()["choices"][0]["text"] for r in good] == [solo, solo]
    for name, r in zip(FAULTS, bad):
        status, err = error_of(r)
        assert status == 400 and err["param"] == "custom_logit_processor", (name, r.text)
        assert f"custom logit processor {name!r} failed: {FAULTS[name]}" in err["message"], (name, err)
    assert server.child("worker") == worker  # no restart: the same worker serves on
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    again = httpx.post(f"{url}/v1/completions", json=GOOD, timeout=60)
    assert again.status_code == 200 and again.json()["choices"][0]["text"] == solo
