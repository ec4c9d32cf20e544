"""The Anthropic Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) through the
official `anthropic` SDK: its shapes, stop reasons, events and errors on the app in-process
with scripted deltas, then end to end on the tiny model's server (the session's)."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from protocol.enums import FinishReason, GrammarKind
from tests.fake_app import app_client, deltas, sse_events
from tests.test_http_output import IM_END
from tokenizer_proc.tokenizer_manager import Delta

HI = [{"role": "user", "content": "Hi"}]
GREEDY = {"temperature": 0}
HELLO = deltas(Delta(" Hel", 2), Delta("lo", 4, FinishReason.STOP, IM_END, cached_tokens=3))


def sdk(client) -> anthropic.Anthropic:
    """The SDK on an in-process test client (an httpx.Client)."""
    return anthropic.Anthropic(base_url="http://testserver", api_key="k", http_client=client, max_retries=0)


@pytest.fixture(scope="module")
def fake(tokenizer):
    client, manager = app_client(tokenizer, HELLO)
    return sdk(client), manager, tokenizer


# ---------------------------------------------------------------- in-process: shapes
def test_create_renders_system_and_blocks_and_reports_usage(fake):
    c, manager, tok = fake
    msg = c.messages.create(model="m", max_tokens=8, system=[{"type": "text", "text": "Be brief."}],
                            messages=[{"role": "user", "content": [{"type": "text", "text": "Hi ",
                                                                    "cache_control": {"type": "ephemeral"}},
                                                                   {"type": "text", "text": "there"}]}],
                            metadata={"user_id": "u1"}, extra_headers={"anthropic-version": "2023-06-01"})
    assert msg.type == "message" and msg.role == "assistant" and msg.model == "m" and msg.id.startswith("msg_")
    assert [b.model_dump(exclude_none=True) for b in msg.content] == [{"type": "text", "text": " Hello"}]
    assert (msg.stop_reason, msg.stop_sequence) == ("end_turn", None)
    prompt = manager.sent[-1].input_ids
    assert tok.decode(prompt).startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there")
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens == len(prompt)
    assert (msg.usage.cache_read_input_tokens, msg.usage.output_tokens) == (3, 4)
    count = c.messages.count_tokens(model="m", system="Be brief.", messages=[{"role": "user", "content": "Hi there"}])
    assert count.input_tokens == len(prompt)


def test_sampling_fields_reach_the_request(fake):
    c, manager, _ = fake
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    # recent SDKs no longer list temperature / top_p / top_k (nor older ones output_config): extra_body
    c.messages.create(model="m", max_tokens=7, messages=HI, stop_sequences=["END", "\n\n"],
                      extra_body={"temperature": 0.5, "top_p": 0.9, "top_k": 20,
                                  "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    req = manager.sent[-1]
    assert (req.max_new_tokens, req.sampling.temperature, req.sampling.top_p, req.sampling.top_k) == (7, 0.5, 0.9, 20)
    assert req.detok.stop == ["END", "\n\n"]
    assert req.grammar.kind == GrammarKind.JSON_SCHEMA and json.loads(req.grammar.text) == schema


@pytest.mark.parametrize("last, reason, sequence", [
    (Delta("lo", 8, FinishReason.LENGTH), "max_tokens", None),
    (Delta("lo", 4, FinishReason.STOP, "END"), "stop_sequence", "END"),
    (Delta("lo", 4, FinishReason.STOP, IM_END), "end_turn", None),
])
def test_stop_reasons_agree_streamed_and_not(tokenizer, last, reason, sequence):
    c = sdk(app_client(tokenizer, deltas(Delta(" Hel", 2), last))[0])
    msg = c.messages.create(model="m", max_tokens=8, messages=HI)
    assert (msg.stop_reason, msg.stop_sequence, msg.content[0].text) == (reason, sequence, " Hello")
    with c.messages.stream(model="m", max_tokens=8, messages=HI) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert texts == [" Hel", "lo"]
    assert final.model_dump(exclude={"id"}) == msg.model_dump(exclude={"id"})


def test_stream_event_sequence(tokenizer):
    client, _ = app_client(tokenizer, HELLO)
    r = client.post("/v1/messages", json={"model": "m", "max_tokens": 8, "messages": HI, "stream": True})
    events = sse_events(r.text)
    assert [name for name, _ in events] == [
        "message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop"]
    data = [json.loads(d) for _, d in events]
    assert all(d["type"] == name for (name, _), d in zip(events, data))
    start = data[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    assert data[2] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert data[3]["delta"] == {"type": "text_delta", "text": " Hel"}
    assert data[6]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert data[6]["usage"]["output_tokens"] == 4 and data[6]["usage"]["cache_read_input_tokens"] == 3


def test_empty_output_has_no_content_block(tokenizer):
    client, _ = app_client(tokenizer, deltas(Delta("", 1, FinishReason.STOP, IM_END)))
    body = {"model": "m", "max_tokens": 8, "messages": HI}
    assert client.post("/v1/messages", json=body).json()["content"] == []
    names = [n for n, _ in sse_events(client.post("/v1/messages", json={**body, "stream": True}).text)]
    assert names == ["message_start", "ping", "message_delta", "message_stop"]


# ---------------------------------------------------------------- in-process: errors
TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.mark.parametrize("extra, param", [
    ({"tools": [TOOL]}, "tools"),
    ({"tool_choice": {"type": "any"}}, "tool_choice"),
    ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages.0.content.0"),
    ({"messages": HI + [{"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f",
                                                             "input": {}}]}]}, "messages.1.content.0"),
    ({"stop_sequences": ["x" * 300]}, "stop_sequences"),
    ({"max_tokens": 100_000}, "max_tokens"),
    ({"temperature": 1.5}, "temperature"),
    ({"context_management": {}}, "context_management"),
    ({"max_tokens": None}, "max_tokens"),
])
def test_refusals_are_anthropic_errors_naming_the_field(fake, extra, param):
    c, _, _ = fake
    body = {"model": "m", "max_tokens": 8, "messages": HI, **extra}
    with pytest.raises(anthropic.BadRequestError) as e:
        c.post("/v1/messages", body={k: v for k, v in body.items() if v is not None}, cast_to=object)
    assert e.value.status_code == 400
    assert e.value.body["type"] == "error"
    error = e.value.body["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and param in error["message"]


def test_unknown_model_is_not_found(fake):
    with pytest.raises(anthropic.NotFoundError) as e:
        fake[0].messages.create(model="claude-nope", max_tokens=8, messages=HI)
    assert e.value.body["error"]["type"] == "not_found_error"


def test_error_mid_stream_is_an_error_event(tokenizer):
    from tokenizer_proc.errors import APIError

    c = sdk(app_client(tokenizer, deltas(Delta(" Hel", 2), APIError("model execution failed", 500)))[0])
    with pytest.raises(anthropic.APIStatusError, match="model execution failed"):
        with c.messages.stream(model="m", max_tokens=8, messages=HI) as stream:
            list(stream)


def test_x_api_key_is_required_when_set(tokenizer):
    client, _ = app_client(tokenizer, HELLO, api_key="secret")
    ok = anthropic.Anthropic(base_url="http://testserver", api_key="secret", http_client=client, max_retries=0)
    assert ok.messages.create(model="m", max_tokens=8, messages=HI).content[0].text == " Hello"
    bad = anthropic.Anthropic(base_url="http://testserver", api_key="wrong", http_client=client, max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="m", max_tokens=8, messages=HI)


# ---------------------------------------------------------------- end to end (tiny model)
@pytest.fixture(scope="module")
def live(tiny_server):
    model = httpx.get(f"{tiny_server.base_url}/v1/models").json()["data"][0]["id"]
    return anthropic.Anthropic(base_url=tiny_server.base_url, api_key="none", max_retries=0), model


def test_sdk_create_and_stream_agree_on_the_tiny_model(live):
    c, model = live
    msg = c.messages.create(model=model, max_tokens=12, messages=[{"role": "user", "content": "Hi"}], extra_body=GREEDY)
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.usage.output_tokens <= 12
    with c.messages.stream(model=model, max_tokens=12, messages=[{"role": "user", "content": "Hi"}],
                           extra_body=GREEDY) as stream:
        types = [event.type for event in stream]
        final = stream.get_final_message()
    assert types[0] == "message_start" and types[-1] == "message_stop" and "message_delta" in types
    assert [b.text for b in final.content] == [b.text for b in msg.content] and msg.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == (msg.stop_reason, msg.usage.output_tokens)
    count = c.messages.count_tokens(model=model, messages=[{"role": "user", "content": "Hi"}])
    assert count.input_tokens == msg.usage.input_tokens + msg.usage.cache_read_input_tokens


def test_sdk_stop_sequence_on_the_tiny_model(live):
    c, model = live
    base = dict(model=model, max_tokens=16, messages=[{"role": "user", "content": "Tell me a story"}], extra_body=GREEDY)
    text = c.messages.create(**base).content[0].text
    assert len(text) >= 8, text
    stop = text[4:7]
    msg = c.messages.create(**base, stop_sequences=[stop])
    assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", stop)
    assert msg.content[0].text == text[:text.index(stop)]
