"""The Anthropic Messages API through the official `anthropic` SDK end to end on the tiny
model's server (the session's): create and stream agree, stop sequences. The shapes, events
and errors in-process: tests/api/test_anthropic_api.py."""

from __future__ import annotations

import anthropic
import httpx
import pytest

GREEDY = {"temperature": 0}


# ---------------------------------------------------------------- end to end (tiny model)
@pytest.fixture(scope="module")
def live(tiny_server):
    model = httpx.get(f"{tiny_server.base_url}/v1/models").json()["data"][0]["id"]
    return anthropic.Anthropic(base_url=tiny_server.base_url, api_key="none", max_retries=0), model


def test_sdk_create_and_stream_agree_on_the_tiny_model(live):
    c, model = live
    msg = c.messages.create(model=model, max_tokens=12, messages=[{"role": "user", "content": "Hi"}], extra_body=GREEDY)
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.usage.output_tokens <= 12
    with c.messages.stream(
        model=model, max_tokens=12, messages=[{"role": "user", "content": "Hi"}], extra_body=GREEDY
    ) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_message()
    assert types[0] == "message_start" and types[-1] == "message_stop" and "message_delta" in types
    assert [b.text for b in final.content] == [b.text for b in msg.content] and msg.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == (msg.stop_reason, msg.usage.output_tokens)
    count = c.messages.count_tokens(model=model, messages=[{"role": "user", "content": "Hi"}])
    assert count.input_tokens == msg.usage.input_tokens + msg.usage.cache_read_input_tokens


def test_sdk_stop_sequence_on_the_tiny_model(live):
    c, model = live
    base = dict(
        model=model, max_tokens=16, messages=[{"role": "user", "content": "Tell me a story"}], extra_body=GREEDY
    )
    text = c.messages.create(**base).content[0].text
    assert len(text) >= 8, text
    stop = text[4:7]
    msg = c.messages.create(**base, stop_sequences=[stop])
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", stop)
    assert msg.content[0].text == text[: text.index(stop)]
