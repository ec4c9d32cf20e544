"""The OpenAI Responses API (``/v1/responses``) through the `openai` SDK: shapes, statuses,
stream events, ``previous_response_id`` and the store, and refusals on the app in-process
with scripted deltas. On live servers: tests/e2e/test_responses_api.py (tiny model) and
tests/e2e/real/test_responses_api.py (default model)."""

from __future__ import annotations

import copy
import json
import time

import openai
import pytest
from openai.types.responses import ResponseError

from protocol.enums import FinishReason, GrammarKind
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
from tokenizer_proc.errors import APIError
from tokenizer_proc.link.tokenizer_manager import Delta
from tokenizer_proc.responses.store import ResponseStore


def sdk(client) -> openai.OpenAI:
    """The SDK on an in-process test client (an httpx.Client)."""
    return openai.OpenAI(base_url="http://testserver/v1", api_key="k", http_client=client, max_retries=0)


@pytest.fixture(scope="module")
def fake(tokenizer):
    client, manager = app_client(tokenizer, HELLO)
    return sdk(client), manager, tokenizer


def test_create_shape_and_usage(fake):
    c, manager, tok = fake
    r = c.responses.create(
        model="m",
        input=[
            {"role": "developer", "content": "Be brief."},
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "Hi "}, {"type": "input_text", "text": "there"}],
            },
        ],
        instructions="You are terse.",
        max_output_tokens=8,
        temperature=0.5,
        top_p=0.9,
    )
    assert r.object == "response" and r.status == "completed" and r.id.startswith("resp_")
    assert r.created_at <= r.completed_at <= time.time()
    assert r.output_text == " Hello" and r.output[0].type == "message" and r.output[0].status == "completed"
    req = manager.sent[-1]
    assert (req.max_new_tokens, req.sampling.temperature, req.sampling.top_p) == (8, 0.5, 0.9)
    prompt = tok.decode(req.input_ids)
    assert prompt.startswith("<|im_start|>system\nYou are terse.")  # instructions, then the developer message
    assert prompt.index("Be brief.") < prompt.index("<|im_start|>user\nHi there<|im_end|>")
    u = r.usage
    assert (u.input_tokens, u.input_tokens_details.cached_tokens, u.output_tokens) == (len(req.input_ids), 3, 4)
    assert u.total_tokens == u.input_tokens + u.output_tokens


def test_null_for_an_optional_field_is_the_field_absent(fake):
    """As on chat completions, null is the field left out: ``stream`` and ``store`` null were
    400s ("Input should be a valid boolean"); now a non-streamed response that is stored."""
    c, manager, _ = fake
    client = c._client
    nulls = {"stream": None, "store": None, "temperature": None, "stream_options": None, "metadata": None}
    r = client.post("http://testserver/v1/responses", json={"model": "m", "input": "Hi", **nulls})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "response" and body["store"] is True
    assert client.get(f"http://testserver/v1/responses/{body['id']}").status_code == 200
    bad = client.post("http://testserver/v1/responses", json={"model": "m", "input": None})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input"


def test_length_cut_is_incomplete(tokenizer):
    c = sdk(app_client(tokenizer, deltas(Delta(" Hel", 2), Delta("lo", 4, FinishReason.LENGTH)))[0])
    r = c.responses.create(model="m", input="Hi", max_output_tokens=4)
    assert (r.status, r.incomplete_details.reason, r.output[0].status) == (
        "incomplete",
        "max_output_tokens",
        "incomplete",
    )
    assert r.completed_at is None  # only a completed response has it


def test_stream_events_and_final_response(fake):
    c, _, _ = fake
    full = c.responses.create(model="m", input="Hi")
    events = list(c.responses.create(model="m", input="Hi", stream=True))
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == events[6].text == " Hello"
    last = events[-1].response
    assert last.output_text == full.output_text and last.usage == full.usage and last.status == full.status


def test_previous_response_id_continues_the_conversation(fake):
    c, manager, tok = fake
    first = c.responses.create(model="m", input="Hi", instructions="Only for the first.")
    c.responses.create(model="m", input="And then?", previous_response_id=first.id)
    prompt = tok.decode(manager.sent[-1].input_ids)
    assert "Only for the first." not in prompt  # instructions are not carried over
    assert (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n Hello<|im_end|>\n<|im_start|>user\nAnd then?" in prompt
    )
    assert c.responses.retrieve(first.id).output_text == " Hello"
    c.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError, match="not stored") as e:
        c.responses.create(model="m", input="x", previous_response_id=first.id)
    assert (e.value.body["param"], e.value.code) == ("previous_response_id", "previous_response_not_found")
    assert repr(first.id) in e.value.body["message"]
    with pytest.raises(openai.BadRequestError, match="not stored") as e:  # an empty id names no response
        c.responses.create(model="m", input="x", previous_response_id="")
    assert e.value.body["param"] == "previous_response_id"
    unstored = c.responses.create(model="m", input="Hi", store=False)
    with pytest.raises(openai.BadRequestError, match="not stored"):
        c.responses.create(model="m", input="x", previous_response_id=unstored.id)


def test_an_assistant_refusal_part_is_its_words_as_on_chat(fake):
    """An assistant message's refusal part (an earlier OpenAI output sent back) was a 400
    ("type 'refusal' is not supported"), while chat completions read an assistant's refusal
    as its words: the same rule here, the prompt the chat route renders. Anywhere else a
    refusal part is a 400 naming it (`test_refusals_name_the_field`)."""
    c, manager, tok = fake
    refused = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't help with that."}]},
        {"role": "user", "content": "Why?"},
    ]
    r = c.responses.create(model="m", input=refused)
    prompt = manager.sent[-1].input_ids
    assert r.status == "completed" and "<|im_start|>assistant\nI can't help with that.<|im_end|>" in tok.decode(prompt)
    c.chat.completions.create(model="m", messages=refused)
    assert manager.sent[-1].input_ids == prompt
    mixed = [
        {
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "Sorry. ", "annotations": []},
                {"type": "refusal", "refusal": "No."},
            ],
        }
    ]
    c.responses.create(model="m", input=mixed)
    assert "<|im_start|>assistant\nSorry. No.<|im_end|>" in tok.decode(manager.sent[-1].input_ids)


def test_a_response_runs_under_its_id_and_says_its_tier(fake):
    """The request ran, and so was logged, as ``chatcmpl-<hex>`` while the response was
    ``resp_<hex>``: it runs under the response's id. service_tier (absent before) is the
    tier used, "default", whatever the request asked ("auto"), as OpenAI's Response says;
    background, refused unless false, is echoed so too."""
    c, manager, _ = fake
    r = c.responses.create(model="m", input="Hi", service_tier="auto")
    assert r.id.startswith("resp_") and manager.sent[-1].rid == r.id
    assert (r.service_tier, r.background) == ("default", False)
    assert r.output[0].id == "msg_" + r.id.removeprefix("resp_") + "_0"
    events = list(c.responses.create(model="m", input="Hi", stream=True))
    assert manager.sent[-1].rid == events[0].response.id == events[-1].response.id
    assert (events[0].response.service_tier, events[-1].response.service_tier) == ("default", "default")


def test_input_tokens_counts_the_prompt_a_response_would_take(fake):
    c, manager, _ = fake
    first = c.responses.create(model="m", input="Hi", instructions="Be brief.")
    asked = dict(model="m", input="And then?", previous_response_id=first.id, instructions="Terse.")
    count = c.responses.input_tokens.count(**asked)
    c.responses.create(**asked)
    assert (count.object, count.input_tokens) == ("response.input_tokens", len(manager.sent[-1].input_ids))
    with pytest.raises(openai.BadRequestError, match="input items is not supported"):
        c.responses.input_items.list(first.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.input_items.list("resp_gone")


def test_compact_and_a_style_preset_are_400s_saying_so(fake):
    """``responses.compact`` was a 405 saying the path takes GET (read as a response id);
    ``personality`` (the input-token count's style preset) was ignored: the count was the one
    without it."""
    c, manager, _ = fake
    with pytest.raises(openai.BadRequestError, match="compacting a conversation .* is not supported") as e:
        c.responses.compact(model="m", input="Hi")
    assert e.value.body["type"] == "invalid_request_error"
    sent = len(manager.sent)
    for call in (c.responses.input_tokens.count, c.responses.create):
        with pytest.raises(openai.BadRequestError, match="personality is not supported by this server") as e:
            call(model="m", input="Hi", extra_body={"personality": "friendly"})
        assert e.value.body["param"] == "personality"
    assert len(manager.sent) == sent


def test_retrieve_refuses_a_stream_and_what_include_cannot_add(fake):
    """``responses.retrieve(id, stream=True)`` answered the JSON body, which the SDK read as a
    stream of no events; ``include`` values create refuses were ignored. Now 400s naming the
    parameter; create's no-op values (and include_obfuscation) are accepted."""
    c, _, _ = fake
    done = c.responses.create(model="m", input="Hi")
    for kwargs, param in (
        ({"stream": True}, "stream"),
        ({"stream": True, "starting_after": 2}, "starting_after"),
        ({"include": ["message.output_text.logprobs"]}, "include.0"),
    ):
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.retrieve(done.id, **kwargs)
        assert e.value.body["param"] == param and e.value.body["message"].startswith(param), e.value.body
    kept = c.responses.retrieve(
        done.id, stream=False, include=["reasoning.encrypted_content"], include_obfuscation=True
    )
    assert kept.id == done.id and kept.output_text == done.output_text


def test_cancel_is_a_400_for_a_stored_response_and_404_for_an_unknown_one(fake):
    """As OpenAI's API: only background responses can be cancelled (a route, not a 404 for every id)."""
    c, _, _ = fake
    done = c.responses.create(model="m", input="Hi")
    with pytest.raises(openai.BadRequestError, match="only responses created with background") as e:
        c.responses.cancel(done.id)
    assert e.value.body["type"] == "invalid_request_error"
    assert c.responses.retrieve(done.id).status == "completed"  # still stored, unchanged
    with pytest.raises(openai.NotFoundError, match="not stored here"):
        c.responses.cancel("resp_gone")


def test_a_running_response_is_retrieved_in_progress_and_deleting_it_keeps_it_from_the_store():
    """Between begin and end (a streamed response whose id the client has), get is its
    in-progress object (previous_response_id: a 400 saying so), and delete means the put when
    it finishes stores nothing. All three were 404s, and the deleted response was stored."""
    store = ResponseStore()
    store.begin("a", {"id": "a", "status": "in_progress"})
    assert store.get("a").body == {"id": "a", "status": "in_progress"}
    with pytest.raises(APIError, match="'a' is still in progress") as e:
        store.get("a", "previous_response_id")
    assert (e.value.status, e.value.param) == (400, "previous_response_id")
    store.delete("a")
    store.put("a", {"id": "a", "status": "completed"}, [])
    store.end("a")
    with pytest.raises(APIError, match="not stored"):
        store.get("a")
    store.begin("b", {"id": "b", "status": "in_progress"})
    store.put("b", {"id": "b", "status": "completed"}, [])
    store.end("b")
    assert store.get("b").body["status"] == "completed" and not store.running and not store.dropped
    store.begin("c", {"id": "c"})
    store.end("c")  # its client left: nothing kept
    with pytest.raises(APIError, match="not stored"):
        store.get("c")


def test_store_says_why_an_unfinished_stream_is_not_kept_unless_it_was_deleted():
    store = ResponseStore(max_stored=2)
    for rid in ("a", "b", "c", "d"):
        store.begin(rid, {"id": rid})
    store.delete("d")
    for rid in ("a", "b", "c", "d"):
        store.end(rid, "it failed (boom)")
    assert list(store.unstored) == ["b", "c"]  # bounded; a deleted one says nothing more
    with pytest.raises(APIError, match="it was not stored: it failed \\(boom\\)"):
        store.get("c")
    with pytest.raises(APIError, match="not stored here"):
        store.get("d")


def test_store_is_bounded_in_count_and_time():
    now = [0.0]
    store = ResponseStore(max_stored=2, ttl_s=10, clock=lambda: now[0])
    for rid in ("a", "b", "c"):
        store.put(rid, {"id": rid}, [])
    assert list(store.items) == ["b", "c"]  # the oldest went first
    now[0] = 9.0
    assert store.get("b").body == {"id": "b"}
    now[0] = 10.0
    with pytest.raises(Exception, match="not stored"):
        store.get("b")
    assert not store.items


def test_text_format_json_schema_is_enforced(fake):
    c, manager, _ = fake
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    r = c.responses.create(
        model="m", input="Hi", text={"format": {"type": "json_schema", "name": "x", "schema": schema, "strict": True}}
    )
    grammar = manager.sent[-1].grammar
    assert grammar.kind == GrammarKind.JSON_SCHEMA and json.loads(grammar.text) == schema
    assert r.text.format.type == "json_schema"
    c.responses.create(model="m", input="Hi", text={"format": {"type": "json_object"}})
    assert manager.sent[-1].grammar.kind == GrammarKind.JSON_OBJECT


FUNCTION = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": True}


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"tools": [FUNCTION]}, "tools"),  # this app has no tool-call parser
        ({"tools": [{"type": "web_search"}]}, "tools.0"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input.0.content.0"),
        ({"background": True}, "background"),
        ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
        ({"reasoning": {"summary": "detailed"}}, "reasoning.summary"),
        ({"reasoning": "high"}, "reasoning"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
        (
            {
                "instructions": "Be brief.",
                "input": [
                    {"role": "user", "content": "Hi"},
                    {  # named by its item, not by
                        "type": "function_call",
                        "call_id": "c",
                        "name": "f",
                        "arguments": "{bad",
                    },
                ],
            },  # the chat message it becomes
            "input.1.arguments",
        ),
        ({"truncation": "auto"}, "truncation"),
        ({"include": ["message.output_text.logprobs"]}, "include.0"),
        ({"max_output_tokens": 100_000}, "max_output_tokens"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": 5}}}}, "text.format"),
        (
            {"text": {"format": {"type": "json_object", "schema": {"type": "object", "required": ["a"]}}}},
            "text.format.schema",
        ),  # was accepted and ignored: free JSON
        ({"text": {"format": {"type": "text", "name": "x"}}}, "text.format.name"),
        # fields of the API that were dropped as unknown although they change the output:
        ({"moderation": {"model": "omni-moderation-latest", "policy": {"output": {"mode": "block"}}}}, "moderation"),
        ({"context_management": [{"type": "compaction", "compact_threshold": 100}]}, "context_management"),
        ({"prompt_cache_options": {"prewarm": True}}, "prompt_cache_options.prewarm"),  # no output at all
        ({"access_programs": {"cyber": "daybreak_red"}}, "access_programs.cyber"),
        ({"background_options": {"completion_window": "8h"}}, "background_options"),
        ({"prompt_cache_options": {"ttl": "1h"}}, "prompt_cache_options.ttl"),
        (
            {
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "Hi", "prompt_cache_breakpoint": {"mode": "implicit"}}
                        ],
                    }
                ]
            },
            "input.0.content.0.prompt_cache_breakpoint.mode",
        ),
        (
            {
                "instructions": "Be brief.",
                "input": [
                    {"role": "assistant", "content": "Hi"},
                    {
                        "role": "user",
                        "content": [{"type": "input_text", "text": "Hi"}, {"type": "refusal", "refusal": "No."}],
                    },
                ],
            },
            "input.1.content.1",
        ),
        ({"stream_options": {"include_obfuscation": False}}, "stream_options"),  # without stream: as chat answers
    ],
)
def test_refusals_name_the_field(fake, extra, param):
    c, _, _ = fake
    with pytest.raises(openai.BadRequestError) as e:
        c.post("/responses", body={"model": "m", "input": "Hi", **extra}, cast_to=object)
    assert e.value.body["param"] == param and param.split(".")[0] in e.value.body["message"]
    assert "Input should be None" not in e.value.body["message"]  # pydantic's words for a field taking only null


@pytest.mark.parametrize(
    "extra",
    [
        {"prompt_cache_retention": "24h"},  # a 400 here, accepted on chat completions
        {"prompt_cache_options": {"mode": "explicit", "ttl": "12h", "prewarm": False, "comparison_response_id": "r"}},
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "input_text",
                            "text": "Hi",
                            "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "30m"},
                        }
                    ],
                }
            ]
        },  # was a 400: unknown key
        {"access_programs": {"cyber": "standard"}},
        {"image": {"context_compression": "enabled"}},
        {"moderation": None, "context_management": None, "background_options": None},
        {"reasoning": {}},
        {"reasoning": {"effort": None, "summary": "auto"}},  # Codex sends these
        {"text": {"verbosity": "medium"}},  # OpenAI's default
    ],
)
def test_caching_hints_and_fields_without_effect_change_nothing(fake, extra):
    """The SDK's fields that ask for nothing that changes the output here are accepted: the
    request is the one sent without them."""
    c, manager, _ = fake
    c.post("/responses", body={"model": "m", "input": "Hi"}, cast_to=object)
    c.post("/responses", body={"model": "m", "input": "Hi", **extra}, cast_to=object)
    plain, hinted = manager.sent[-2:]
    assert (hinted.input_ids, hinted.sampling, hinted.max_new_tokens) == (
        plain.input_ids,
        plain.sampling,
        plain.max_new_tokens,
    )


def test_the_response_echoes_the_requests_settings(fake):
    """As OpenAI's Response object: the identifiers and caching settings a request gave are in
    the response (created, streamed, retrieved); safety_identifier, prompt_cache_key and
    prompt_cache_retention were null whatever was sent (user was echoed)."""
    c, _, _ = fake
    given = {
        "user": "u1",
        "safety_identifier": "s1",
        "prompt_cache_key": "k1",
        "prompt_cache_retention": "24h",
        "top_logprobs": 0,
        "metadata": {"a": "b"},
    }
    r = c.responses.create(model="m", input="Hi", **given)
    streamed = list(c.responses.create(model="m", input="Hi", stream=True, **given))
    for response in (r, c.responses.retrieve(r.id), streamed[0].response, streamed[-1].response):
        assert {k: getattr(response, k) for k in given} == given
    plain = c.responses.create(model="m", input="Hi")
    assert (plain.safety_identifier, plain.prompt_cache_key, plain.prompt_cache_retention) == (None, None, None)


def test_the_response_says_the_temperature_and_top_p_used_when_not_given(fake):
    """OpenAI's Response object says the sampling it used: 1.0 for a temperature or top_p
    not given (its default, and this server's). They were null, which reads as unknown."""
    c, manager, _ = fake
    plain = c.responses.create(model="m", input="Hi")
    sent = manager.sent[-1].sampling
    assert (plain.temperature, plain.top_p) == (sent.temperature, sent.top_p) == (1.0, 1.0)
    streamed = list(c.responses.create(model="m", input="Hi", stream=True))
    assert {(e.response.temperature, e.response.top_p) for e in (streamed[0], streamed[-1])} == {(1.0, 1.0)}
    assert (c.responses.retrieve(plain.id).temperature, c.responses.retrieve(plain.id).top_p) == (1.0, 1.0)
    given = c.responses.create(model="m", input="Hi", temperature=0.25, top_p=0.5)
    assert (given.temperature, given.top_p) == (0.25, 0.5)


@pytest.mark.parametrize(
    "extra, param, says",
    [
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input.0.content.0",
            "type 'input_image' is not supported by this server: this model takes text only",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input.0.content.0",
            "type 'input_file' is not supported by this server: this model takes text only",
        ),
        ({"tools": [{"type": "web_search"}]}, "tools.0", "type 'web_search' is not supported by this server"),
    ],
)
def test_types_not_served_are_refused_saying_so(fake, extra, param, says):
    """An image or file part, or a hosted tool, is a 400 that says the server does not take it
    (it said pydantic's "Input tag 'input_image' found using 'type' does not match any of the
    expected tags")."""
    c, _, _ = fake
    with pytest.raises(openai.BadRequestError) as e:
        c.post("/responses", body={"model": "m", "input": "Hi", **extra}, cast_to=object)
    assert e.value.body["param"] == param and e.value.body["message"].startswith(f"{param}: {says}")
    assert "Input tag" not in e.value.body["message"]


@pytest.mark.parametrize(
    "schema, problem",
    [
        ({"type": 5}, "not a valid JSON schema"),
        (
            {
                "type": "object",
                "properties": {"a": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}},
                "required": ["a"],
            },
            "`uniqueItems` cannot be enforced (at $.properties.a)",
        ),
    ],
)
def test_text_format_schema_errors_name_the_schema_field(fake, schema, problem):
    """The message names text.format.schema (the chat path's response_format.json_schema.schema)."""
    c, _, _ = fake
    with pytest.raises(openai.BadRequestError) as e:
        c.post(
            "/responses",
            body={
                "model": "m",
                "input": "Hi",
                "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}},
            },
            cast_to=object,
        )
    assert e.value.body["param"] == "text.format"
    assert e.value.body["message"].startswith("text.format.schema is ") and problem in e.value.body["message"]


def test_error_mid_stream_is_an_error_event_then_failed(tokenizer):
    from tokenizer_proc.errors import APIError

    client, _ = app_client(tokenizer, deltas(Delta(" Hel", 2), APIError("model execution failed", 500)))
    r = client.post("/v1/responses", json={"model": "m", "input": "Hi", "stream": True})
    events = sse_events(r.text)
    assert [name for name, _ in events][-2:] == ["error", "response.failed"]
    failed = json.loads(events[-1][1])["response"]
    assert failed["status"] == "failed" and "model execution failed" in failed["error"]["message"]
    error = ResponseError.model_validate(failed["error"])  # strict: code is one of the API's codes
    assert (error.code, error.type) == ("server_error", "server_error")


# ---------------------------------------------------------------- in-process: function calls and reasoning
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "strict": True,
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "array", "items": {"type": "integer"}}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def agent(tokenizer):
    client, manager = app_client(tokenizer, in_pieces(AGENT_OUTPUT), AGENT_PARSERS)
    return sdk(client), manager


def items(output) -> list[tuple]:
    return [(i.type, getattr(i, "name", None), getattr(i, "arguments", None), i.status) for i in output]


def test_reasoning_message_and_function_call_items_streamed_and_not(agent):
    c, manager = agent
    r = c.responses.create(model="m", input="Weather in Paris?", tools=[WEATHER])
    args = '{"city": "Paris", "days": [1, 2]}'
    assert items(r.output) == [
        ("reasoning", None, None, "completed"),
        ("message", None, None, "completed"),
        ("function_call", "get_weather", args, "completed"),
    ]
    assert r.output[0].content[0].text == "The user wants the weather." and r.output_text == "Let me check."
    assert r.output[2].call_id.startswith("call_") and "TagDispatch" in manager.sent[-1].grammar.text  # strict
    c.responses.create(model="m", input="Weather in Paris?", tools=[WEATHER], tool_choice="required")
    assert manager.sent[-1].grammar is not None  # required: forced by a grammar (then no reasoning comes)
    events = list(c.responses.create(model="m", input="Weather in Paris?", tools=[WEATHER], stream=True))
    types = [e.type for e in events]
    assert types[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert {
        "response.reasoning_text.delta",
        "response.output_text.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
    } <= set(types)
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == args
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert items(events[-1].response.output) == items(r.output)


def test_usage_counts_the_reasoning_tokens_streamed_and_not(agent, fake, tokenizer):
    """output_tokens_details.reasoning_tokens: the tokens through the one closing the think
    block (`AGENT_OUTPUT` in 7-character deltas, one token each: "<think>" ... "/think>" is
    6), not 0; 0 for an output without reasoning."""
    c, _ = agent
    r = c.responses.create(model="m", input="Weather in Paris?", tools=[WEATHER])
    events = list(c.responses.create(model="m", input="Weather in Paris?", tools=[WEATHER], stream=True))
    assert r.usage.output_tokens_details.reasoning_tokens == 6 < r.usage.output_tokens
    assert events[-1].response.usage == r.usage
    plain, _, _ = fake
    assert plain.responses.create(model="m", input="Hi").usage.output_tokens_details.reasoning_tokens == 0
    cut = sdk(
        app_client(tokenizer, deltas(Delta("<think>Hm", 2), Delta("m", 5, FinishReason.LENGTH)), AGENT_PARSERS)[0]
    )
    assert cut.responses.create(model="m", input="Hi").usage.output_tokens_details.reasoning_tokens == 5


@pytest.mark.parametrize("cut", [False, True])
def test_bodies_and_events_validate_strictly_against_the_sdk_models(tokenizer, cut):
    """Every body and event passes the SDK's pydantic models strictly (not only its lenient
    construct): its stream helper validates a lifecycle event against the event union, and a
    required field missing (usage's cache_write_tokens) made it take response.incomplete for
    another event and fail with "Lifecycle response identity changed"."""
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    script = (
        deltas(Delta("<think>Hm</think>Th", 5), Delta("ere", 8, FinishReason.LENGTH))
        if cut
        else in_pieces(AGENT_OUTPUT)
    )
    c = sdk(app_client(tokenizer, script, AGENT_PARSERS)[0])
    body = {"model": "m", "input": "Weather in Paris?", "tools": [WEATHER]}
    full = Response.model_validate(c.post("/responses", body=body, cast_to=object))
    assert full.status == ("incomplete" if cut else "completed")
    events = TypeAdapter(list[ResponseStreamEvent]).validate_python(
        [e.to_dict() for e in c.responses.create(**body, stream=True)]
    )
    assert events[-1].type == f"response.{full.status}" and events[-1].response.usage == full.usage


@pytest.mark.parametrize(
    "tools, param",
    [
        ([{"type": "function", "name": "f", "parameters": {"type": "string"}}], "tools.0.parameters"),
        ([WEATHER, {"type": "function", "name": "bad name!"}], "tools.1.name"),
    ],
)
def test_tool_errors_name_the_responses_field(agent, tools, param):
    c, _ = agent
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="m", input="Hi", tools=tools)
    assert e.value.body["param"] == param and e.value.body["message"].startswith(param), e.value.body


def test_a_delta_ending_a_call_and_holding_text_after_it(tokenizer):
    """The text after a call came in the same delta as the call's last argument text: it was
    put before the call's end, which became a second function_call item without call_id or
    name. Now: the call, then the message, streamed and not."""
    c = sdk(app_client(tokenizer, CALL_THEN_TEXT, AGENT_PARSERS)[0])
    r = c.responses.create(model="m", input="Weather?", tools=[WEATHER])
    assert items(r.output) == [
        ("function_call", "get_weather", '{"city": "Paris"}', "completed"),
        ("message", None, None, "completed"),
    ]
    assert r.output[0].call_id.startswith("call_") and r.output_text == "\nDone."
    events = list(c.responses.create(model="m", input="Weather?", tools=[WEATHER], stream=True))
    assert items(events[-1].response.output) == items(r.output)


@pytest.mark.parametrize(
    "arguments", ['{"city": "Pa', '{"city": "Paris", "days": oops}}\n</tool_call>'], ids=["cut-by-eos", "not-json"]
)
def test_a_call_whose_arguments_are_no_json_object_is_an_incomplete_item(tokenizer, arguments):
    """A call cut by EOS, or whose arguments are not JSON, was a function_call item with status
    completed (streamed and not) whose arguments an agent's json.loads refuses, while chat's
    finish_reason is stop for it, not tool_calls. Now the item is incomplete in both modes; a
    whole call after it stays completed."""
    call = '<tool_call>\n{"name": "get_weather", "arguments": '
    script = deltas(
        Delta(call + '{"city": "Lima"}}\n</tool_call>\n', 12), Delta(call + arguments, 20, FinishReason.STOP, IM_END)
    )
    client, _ = app_client(tokenizer, script, AGENT_PARSERS)
    c = sdk(client)
    cut = arguments.removesuffix("}\n</tool_call>")
    expected = [
        ("function_call", "get_weather", '{"city": "Lima"}', "completed"),
        ("function_call", "get_weather", cut, "incomplete"),
    ]
    r = c.responses.create(model="m", input="Weather?", tools=[WEATHER])
    assert r.status == "completed" and items(r.output) == expected
    events = [
        json.loads(d)
        for _, d in sse_events(
            client.post(
                "/v1/responses", json={"model": "m", "input": "Weather?", "tools": [WEATHER], "stream": True}
            ).text
        )
    ]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [(i["arguments"], i["status"]) for i in done] == [(a, s) for _, _, a, s in expected]
    assert items(openai.types.responses.Response.model_validate(events[-1]["response"]).output) == expected


def test_function_call_output_continues_the_conversation(agent, tokenizer):
    c, manager = agent
    first = c.responses.create(model="m", input="Weather in Paris?", tools=[WEATHER])
    call = first.output[2]
    c.responses.create(
        model="m",
        previous_response_id=first.id,
        tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18C"}],
    )
    stored = tokenizer.decode(manager.sent[-1].input_ids)
    assert (
        '<|im_start|>assistant\nLet me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris", "days": [1, 2]}}\n</tool_call><|im_end|>\n<|im_start|>tool\n18C<|im_end|>' in stored
    )
    # the same conversation sent back as items (reasoning items are accepted and left out)
    c.responses.create(
        model="m",
        tools=[WEATHER],
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            *[i.model_dump(exclude_none=True) for i in first.output],
            {"type": "function_call_output", "call_id": call.call_id, "output": "18C"},
        ],
    )
    assert tokenizer.decode(manager.sent[-1].input_ids) == stored


def test_a_call_cut_by_the_token_limit_can_be_sent_back(tokenizer):
    """A function_call item cut by max_output_tokens (status incomplete, its arguments the
    beginning of an object), sent back in input as this server answered it, continues the
    conversation as previous_response_id does, with the call's finished members: it was a 400
    ("input.1.arguments: is not valid JSON"), so an agent replaying its items stopped there."""
    cut = deltas(
        Delta('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1', 9, FinishReason.LENGTH)
    )
    client, manager = app_client(tokenizer, cut, AGENT_PARSERS)
    c = sdk(client)
    first = c.responses.create(model="m", input="Weather in Paris?", tools=[WEATHER], max_output_tokens=9)
    assert items(first.output) == [("function_call", "get_weather", '{"city": "Paris", "days": [1', "incomplete")]
    answer = {"type": "function_call_output", "call_id": first.output[0].call_id, "output": "18C"}
    stored, replayed = chained_and_replayed(c, manager, tokenizer, first, answer)
    assert '{"name": "get_weather", "arguments": {"city": "Paris", "days": []}}' in stored
    assert replayed == stored


def chained_and_replayed(c, manager, tokenizer, first, answer: dict) -> tuple[str, str]:
    """The prompts `answer` (an input item) gives after `first` (a response to "Weather in
    Paris?") sent by previous_response_id, and with `first`'s output items sent back whole."""
    c.responses.create(model="m", previous_response_id=first.id, tools=[WEATHER], input=[answer])
    chained = tokenizer.decode(manager.sent[-1].input_ids)
    c.responses.create(
        model="m",
        tools=[WEATHER],
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            *[i.model_dump(exclude_none=True) for i in first.output],
            answer,
        ],
    )
    return chained, tokenizer.decode(manager.sent[-1].input_ids)


NAMED_TOOL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}{{ ' name=' + m.name if m.name else '' }}\n"
    "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% endif %}"
)
"""A chat template that shows a message's name (as templates naming the function a tool result answers do)."""


def test_a_call_output_after_previous_response_id_names_its_function(tokenizer):
    """The function a function_call_output answers is found in the stored conversation too:
    the prompt is the one the same conversation sent whole gives."""
    named = copy.copy(tokenizer)
    named.chat_template = NAMED_TOOL_TEMPLATE
    client, manager = app_client(named, in_pieces(AGENT_OUTPUT), AGENT_PARSERS)
    c = sdk(client)
    first = c.responses.create(model="m", input="Weather in Paris?", tools=[WEATHER])
    result = {"type": "function_call_output", "call_id": first.output[2].call_id, "output": "18C"}
    chained, replayed = chained_and_replayed(c, manager, named, first, result)
    assert "<|im_start|>tool name=get_weather\n18C<|im_end|>" in chained
    assert replayed == chained


USER = {"role": "user", "content": "Weather in Paris?"}


def fc(call_id: str) -> dict:
    """A function_call item calling get_weather under `call_id`."""
    return {"type": "function_call", "call_id": call_id, "name": "get_weather", "arguments": '{"city": "Paris"}'}


def fco(call_id: str) -> dict:
    """A function_call_output item answering `call_id`."""
    return {"type": "function_call_output", "call_id": call_id, "output": "18C"}


@pytest.mark.parametrize(
    "chained,given,param,says",
    [
        (False, [USER, fco("c1")], "input.1.call_id", "'c1' answers no tool call"),
        (False, [USER, fc("c1"), fco("c2")], "input.2.call_id", "'c2' answers no tool call"),
        (False, [USER, fc("c1"), USER], "input.1", "no function_call_output answering it before input.2"),
        (False, [USER, fc("c1"), fc("c2"), fco("c2")], "input.1", "at the end of the conversation"),
        (True, "Thanks!", "previous_response_id", "before input:"),
        (True, [USER], "previous_response_id", "before input.0"),
        (True, [fco("c9")], "input.0.call_id", "'c9' answers no tool call"),
        (False, [USER, fc("c1"), fc("c1"), fco("c1")], "input.2", "'c1' is used twice (first at input.1)"),
    ],
    ids=[
        "no-call",
        "other-id",
        "then-user",
        "one-unanswered",
        "chained-text",
        "chained-message",
        "chained-other-id",
        "same-id-twice",
    ],
)
def test_outputs_that_do_not_pair_with_calls_are_400(agent, chained, given, param, says):
    """As OpenAI's API ("No tool call found for function call output", "No tool output found for
    function call"): a function_call_output must answer a call made before it, in the input or
    the response previous_response_id names, and each call needs its output before the next
    message of another role than the assistant. They were rendered as sent: an output under an
    unknown call_id read as the answer to the last call, a call with no output followed by the
    user's next message."""
    c, manager = agent
    extra = (
        {"previous_response_id": c.responses.create(model="m", input="Weather?", tools=[WEATHER]).id} if chained else {}
    )
    sent = len(manager.sent)
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model="m", input=given, tools=[WEATHER], **extra)
    body = e.value.body
    assert body["param"] == param and body["message"].startswith(param) and says in body["message"], body
    assert len(manager.sent) == sent


def test_outputs_that_answer_each_call_are_served(tokenizer):
    """This server's own output sent back (a call, then text after it, then the call's output),
    outputs in another order than the calls, and a conversation ending with a call are served."""
    c = sdk(app_client(tokenizer, CALL_THEN_TEXT, AGENT_PARSERS)[0])
    first = c.responses.create(model="m", input=[USER], tools=[WEATHER])
    call = first.output[0].call_id
    replayed = [USER, *[i.model_dump(exclude_none=True) for i in first.output], fco(call)]
    for given in (replayed, [USER, fc("c1"), fc("c2"), fco("c2"), fco("c1"), USER], [USER, fc("c1")]):
        assert c.responses.create(model="m", input=given, tools=[WEATHER]).status == "completed"
    assert (
        c.responses.create(model="m", previous_response_id=first.id, input=[fco(call)], tools=[WEATHER]).status
        == "completed"
    )


@pytest.mark.parametrize("stream", [False, True])
def test_sdk_tool_runner_completes_a_call_and_its_answer(tokenizer, stream):
    """The SDK's ResponsesToolRunner asks for ``include: ["reasoning.encrypted_content"]`` and
    sends the output items back with the call's output: both turns are served."""
    from openai.lib.responses_tool_runner import RegisteredFunction, ResponsesToolRunner

    call = in_pieces('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    answer = in_pieces("It is sunny.")
    client, manager = app_client(
        tokenizer, lambda req: (answer if "sunny" in tokenizer.decode(req.input_ids) else call)(req), AGENT_PARSERS
    )
    ran = []
    runner = ResponsesToolRunner(functions=[RegisteredFunction(WEATHER, lambda args: ran.append(args) or "sunny")])
    r = runner.run(sdk(client), {"model": "m", "input": "Weather in Paris?", "max_output_tokens": 64}, stream=stream)
    assert (r.status, r.output_text, ran, len(manager.sent)) == ("completed", "It is sunny.", [{"city": "Paris"}], 2)


def test_functions_are_strict_unless_they_say_not(agent):
    """As in OpenAI's Responses API, ``strict`` defaults to true: the arguments are enforced
    under ``auto`` too (`tools.grammar.auto_calls`); ``strict: false`` leaves them free."""
    c, manager = agent
    default = {k: v for k, v in WEATHER.items() if k != "strict"}
    c.responses.create(model="m", input="Weather in Paris?", tools=[default])
    grammar = manager.sent[-1].grammar
    assert grammar.kind == GrammarKind.EBNF and "TagDispatch" in grammar.text and "get_weather" in grammar.text
    prompt = manager.sent[-1].input_ids
    c.responses.create(model="m", input="Weather in Paris?", tools=[{**default, "strict": False}])
    assert manager.sent[-1].grammar is None and manager.sent[-1].input_ids == prompt  # strict is not shown
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(
            model="m",
            input="Hi",
            tools=[{**default, "parameters": {"type": "object", "properties": {"city": {"not": {"type": "string"}}}}}],
        )
    assert e.value.body["param"] == "tools.0.parameters" and "not" in e.value.body["message"], e.value.body
