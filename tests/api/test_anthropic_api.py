"""The Anthropic Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) through the
official `anthropic` SDK: its shapes, stop reasons, events and errors on the app in-process
with scripted deltas. End to end: tests/e2e/test_anthropic_api.py (the tiny model's server)
and tests/e2e/real/test_anthropic_api.py (the default model's)."""

from __future__ import annotations

import json

import anthropic
import pytest

from protocol.enums import FinishReason, GrammarKind, ReqField
from tests.support.fake_app import (
    AGENT_OUTPUT,
    AGENT_PARSERS,
    CALL_THEN_TEXT,
    HELLO,
    IM_END,
    app_client,
    deltas,
    in_pieces,
    sse_events,
)
from tokenizer_proc.link.tokenizer_manager import Delta

HI = [{"role": "user", "content": "Hi"}]


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
    msg = c.messages.create(
        model="m",
        max_tokens=8,
        system=[{"type": "text", "text": "Be brief."}],
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Hi ", "cache_control": {"type": "ephemeral"}},
                    {"type": "text", "text": "there"},
                ],
            }
        ],
        metadata={"user_id": "u1"},
        extra_headers={"anthropic-version": "2023-06-01"},
    )
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
    c.messages.create(
        model="m",
        max_tokens=7,
        messages=HI,
        stop_sequences=["END", "\n\n"],
        extra_body={
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 20,
            "output_config": {"format": {"type": "json_schema", "schema": schema}},
        },
    )
    req = manager.sent[-1]
    assert (req.max_new_tokens, req.sampling.temperature, req.sampling.top_p, req.sampling.top_k) == (7, 0.5, 0.9, 20)
    assert req.detok.stop == ["END", "\n\n"]
    assert req.grammar.kind == GrammarKind.JSON_SCHEMA and json.loads(req.grammar.text) == schema


def test_a_last_assistant_turn_is_continued_in_place(fake):
    c, manager, tok = fake
    prefill = [
        {"role": "user", "content": "Name?"},
        {"role": "assistant", "content": [{"type": "text", "text": '{"name": "'}]},
    ]
    msg = c.messages.create(model="m", max_tokens=8, messages=prefill)
    prompt = tok.decode(manager.sent[-1].input_ids)
    assert prompt.endswith('<|im_start|>user\nName?<|im_end|>\n<|im_start|>assistant\n{"name": "')
    assert msg.content[0].text == " Hello"  # the continuation only, as Anthropic's API answers a prefill
    assert c.messages.count_tokens(model="m", messages=prefill).input_tokens == len(manager.sent[-1].input_ids)


def test_consecutive_turns_of_one_role_are_combined_into_one(fake):
    """As Anthropic's API combines them (the SDK's documentation of messages): two user
    messages are one user turn, two assistant messages at the end one prefill. They were
    rendered as two turns each."""
    c, manager, tok = fake
    turns = [{"role": "user", "content": "Hi "}, {"role": "user", "content": [{"type": "text", "text": "there"}]}]
    c.messages.create(model="m", max_tokens=8, messages=turns)
    prompt = tok.decode(manager.sent[-1].input_ids)
    assert prompt.count("<|im_start|>user") == 1 and prompt.endswith(
        "user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )
    assert c.messages.count_tokens(model="m", messages=turns).input_tokens == len(manager.sent[-1].input_ids)
    prefill = [turns[0], {"role": "assistant", "content": "Hello"}, {"role": "assistant", "content": ", you"}]
    c.messages.create(model="m", max_tokens=8, messages=prefill)
    prompt = tok.decode(manager.sent[-1].input_ids)
    assert prompt.count("<|im_start|>assistant") == 1 and prompt.endswith("<|im_start|>assistant\nHello, you")


@pytest.mark.parametrize(
    "forcing",
    [
        {
            "extra_body": {
                "output_config": {
                    "format": {
                        "type": "json_schema",
                        "schema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
                    }
                }
            }
        },
        {"tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "any"}},
    ],
)
def test_a_prefill_with_an_output_format_or_a_forced_tool_is_refused(fake, forcing):
    """The format's grammar would restart the document after the prefilled text. The message
    names Anthropic's fields (it named chat's response_format and continue_final_message)."""
    c, manager, _ = fake
    sent = len(manager.sent)
    prefill = [{"role": "user", "content": "Name?"}, {"role": "assistant", "content": '{"name": "Al'}]
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="m", max_tokens=8, messages=prefill, **forcing)
    assert e.value.body["error"]["param"] == "messages.1" and "grammar" in e.value.message
    assert "output_config.format" in e.value.message and "response_format" not in e.value.message
    assert len(manager.sent) == sent


@pytest.mark.parametrize("text", ["Sure, ", "Sure,\n", " "])
def test_a_prefill_ending_in_whitespace_is_refused_as_anthropic_refuses_it(fake, text):
    c, manager, _ = fake
    sent = len(manager.sent)
    turns = [{"role": "user", "content": "Name?"}, {"role": "assistant", "content": text}]
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="m", max_tokens=8, messages=turns)
    assert "trailing whitespace" in e.value.message and len(manager.sent) == sent


@pytest.mark.parametrize(
    "last, reason, sequence",
    [
        (Delta("lo", 8, FinishReason.LENGTH), "max_tokens", None),
        (Delta("lo", 4, FinishReason.STOP, "END"), "stop_sequence", "END"),
        (Delta("lo", 4, FinishReason.STOP, IM_END), "end_turn", None),
    ],
)
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
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    data = [json.loads(d) for _, d in events]
    assert all(d["type"] == name for (name, _), d in zip(events, data))
    start = data[0]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    assert data[2] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert data[3]["delta"] == {"type": "text_delta", "text": " Hel"}
    assert data[6]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert data[6]["usage"]["output_tokens"] == 4 and data[6]["usage"]["cache_read_input_tokens"] == 3
    split = ("input_tokens", "cache_read_input_tokens")  # message_start already splits the prompt as the end does
    assert [start["usage"][k] for k in split] == [data[6]["usage"][k] for k in split]


def test_empty_output_has_no_content_block(tokenizer):
    client, _ = app_client(tokenizer, deltas(Delta("", 1, FinishReason.STOP, IM_END)))
    body = {"model": "m", "max_tokens": 8, "messages": HI}
    assert client.post("/v1/messages", json=body).json()["content"] == []
    names = [n for n, _ in sse_events(client.post("/v1/messages", json={**body, "stream": True}).text)]
    assert names == ["message_start", "ping", "message_delta", "message_stop"]


# ---------------------------------------------------------------- in-process: errors
TOOL = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"tools": [TOOL]}, "tools"),  # this app has no tool-call parser
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking"),
        ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "messages.0.content.0"),
        ({"stop_sequences": ["x" * 300]}, "stop_sequences"),
        ({"max_tokens": 100_000}, "max_tokens"),
        ({"temperature": 1.5}, "temperature"),
        ({"context_management": {}}, "context_management"),
        ({"max_tokens": None}, "max_tokens"),
        ({"container": "cntr_1"}, "container"),
        ({"speed": "fast"}, "speed"),
        # empty content, as Anthropic's API refuses it (an empty final assistant turn is an empty prefill)
        ({"messages": [{"role": "user", "content": ""}]}, "messages.0"),
        ({"messages": [*HI, {"role": "assistant", "content": []}, *HI]}, "messages.1"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": ""}]}]},
            "messages.0.content.1",
        ),
        (
            {"system": [{"type": "text", "text": "a"}, {"type": "text", "text": ""}]},
            "system.1",
        ),  # it was an empty system turn
        (
            {
                "messages": [
                    *HI,
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": ""}]}
                        ],
                    },
                ]
            },
            "messages.2.content.0",
        ),
    ],
)
def test_refusals_are_anthropic_errors_naming_the_field(fake, extra, param):
    c, _, _ = fake
    body = {"model": "m", "max_tokens": 8, "messages": HI, **extra}
    with pytest.raises(anthropic.BadRequestError) as e:
        c.post("/v1/messages", body={k: v for k, v in body.items() if v is not None}, cast_to=object)
    assert e.value.status_code == 400
    assert e.value.body["type"] == "error"
    error = e.value.body["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and param in error["message"]


@pytest.mark.parametrize(
    "extra, param, says",
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages.0.content.0",
            "type 'image' is not supported by this server: this model takes text only",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages.0.content.0",
            "type 'document' is not supported by this server: this model takes text only",
        ),
        (
            {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "tools.0",
            "Anthropic-defined tools (type 'web_search_20250305') are not supported by this server",
        ),
        (
            {"tools": [{"type": "bash_20250124", "name": "bash"}]},
            "tools.0",  # a client tool: was "server tools"
            "Anthropic-defined tools (type 'bash_20250124') are not supported by this server: only custom tools",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}
                        ],
                    }
                ]
            },
            "messages.0.content.0.content.0.type",
            "type 'image' is not supported by this server: this model takes text only (supported types: 'text')",
        ),
    ],
)
def test_blocks_and_tools_not_served_are_refused_saying_so(fake, extra, param, says):
    """An image or document block, or a server tool, is a 400 that says the server does not
    take it (an image said pydantic's "Input tag 'image' found using 'type' does not match",
    a web search tool "tools.0.input_schema: Field required")."""
    c, _, _ = fake
    with pytest.raises(anthropic.BadRequestError) as e:
        c.post("/v1/messages", body={"model": "m", "max_tokens": 8, "messages": HI, **extra}, cast_to=object)
    error = e.value.body["error"]
    assert error["param"] == param and error["message"].startswith(f"{param}: {says}"), error


def test_empty_content_where_anthropic_takes_it_is_served(fake):
    c, _, _ = fake
    for turns in (
        [*HI, {"role": "assistant", "content": ""}],
        [*HI, {"role": "assistant", "content": []}],
        [
            *HI,
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
        ],
    ):
        assert c.messages.create(model="m", max_tokens=8, messages=turns).content[0].text == " Hello"


@pytest.mark.parametrize(
    "schema, problem",
    [
        ({"type": 5}, "not a valid JSON schema"),
        (
            {"type": "object", "properties": {"a": {"type": "integer", "not": {"const": 1}}}, "required": ["a"]},
            "`not` cannot be enforced (at $.properties.a)",
        ),
    ],
)
def test_output_format_schema_errors_name_the_schema_field(fake, schema, problem):
    """The message names output_config.format.schema (the chat path's
    response_format.json_schema.schema), not a path the Anthropic request does not have."""
    c, _, _ = fake
    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": HI,
        "output_config": {"format": {"type": "json_schema", "schema": schema}},
    }
    with pytest.raises(anthropic.BadRequestError) as e:
        c.post("/v1/messages", body=body, cast_to=object)
    error = e.value.body["error"]
    assert error["param"] == "output_config.format"
    assert error["message"].startswith("output_config.format.schema is ") and problem in error["message"]


def test_sdk_fields_that_change_nothing_are_accepted(fake):
    c, manager, _ = fake
    c.messages.create(
        model="m",
        max_tokens=8,
        messages=HI,
        inference_geo="us",
        speed="standard",
        user_profile_id="u",
        workspace_id="w",
        extra_body={"container": None, "diagnostics": None},
    )
    assert c.messages.count_tokens(model="m", messages=HI, speed="standard", workspace_id="w").input_tokens == len(
        manager.sent[-1].input_ids
    )
    with pytest.raises(anthropic.BadRequestError, match="not supported by this server"):
        c.messages.create(model="m", max_tokens=8, messages=HI, extra_body={"diagnostics": {}})


@pytest.mark.parametrize(
    "raw, param",
    [
        (
            r'"system": "x", "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "a"}, '
            r'{"role": "user", "content": "b\ud800"}]',
            "messages.2.content",
        ),
        (r'"system": "x\ud800", "messages": [{"role": "user", "content": "Hi"}]', "system"),
    ],
)
def test_unpaired_surrogates_are_named_by_the_anthropic_path(tokenizer, raw, param):
    client, _ = app_client(tokenizer, HELLO)
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        body = '{"model": "m", ' + ('"max_tokens": 8, ' if path == "/v1/messages" else "") + raw + "}"
        r = client.post(path, content=body.encode(), headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert "surrogate" in r.json()["error"]["message"]


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


def test_overload_is_anthropics_529_overloaded_error_and_openai_keeps_503(tokenizer):
    """A server that cannot take the request (draining: `TokenizerManager.check_can_start`;
    timed out in the queue: the scheduler's 503) answers Anthropic's 529 overloaded_error, the
    SDK's OverloadedError, streamed and not, and a stream already under way ends with an
    overloaded_error event; it was a 503 (the SDK's ServiceUnavailableError). OpenAI's routes
    keep their 503."""
    from tokenizer_proc.errors import APIError, FieldError

    client, manager = app_client(tokenizer, HELLO)

    def draining(rid, client_rid=None):
        raise APIError("server is shutting down", 503, headers={"Retry-After": "5"})

    manager.check_can_start = draining
    c = sdk(client)
    for stream in (False, True):
        with pytest.raises(anthropic.OverloadedError) as e:
            c.messages.create(model="m", max_tokens=8, messages=HI, stream=stream)
        assert e.value.status_code == 529 and e.value.response.headers["retry-after"] == "5"
        assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "overloaded_error"
        assert e.value.body["error"]["message"] == "server is shutting down" and e.value.body["error"]["code"] == 529
    chat = client.post("/v1/chat/completions", json={"model": "m", "max_tokens": 8, "messages": HI})
    assert chat.status_code == 503 and chat.json()["error"]["type"] == "server_error"

    timed_out = FieldError("request timed out in the queue", 503, ReqField.NONE)
    client, _ = app_client(tokenizer, deltas(Delta(" Hel", 2), timed_out))
    body = {"model": "m", "max_tokens": 8, "messages": HI}
    r = client.post("/v1/messages", json=body)
    assert (r.status_code, r.json()["error"]["type"]) == (529, "overloaded_error")
    events = sse_events(client.post("/v1/messages", json={**body, "stream": True}).text)
    assert events[-1][0] == "error" and json.loads(events[-1][1])["error"]["type"] == "overloaded_error"
    with pytest.raises(anthropic.APIStatusError, match="timed out in the queue"):
        with sdk(client).messages.stream(**body) as stream:
            list(stream)


def test_x_api_key_is_required_when_set(tokenizer):
    client, _ = app_client(tokenizer, HELLO, api_key="secret")
    ok = anthropic.Anthropic(base_url="http://testserver", api_key="secret", http_client=client, max_retries=0)
    assert ok.messages.create(model="m", max_tokens=8, messages=HI).content[0].text == " Hello"
    bad = anthropic.Anthropic(base_url="http://testserver", api_key="wrong", http_client=client, max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="m", max_tokens=8, messages=HI)


def test_errors_before_the_route_come_in_anthropic_shape(tokenizer):
    """A missing key, an over-long body (declared or chunked) and a wrong method: Anthropic's
    shape under /v1/messages, the server-wide one elsewhere."""
    client, _ = app_client(tokenizer, HELLO, api_key="secret", max_body_bytes=2000)
    key = {"x-api-key": "secret"}
    big = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x" * 3000}]}
    cases = [
        (client.post("/v1/messages", json={"model": "m"}), 401, "authentication_error"),
        (client.post("/v1/messages/count_tokens", json={}), 401, "authentication_error"),
        (client.post("/v1/messages", json=big, headers=key), 413, "request_too_large"),
        (client.post("/v1/messages", content=iter([json.dumps(big).encode()]), headers=key), 413, "request_too_large"),
        (client.get("/v1/messages", headers=key), 405, "invalid_request_error"),
    ]
    for r, status, kind in cases:
        body = r.json()
        assert r.status_code == status and body["type"] == "error" and body["error"]["type"] == kind, body
        assert body["error"]["code"] == status and body["error"]["message"]
    openai_shape = client.post("/v1/chat/completions", json={})
    assert openai_shape.status_code == 401 and "type" not in openai_shape.json()
    assert openai_shape.json()["error"]["type"] == "authentication_error"
    other = client.post("/v1/messagesX", json={}, headers=key).json()  # not a sub-path
    assert other["error"]["code"] == 404 and "type" not in other


# ---------------------------------------------------------------- in-process: tools and thinking
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "array", "items": {"type": "integer"}}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def agent(tokenizer):
    client, manager = app_client(tokenizer, in_pieces(AGENT_OUTPUT), AGENT_PARSERS)
    return sdk(client), manager, client


def without_ids(blocks) -> list[dict]:
    return [{k: v for k, v in b.model_dump(exclude_none=True).items() if k != "id"} for b in blocks]


def test_thinking_text_and_tool_use_blocks_streamed_and_not(agent):
    c, manager, client = agent
    base = dict(
        model="m",
        max_tokens=64,
        tools=[WEATHER],
        messages=[{"role": "user", "content": "Weather?"}],
        thinking={"type": "enabled", "budget_tokens": 32},
    )
    msg = c.messages.create(**base)
    budget = manager.sent[-1].reasoning_budget  # enforced by the scheduler (test_reasoning_budget)
    assert budget.budget == 32 and not budget.inside and budget.close_ids
    assert msg.stop_reason == "tool_use"
    assert without_ids(msg.content) == [
        {"type": "thinking", "thinking": "The user wants the weather.", "signature": ""},
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "name": "get_weather", "input": {"city": "Paris", "days": [1, 2]}},
    ]
    assert msg.content[2].id.startswith("toolu_")  # Anthropic's id prefix
    with c.messages.stream(**base) as stream:
        final = stream.get_final_message()
    assert without_ids(final.content) == without_ids(msg.content) and final.stop_reason == "tool_use"
    events = [
        (n, json.loads(d)) for n, d in sse_events(client.post("/v1/messages", json={**base, "stream": True}).text)
    ]
    starts = [d["content_block"]["type"] for n, d in events if n == "content_block_start"]
    kinds = {d["delta"]["type"] for n, d in events if n == "content_block_delta"}
    assert starts == ["thinking", "text", "tool_use"]
    assert kinds == {"thinking_delta", "signature_delta", "text_delta", "input_json_delta"}
    # as Anthropic's API streams a thinking block: its signature (empty here) just before its stop
    thinking = [(n, d.get("delta", {}).get("type")) for n, d in events if d.get("index") == 0]
    assert thinking[-2:] == [("content_block_delta", "signature_delta"), ("content_block_stop", None)]
    assert [n for n, _ in thinking].count("content_block_delta") == len(thinking) - 2
    partial = "".join(
        d["delta"]["partial_json"]
        for n, d in events
        if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta"
    )
    assert json.loads(partial) == {"city": "Paris", "days": [1, 2]}
    # the blocks go back as the next turn's history (thinking left out of the prompt), dumped
    # whole as the SDK has them (its null fields included: toolset_name, citations)
    back = [{**b.model_dump(), **({"caller": {"type": "direct"}} if b.type == "tool_use" else {})} for b in msg.content]
    assert back[2]["toolset_name"] is None and "citations" in back[1]
    result = {"type": "tool_result", "tool_use_id": msg.content[2].id, "content": "18C", "toolset_name": None}
    history = base["messages"] + [{"role": "assistant", "content": back}, {"role": "user", "content": [result]}]
    again = c.messages.create(**{**base, "messages": history})
    assert again.stop_reason == "tool_use"
    history[1]["content"][2]["toolset_name"] = "mcp"  # a toolset's call: none is served here
    r = client.post("/v1/messages", json={**base, "messages": history})
    assert r.status_code == 400 and "messages.1.content.2.toolset_name" in r.json()["error"]["message"]


def test_thinking_display_omitted_redacts_the_thinking_streamed_and_not(agent):
    """thinking.display "omitted" (an SDK field) gives thinking blocks without their text and
    a stream without thinking_delta events, as Anthropic's API redacts them; it was accepted
    and the thinking returned in full."""
    c, _, client = agent
    base = dict(
        model="m",
        max_tokens=64,
        tools=[WEATHER],
        messages=[{"role": "user", "content": "Weather?"}],
        thinking={"type": "enabled", "budget_tokens": 32, "display": "omitted"},
    )
    msg = c.messages.create(**base)
    assert [b.type for b in msg.content] == ["thinking", "text", "tool_use"]
    assert (msg.content[0].thinking, msg.content[0].signature, msg.content[1].text) == ("", "", "Let me check.")
    with c.messages.stream(**base) as stream:
        final = stream.get_final_message()
    assert without_ids(final.content) == without_ids(msg.content)
    events = [
        (n, json.loads(d)) for n, d in sse_events(client.post("/v1/messages", json={**base, "stream": True}).text)
    ]
    thinking = [(n, d.get("delta", {}).get("type")) for n, d in events if d.get("index") == 0]
    assert thinking == [
        ("content_block_start", None),
        ("content_block_delta", "signature_delta"),
        ("content_block_stop", None),
    ]
    summarized = c.messages.create(**{**base, "thinking": {**base["thinking"], "display": "summarized"}})
    assert summarized.content[0].thinking == "The user wants the weather."


def test_beta_tool_runner_goes_on_without_a_server_thread(tokenizer):
    """The SDK's tool runner asks for a server-held thread; the 400 carries the details its
    thread state reads to go on unthreaded, sending the whole conversation each turn."""
    call = in_pieces('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    answer = in_pieces("It is sunny.")
    client, manager = app_client(
        tokenizer, lambda req: (answer if "sunny" in tokenizer.decode(req.input_ids) else call)(req), AGENT_PARSERS
    )
    ran = []

    @anthropic.beta_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(city)
        return "sunny"

    runner = sdk(client).beta.messages.tool_runner(
        model="m", max_tokens=64, tools=[get_weather], messages=[{"role": "user", "content": "Weather in Paris?"}]
    )
    assert [(m.stop_reason, [b.type for b in m.content]) for m in runner] == [
        ("tool_use", ["tool_use"]),
        ("end_turn", ["text"]),
    ]
    assert ran == ["Paris"] and len(manager.sent) == 2
    r = client.post("/v1/messages", json={"model": "m", "max_tokens": 8, "messages": HI, "thread": {"type": "create"}})
    assert r.status_code == 400 and r.json()["error"]["details"] == {
        "error_code": "thread_unsupported_request",
        "unsupported": ["thread"],
    }


def test_tool_turns_render_and_tool_choice_forces_a_call(agent):
    c, manager, _ = agent
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "call_2", "name": "get_weather", "input": {"city": "Lyon"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "18C"},
                {
                    "type": "tool_result",
                    "tool_use_id": "call_2",
                    "is_error": True,
                    "content": [{"type": "text", "text": "timeout"}],
                },
                {"type": "text", "text": "Thanks"},
            ],
        },
    ]
    c.messages.create(model="m", max_tokens=64, tools=[WEATHER], messages=history)
    assert manager.sent[-1].grammar is None  # auto: parsed, not forced
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather"}):
        c.messages.create(model="m", max_tokens=64, tools=[WEATHER], tool_choice=choice, messages=history)
        assert manager.sent[-1].grammar is not None
    with pytest.raises(anthropic.BadRequestError, match="not in tools"):
        c.messages.create(
            model="m", max_tokens=64, tools=[WEATHER], tool_choice={"type": "tool", "name": "nope"}, messages=history
        )


def test_tool_fields_of_the_sdk_that_ask_for_nothing_more_are_accepted(agent):
    c, manager, _ = agent
    tool = {**WEATHER, "strict": True, "eager_input_streaming": True}
    msg = c.messages.create(
        model="m",
        max_tokens=64,
        tools=[tool],
        tool_choice={"type": "any"},
        messages=[{"role": "user", "content": "Weather?"}],
    )
    assert msg.stop_reason == "tool_use" and manager.sent[-1].grammar is not None
    with pytest.raises(anthropic.BadRequestError, match="input_examples"):  # they would be shown to the model
        c.messages.create(
            model="m",
            max_tokens=64,
            tools=[{**tool, "input_examples": [{"city": "Paris"}]}],
            messages=[{"role": "user", "content": "Weather?"}],
        )


@pytest.mark.parametrize(
    "tools, param",
    [
        ([{"name": "f", "input_schema": {"type": "string"}}], "tools.0.input_schema"),
        ([WEATHER, {"name": "f", "input_schema": {"type": 5}}], "tools.1.input_schema"),
        ([{"name": "bad name!", "input_schema": {"type": "object"}}], "tools.0.name"),
    ],
)
def test_tool_errors_name_the_anthropic_field(agent, tools, param):
    c, _, _ = agent
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="m", max_tokens=8, messages=HI, tools=tools)
    error = e.value.body["error"]
    assert error["param"] == param and error["message"].startswith(param), error


def test_tool_turns_reach_the_template(agent, tokenizer):
    c, manager, _ = agent
    c.messages.create(
        model="m",
        max_tokens=64,
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "call_1", "content": "18C"},
                    {"type": "text", "text": "Thanks"},
                ],
            },
        ],
    )
    prompt = tokenizer.decode(manager.sent[-1].input_ids)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert prompt.endswith(
        "<|im_start|>tool\n18C<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    "extra, param, says",
    [
        (
            {"thinking": {"type": "adaptive", "budget_tokens": 8}},
            "thinking",
            "budget_tokens is not a field of type 'adaptive'",
        ),
        (
            {"thinking": {"type": "disabled", "display": "omitted"}},
            "thinking",
            "display is not a field of type 'disabled'",
        ),
        ({"tool_choice": {"type": "any", "name": "get_weather"}}, "tool_choice", "name is not a field of type 'any'"),
        ({"tool_choice": {"type": "auto", "name": "get_weather"}}, "tool_choice", "name is not a field of type 'auto'"),
        (
            {"tool_choice": {"type": "none", "disable_parallel_tool_use": True}},
            "tool_choice",
            "disable_parallel_tool_use is not a field of type 'none'",
        ),
    ],
)
def test_thinking_and_tool_choice_fields_their_type_lacks_are_refused(agent, extra, param, says):
    """As Anthropic's API (its types define them per type): an adaptive thinking's budget
    was accepted and not enforced, an ``any`` choice's name accepted and not forced."""
    c, manager, _ = agent
    sent = len(manager.sent)
    with pytest.raises(anthropic.BadRequestError) as e:
        c.post(
            "/v1/messages",
            body={"model": "m", "max_tokens": 64, "messages": HI, "tools": [WEATHER], **extra},
            cast_to=object,
        )
    error = e.value.body["error"]
    assert error["param"] == param and error["message"].startswith(f"{param}: {says} (it takes "), error
    assert len(manager.sent) == sent


CALL = {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}
RESULT = {"type": "tool_result", "tool_use_id": "call_1", "content": "18C"}


@pytest.mark.parametrize(
    "turns, param, says",
    [
        (
            [{"role": "user", "content": [{"type": "text", "text": "Hi"}, CALL]}],
            "messages.0.content.1",
            "tool_use blocks can only be in assistant messages",
        ),
        (
            [*HI, {"role": "assistant", "content": [RESULT]}],
            "messages.1.content.0",
            "tool_result blocks can only be in user messages",
        ),
        (
            [
                *HI,
                {"role": "assistant", "content": [CALL]},
                {"role": "user", "content": [{"type": "text", "text": "See:"}, RESULT]},
            ],
            "messages.2.content.1",
            "tool_result blocks must come first in a user turn, before any text",
        ),
        (
            [
                *HI,
                {"role": "assistant", "content": [CALL]},
                {"role": "user", "content": "See:"},
                {"role": "user", "content": [RESULT]},
            ],
            "messages.3.content.0",
            "tool_result blocks must come first in a user turn, before any text",
        ),
    ],
)
def test_tool_blocks_out_of_place_are_refused(agent, turns, param, says):
    """A user turn's tool_use was rendered as an assistant turn holding the user's text, an
    assistant turn's tool_result as a tool message, and a result after text moved before it."""
    c, manager, _ = agent
    sent = len(manager.sent)
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(model="m", max_tokens=64, tools=[WEATHER], messages=turns)
    error = e.value.body["error"]
    assert error["param"] == param and error["message"] == f"{param}: {says}", error
    assert len(manager.sent) == sent


CALL_2 = {**CALL, "id": "call_2"}


@pytest.mark.parametrize(
    "turns, param, says",
    [
        (
            [
                *HI,
                {"role": "assistant", "content": [CALL]},
                {"role": "user", "content": [{**RESULT, "tool_use_id": "call_9"}]},
            ],
            "messages.2.content.0",
            "tool_result block for tool_use id 'call_9', which is not a tool_use block of the "
            "assistant message right before it (messages.1)",
        ),
        (
            [{"role": "user", "content": [RESULT]}],
            "messages.0.content.0",
            "tool_result block for tool_use id 'call_1', which is not a tool_use block of the assistant message right "
            "before it (there is none)",
        ),
        # a call answered two turns later is not answered in the turn after it
        (
            [
                *HI,
                {"role": "assistant", "content": [CALL]},
                {"role": "user", "content": [RESULT]},
                {"role": "assistant", "content": "Ok."},
                {"role": "user", "content": [RESULT]},
            ],
            "messages.4.content.0",
            "tool_result block for tool_use id 'call_1', which is not a tool_use block of the assistant message right "
            "before it (messages.3)",
        ),
        (
            [*HI, {"role": "assistant", "content": [CALL]}, {"role": "user", "content": "What now?"}],
            "messages.1.content.0",
            "tool_use id 'call_1' has no tool_result block in the user message after it (messages.2)",
        ),
        (
            [*HI, {"role": "assistant", "content": [CALL, CALL_2]}, {"role": "user", "content": [RESULT]}],
            "messages.1.content.1",
            "tool_use id 'call_2' has no tool_result block in the user message after it (messages.2)",
        ),
        (
            [*HI, {"role": "assistant", "content": [CALL]}, {"role": "user", "content": [RESULT, RESULT]}],
            "messages.2.content.1",
            "tool_use id 'call_1' already has a tool_result block (at messages.2.content.0)",
        ),
        (
            [*HI, {"role": "assistant", "content": [CALL, CALL]}, {"role": "user", "content": [RESULT]}],
            "messages.1.content.1",
            "tool_use id 'call_1' is used twice (first at messages.1.content.0)",
        ),
        (
            [
                *HI,
                {"role": "assistant", "content": [CALL]},
                {"role": "user", "content": [RESULT]},
                {"role": "assistant", "content": [CALL]},
                {"role": "user", "content": [RESULT]},
            ],
            "messages.3.content.0",
            "tool_use id 'call_1' is used twice (first at messages.1.content.0)",
        ),
        (
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "thinking", "thinking": "Hm.", "signature": "s"},
                        {"type": "text", "text": "Hi"},
                    ],
                }
            ],
            "messages.0.content.0",
            "thinking blocks can only be in assistant messages",
        ),
        (
            [{"role": "user", "content": [{"type": "redacted_thinking", "data": "x"}, {"type": "text", "text": "Hi"}]}],
            "messages.0.content.0",
            "redacted_thinking blocks can only be in assistant messages",
        ),
    ],
)
def test_tool_use_and_tool_result_blocks_must_pair_up(agent, turns, param, says):
    """As Anthropic's API: a tool_result answers a tool_use of the assistant message right
    before it (once), every tool_use answered by the next user message has its tool_result
    there, tool_use ids are unique, and thinking blocks are the assistant's. Each was
    accepted: an unanswered call or a result of no call rendered as it came, a user's
    thinking block dropped."""
    c, manager, _ = agent
    sent = len(manager.sent)
    body = {"model": "m", "tools": [WEATHER], "messages": turns}
    for path, extra in (("/v1/messages", {"max_tokens": 64}), ("/v1/messages/count_tokens", {})):
        with pytest.raises(anthropic.BadRequestError) as e:
            c.post(path, body={**body, **extra}, cast_to=object)
        error = e.value.body["error"]
        assert error["param"] == param and error["message"].startswith(f"{param}: {says}"), error
    assert len(manager.sent) == sent


def test_paired_calls_across_turns_are_served(agent, tokenizer):
    """Two rounds of calls, each answered in the next user message (combined from two
    messages there), the results in any order: served, each result after its call."""
    c, manager, _ = agent
    turns = [
        *HI,
        {"role": "assistant", "content": [CALL, CALL_2]},
        {"role": "user", "content": [{**RESULT, "tool_use_id": "call_2", "content": "20C"}]},
        {"role": "user", "content": [RESULT, {"type": "text", "text": "And?"}]},
        {"role": "assistant", "content": [{**CALL, "id": "call_3"}]},
        {"role": "user", "content": [{**RESULT, "tool_use_id": "call_3", "content": "19C"}]},
    ]
    c.messages.create(model="m", max_tokens=64, tools=[WEATHER], messages=turns)
    prompt = tokenizer.decode(manager.sent[-1].input_ids)
    assert prompt.index("20C") < prompt.index("18C") < prompt.index("And?") < prompt.index("19C")


def test_an_assistant_turn_keeps_its_block_order_in_the_prompt(agent, tokenizer):
    """Text after a tool_use block was rendered before the call (a chat message's content
    comes before its tool_calls): it is now a message of its own after the call's."""
    c, manager, _ = agent
    turns = [
        *HI,
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "First."}, CALL, {"type": "text", "text": "Then."}, CALL_2],
        },
        {"role": "user", "content": [RESULT, {**RESULT, "tool_use_id": "call_2"}]},
    ]
    c.messages.create(model="m", max_tokens=64, tools=[WEATHER], messages=turns)
    prompt = tokenizer.decode(manager.sent[-1].input_ids)
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert prompt.count(call) == 2
    first = prompt.index(call)
    assert prompt.index("First.") < first < prompt.index("Then.") < prompt.index(call, first + 1)


@pytest.mark.parametrize(
    "arguments, reason, stop, expected",
    [
        ('{"city": "Paris", "days": [1, 2], "x', FinishReason.LENGTH, None, {"city": "Paris", "days": [1, 2]}),
        ('{"city": "Paris", "days": [1, 2', FinishReason.LENGTH, None, {"city": "Paris", "days": [1]}),
        ('{"city": "Paris", "days": [1, 2.', FinishReason.LENGTH, None, {"city": "Paris", "days": [1]}),
        ('{"city": "Paris", "country": "Fr', FinishReason.LENGTH, None, {"city": "Paris"}),
        ('{"city": "Paris", "days": oops}', FinishReason.STOP, IM_END, {"city": "Paris"}),
        ('{"city": "Paris", "days": [1, NaN, 3]}', FinishReason.STOP, IM_END, {"city": "Paris", "days": [1]}),
        ('{"city": "Paris", "days": [1, -Infinity]}', FinishReason.STOP, IM_END, {"city": "Paris", "days": [1]}),
        ('{"city": "Paris", "days": [1, 1e400]}', FinishReason.STOP, IM_END, {"city": "Paris", "days": [1]}),
    ],
    ids=["cut", "cut-in-number", "cut-in-fraction", "cut-in-string", "not-json", "nan", "infinity", "overflow"],
)
def test_a_call_cut_short_or_not_json_has_one_input_streamed_and_not(tokenizer, arguments, reason, stop, expected):
    """A call cut by max_tokens had input {} in the body but its finished members in the SDK's
    stream accumulator; arguments that stop being JSON made the SDK's stream raise ("Unable
    to parse tool parameter JSON"). Now the stream sends the arguments as far as they are
    JSON, and the body's input is what the SDK makes of that. A number is sent once it has
    ended (it was read as written so far: a cut 25 was 2). NaN, Infinity and a number that
    overflows a double are not JSON: the body was a 500 (a float JSON cannot carry), the
    stream gave the SDK nan and inf."""
    text = '<tool_call>\n{"name": "get_weather", "arguments": ' + arguments
    pieces = [text[i : i + 5] for i in range(0, len(text), 5)]
    script = deltas(*[Delta(p, i + 1) for i, p in enumerate(pieces[:-1])], Delta(pieces[-1], len(pieces), reason, stop))
    client, _ = app_client(tokenizer, script, AGENT_PARSERS)
    c = sdk(client)
    base = dict(model="m", max_tokens=64, tools=[WEATHER], messages=[{"role": "user", "content": "Weather?"}])
    msg = c.messages.create(**base)
    assert [(b.type, b.input) for b in msg.content] == [("tool_use", expected)]
    with c.messages.stream(**base) as stream:
        final = stream.get_final_message()
    assert without_ids(final.content) == without_ids(msg.content)
    assert (final.stop_reason, msg.stop_reason) == (
        ("max_tokens",) * 2 if reason == FinishReason.LENGTH else ("end_turn",) * 2
    )


@pytest.mark.parametrize(
    "text, prefix",
    [
        ('{"a": [1, 2.5e3, -0, true, null, "x\\"\\u00e9\\ud83d\\ude00"], "b": {}}', None),
        ('{"a": 12', '{"a": '),
        ('{"a": 12,', None),
        ('{"a": 1e309}', '{"a": '),
        ('{"a": 1e308}', None),
        ('{"a": ' + "9" * 4300 + "}", None),
        ('{"a": ' + "9" * 4301 + "}", '{"a": '),
        ('{"a": NaN}', '{"a": '),
        ('{"a": 01}', '{"a": '),
        ('{"a": 1.}', '{"a": '),
        ('{"a": 12x', '{"a": 12'),
        ('{"a": "\\ud83d"}', '{"a": "\\ud83d'),
        ('{"a": "\\udc00"}', '{"a": "\\udc0'),
        ('{"a": "\\x"}', '{"a": "\\'),
        ('{"a": "\t"}', '{"a": "'),
        ('{"a": [true false]}', '{"a": [true '),
        ('{"a": 1, }', '{"a": 1, '),
        ("[" * 201, "[" * 200),
        (' {"a": 1}', ""),
        ('"a"', ""),
        ('{"a": 1} x', '{"a": 1} '),
    ],
)
def test_json_prefix_gives_the_arguments_as_far_as_they_are_json(text, prefix):
    """`JsonPrefix`, fed a character at a time and in one piece: a JSON object whole (None),
    else the text up to where it stops being JSON, a number only once it has ended."""
    from tokenizer_proc.output.json_prefix import JsonPrefix

    one = JsonPrefix()
    assert "".join(one.feed(ch) for ch in text) == JsonPrefix().feed(text) == (text if prefix is None else prefix)


def test_json_prefix_never_gives_what_the_sdk_cannot_parse():
    """Random edits of JSON texts, fed in random pieces: every prefix parses with jiter's
    partial mode (the SDK's stream accumulator) to a value that serializes as JSON, and an
    unedited text is given whole."""
    import random

    import jiter

    from tokenizer_proc.output.json_prefix import JsonPrefix

    rng = random.Random(0)
    words = ["", "a", "é", "日本", "😀", "\n", '"', "\\", "\x01", "\u2028"]

    def value(depth: int):
        if depth > 3 or rng.random() < 0.4:
            return rng.choice([0, -1, 12, 3.5, -0.25, 1e10, 1.5e-7, 10**20, True, False, None, rng.choice(words) * 2])
        if rng.random() < 0.5:
            return {rng.choice(words) + str(i): value(depth + 1) for i in range(rng.randint(0, 4))}
        return [value(depth + 1) for _ in range(rng.randint(0, 4))]

    edits = list('{}[]",:\\ -+.eE019tfnulNIx\t') + ["\\ud800", "\\udc00", "1e400", "NaN", "true"]
    for _ in range(1500):
        text = json.dumps({"k": value(0)}, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1]))
        edited = rng.random() < 0.7
        for _ in range(rng.randint(1, 3) if edited else 0):
            at = rng.randint(0, len(text))
            text = text[:at] + rng.choice(edits) + text[at + rng.randint(0, 1) :]
        prefix, at = JsonPrefix(), 0
        pieces = []
        while at < len(text):
            size = rng.randint(1, 6)
            pieces.append(prefix.feed(text[at : at + size]))
            at += size
        given = "".join(pieces)
        assert text.startswith(given) and (edited or given == text), text
        if given:
            json.dumps(jiter.from_json(given.encode(), partial_mode=True), allow_nan=False)


def test_a_long_argument_stream_takes_linear_time():
    """Each delta re-parsed all the argument text so far: 100 KB of small objects in 4-character
    deltas took about 10 s of the tokenizer's loop; now each character is read once."""
    import time

    from tokenizer_proc.anthropic import render
    from tokenizer_proc.output.blocks import Block, Step

    arguments = json.dumps({"rows": [{"id": i, "name": f"n{i}", "v": i / 2} for i in range(2400)]})
    events, block = render.MessageEvents("r-1", "m"), Block("call", 0, call_id="call_1", name="f")
    start = time.perf_counter()
    sent = [events.steps([Step("delta", block, arguments[i : i + 4])]) for i in range(0, len(arguments), 4)]
    assert time.perf_counter() - start < 3, len(arguments)
    streamed = "".join(json.loads(e.split("data: ", 1)[1])["delta"]["partial_json"] for e in sent if e)
    assert streamed == arguments and Block("call", 0, arguments).call_input() == json.loads(arguments)


def test_a_delta_ending_a_call_and_holding_text_after_it(tokenizer):
    """The text after a call came in the same delta as the call's last argument text: that
    text opened a new tool_use block without id or name (the body was a 500, the stream an
    error event). Now: the call, then the text, streamed and not."""
    client, _ = app_client(tokenizer, CALL_THEN_TEXT, AGENT_PARSERS)
    c = sdk(client)
    base = dict(model="m", max_tokens=64, tools=[WEATHER], messages=[{"role": "user", "content": "Weather?"}])
    msg = c.messages.create(**base)
    assert [b.model_dump(exclude_none=True) for b in msg.content] == [
        {"type": "tool_use", "id": msg.content[0].id, "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "text", "text": "\nDone."},
    ]
    with c.messages.stream(**base) as stream:
        final = stream.get_final_message()
    assert without_ids(final.content) == without_ids(msg.content)


@pytest.mark.parametrize(
    "pieces",
    [
        ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\nDone.'],
        ["Sure.", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\nDone.'],
        ['Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\nDone.'],
        ['Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', 'ris"}}\n</tool_call>\nDone.'],
    ],
    ids=["call-and-text", "text-then-call-and-text", "all-in-one", "call-split"],
)
def test_blocks_follow_the_generated_order_when_a_delta_holds_a_whole_call_and_text(tokenizer, pieces):
    """A delta holding a whole call and the text after it gave the text block first (the
    piece's content was placed before the calls it began): the blocks, streamed and not,
    and the stream's events now follow the order the model wrote."""
    script = deltas(
        *[
            Delta(
                p,
                5 * (i + 1),
                FinishReason.STOP if i == len(pieces) - 1 else None,
                IM_END if i == len(pieces) - 1 else None,
            )
            for i, p in enumerate(pieces)
        ]
    )
    client, _ = app_client(tokenizer, script, AGENT_PARSERS)
    c = sdk(client)
    base = dict(model="m", max_tokens=64, tools=[WEATHER], messages=[{"role": "user", "content": "Weather?"}])
    expected = ([{"type": "text", "text": "Sure."}] if pieces[0].startswith("Sure.") else []) + [
        {"type": "tool_use", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "text", "text": "\nDone."},
    ]
    msg = c.messages.create(**base)
    assert without_ids(msg.content) == expected and msg.stop_reason == "tool_use"
    with c.messages.stream(**base) as stream:
        final = stream.get_final_message()
    assert without_ids(final.content) == expected
    events = [json.loads(d) for _, d in sse_events(client.post("/v1/messages", json={**base, "stream": True}).text)]
    blocks = [(e["type"], e["index"]) for e in events if e["type"].startswith("content_block_")]
    shown = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert shown == [b["type"] for b in expected]
    for i in range(len(expected)):  # each block starts, gets its deltas and stops before the next starts
        mine = [k for k, (_, index) in enumerate(blocks) if index == i]
        assert blocks[mine[0]][0] == "content_block_start" and blocks[mine[-1]][0] == "content_block_stop"
        assert mine == list(range(mine[0], mine[-1] + 1))


@pytest.mark.parametrize(
    "turns, system, param, says",
    [
        (
            [{"role": "user", "content": [{"type": "text", "text": " \n\t"}]}],
            None,
            "messages.0.content.0",
            "text content blocks must contain non-whitespace text",
        ),
        (
            [{"role": "user", "content": "  "}],
            None,
            "messages.0.content",
            "text content blocks must contain non-whitespace text",
        ),
        (
            [*HI, {"role": "assistant", "content": [{"type": "text", "text": "\n"}, {"type": "text", "text": "Sure"}]}],
            None,
            "messages.1.content.0",
            "text content blocks must contain non-whitespace text",
        ),
        (
            [
                *HI,
                {"role": "assistant", "content": [CALL]},
                {"role": "user", "content": [{**RESULT, "content": [{"type": "text", "text": " "}]}]},
            ],
            None,
            "messages.2.content.0",
            "text content blocks must contain non-whitespace text",
        ),
        (HI, [{"type": "text", "text": "\n\n"}], "system.0", "text content blocks must contain non-whitespace text"),
    ],
)
def test_whitespace_only_text_blocks_are_refused(agent, turns, system, param, says):
    """As Anthropic's API refuses them; they were accepted (only an empty text was refused)."""
    c, manager, _ = agent
    sent = len(manager.sent)
    body = {"model": "m", "max_tokens": 8, "tools": [WEATHER], "messages": turns}
    if system is not None:
        body["system"] = system
    with pytest.raises(anthropic.BadRequestError) as e:
        c.post("/v1/messages", body=body, cast_to=object)
    error = e.value.body["error"]
    assert (error["param"], error["message"]) == (param, f"{param}: {says}")
    assert len(manager.sent) == sent


@pytest.mark.parametrize(
    "where, value, param, says",
    [
        ("input", "NaN", "messages.1.content.0.input", "NaN is not a JSON number (at $.days[1])"),
        ("input", "-Infinity", "messages.1.content.0.input", "the number is beyond the range of a 64-bit float"),
        ("input", "1e400", "messages.1.content.0.input", "the number is beyond the range of a 64-bit float"),
        ("thread", "NaN", "thread", "NaN is not a JSON number (at $.days[1])"),
        ("input_schema", "Infinity", "tools.0.input_schema", "the number is beyond the range of a 64-bit float"),
    ],
)
def test_numbers_json_has_not_in_free_form_objects_are_refused(agent, where, value, param, says):
    """NaN, Infinity and 1e400 (which Python's JSON reader takes) inside a tool_use block's
    input or another free-form object: a 400 naming it, as a float field refuses them. A
    tool input's NaN was accepted and rendered into the prompt as ``NaN``."""
    c, manager, client = agent
    sent = len(manager.sent)
    bad = f'{{"city": "Paris", "days": [1, {value}]}}'
    tool = (
        json.dumps(WEATHER)
        if where != "input_schema"
        else (
            f'{{"name": "get_weather", "input_schema": {{"type": "object", "properties": {{"days": {{"maximum": {value}}}}}}}}}'
        )
    )
    text = (
        '{{"model": "m", "max_tokens": 8, "tools": [{}], "messages": [{{"role": "user", "content": "Hi"}}, '
        '{{"role": "assistant", "content": [{{"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}}]}}, '
        '{{"role": "user", "content": [{{"type": "tool_result", "tool_use_id": "t", "content": "18C"}}]}}]{}}}'.format(
            tool, bad if where == "input" else "{}", ', "thread": ' + bad if where == "thread" else ""
        )
    )
    r = client.post("/v1/messages", content=text, headers={"content-type": "application/json"})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == param and error["message"].startswith(f"{param}: {says}"), error
    assert len(manager.sent) == sent


def test_a_strict_tool_is_enforced_under_auto_and_a_prefill_still_continues(agent):
    """``strict: true`` holds under ``auto`` too (`tools.grammar.auto_calls`): the text stays
    free until a call starts, so an assistant prefill is continued (a forced tool's grammar
    refuses one); a schema the grammar cannot enforce is a 400 naming the input_schema."""
    c, manager, _ = agent
    ask = [{"role": "user", "content": "Weather?"}]
    c.messages.create(model="m", max_tokens=64, tools=[WEATHER], messages=ask)
    assert manager.sent[-1].grammar is None
    msg = c.messages.create(model="m", max_tokens=64, tools=[{**WEATHER, "strict": True}], messages=ask)
    grammar = manager.sent[-1].grammar
    assert grammar.kind == GrammarKind.EBNF and "TagDispatch" in grammar.text and "get_weather" in grammar.text
    assert [b.type for b in msg.content] == ["thinking", "text", "tool_use"] and msg.stop_reason == "tool_use"
    c.messages.create(
        model="m",
        max_tokens=64,
        tools=[{**WEATHER, "strict": True}],
        messages=ask + [{"role": "assistant", "content": "Let me check."}],
    )
    assert manager.sent[-1].grammar == grammar
    with pytest.raises(anthropic.BadRequestError) as e:
        c.messages.create(
            model="m",
            max_tokens=8,
            messages=HI,
            tools=[
                {
                    "name": "f",
                    "strict": True,
                    "input_schema": {"type": "object", "properties": {"city": {"not": {"type": "string"}}}},
                }
            ],
        )
    assert e.value.body["error"]["param"] == "tools.0.input_schema", e.value.body
