"""The OpenAI Responses API on the tiny model's server (the session's): a live stream
retrieved and deleted while it runs, a stored stream its client left, and
``responses.create`` streamed and not through the `openai` SDK. In-process: tests/api/."""

from __future__ import annotations

import time

import httpx
import openai
import pytest


def test_live_stream_is_retrievable_and_deletable_while_it_runs(live):
    """Over HTTP: after response.created, GET answers the in-progress response and DELETE
    drops it, so that it is not kept once the stream ends (the stream itself goes on)."""
    client, model = live
    with client.responses.stream(model=model, input="Hi", max_output_tokens=1500) as stream:
        events = iter(stream)
        created = next(events)
        rid = created.response.id
        assert client.responses.retrieve(rid).status == "in_progress"
        client.responses.delete(rid)
        last = list(events)[-1]
    assert last.type in ("response.completed", "response.incomplete") and last.response.id == rid
    with pytest.raises(openai.NotFoundError, match="not stored here"):
        client.responses.retrieve(rid)


def test_a_stored_stream_its_client_left_says_why_it_is_not_stored(live):
    """A ``store: true`` stream left by its client after response.created is not stored; GET
    says that (it said "responses are kept ... only when store is true", which it was)."""
    client, model = live
    with client.responses.stream(model=model, input="Hi", max_output_tokens=1500) as stream:
        rid = next(iter(stream)).response.id
    deadline = time.monotonic() + 30
    while True:  # in progress until the server has seen the client leave
        try:
            client.responses.retrieve(rid)
        except openai.NotFoundError as e:
            assert "it was not stored: its client left the stream before it completed" in str(e), e
            break
        assert time.monotonic() < deadline, "still retrievable 30 s after its client left"
        time.sleep(0.05)


# ---------------------------------------------------------------- end to end (tiny model)
@pytest.fixture(scope="module")
def live(tiny_server):
    model = httpx.get(f"{tiny_server.base_url}/v1/models").json()["data"][0]["id"]
    return openai.OpenAI(base_url=f"{tiny_server.base_url}/v1", api_key="none", max_retries=0), model


def test_sdk_create_streamed_and_not_agree_on_the_tiny_model(live):
    c, model = live
    full = c.responses.create(model=model, input="Hi", max_output_tokens=12, temperature=0)
    assert full.status in ("completed", "incomplete") and full.output_text
    events = list(c.responses.create(model=model, input="Hi", max_output_tokens=12, temperature=0, stream=True))
    assert events[0].type == "response.created" and events[-1].type == f"response.{full.status}"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == full.output_text
    counts = lambda u: (u.input_tokens, u.output_tokens, u.total_tokens)  # noqa: E731 (cached tokens may differ)
    assert counts(events[-1].response.usage) == counts(full.usage)
    follow = c.responses.create(
        model=model, input="More", max_output_tokens=4, temperature=0, previous_response_id=full.id
    )
    assert follow.usage.input_tokens > full.usage.input_tokens + full.usage.output_tokens
