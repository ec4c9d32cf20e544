"""Strict request validation (issue 14, hostile and malformed input): known fields this
server does not implement are a 400 naming the field, the allow-listed no-op fields are
accepted with the values that change nothing, other top-level fields are ignored (case V3),
unknown keys of nested native objects are a 400, and the token limits (prompt and
max_tokens against the context) are 400s naming the field. The app runs in-process against
the fake manager of `tests.support.fake_app`; nothing reaches it for a refused request."""

from __future__ import annotations

import json

import pytest

from tests.support.fake_app import CHAT, IM_END, VOCAB, client_for
from tokenizer_proc.native.convert import NATIVE_MAX_NEW_TOKENS
from tokenizer_proc.native.convert import REFUSED as NATIVE_REFUSED
from tokenizer_proc.openai.convert import COMPLETION_MAX_TOKENS
from tokenizer_proc.request.unsupported import CHAT as CHAT_REFUSED
from tokenizer_proc.request.unsupported import COMPLETION as COMPLETION_REFUSED
from tokenizer_proc.request.unsupported import MESSAGE as MESSAGE_REFUSED
from tokenizer_proc.request.unsupported import RESPONSES as RESPONSES_REFUSED

COMPLETION = {"prompt": "Hi", "max_tokens": 8}
NATIVE = {"text": "Hi", "sampling_params": {"max_new_tokens": 8}}
CONTEXT = 8192
"""The context length of `tests.support.fake_app`'s builder."""
ASKING = {"x": 1}
"""A value no refused field accepts."""

ROUTES = {
    "/v1/chat/completions": (CHAT, CHAT_REFUSED),
    "/v1/completions": (COMPLETION, COMPLETION_REFUSED),
    "/generate": (NATIVE, NATIVE_REFUSED),
}
REFUSED = [(path, field) for path, (_, table) in ROUTES.items() for field in table]
ACCEPTED = [
    (path, field, value)
    for path, (_, table) in ROUTES.items()
    for field, r in table.items()
    for value in (None, *r.accepts)
]


def assert_400(r, param: str) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and param in err["message"], err


@pytest.mark.parametrize("path,field", REFUSED, ids=[f"{p}-{f}" for p, f in REFUSED])
def test_unimplemented_field_is_400_naming_it(builder, path, field):
    client, manager = client_for(builder)
    base, _ = ROUTES[path]
    for stream in (False, True):
        assert_400(client.post(path, json={**base, field: ASKING, "stream": stream}), field)
    assert manager.sent == []


@pytest.mark.parametrize(
    "field,value",
    [
        ("regex", "[0-9]+"),
        ("json_schema", '{"type": "integer"}'),
        ("max_new_tokens", 2),
        ("temperature", 0),
        ("stop", ["."]),
        ("custom_params", {"x": 1}),
    ],
)
def test_native_sampling_params_at_the_top_level_are_400(builder, field, value):
    """SGLang's sampling fields belong in sampling_params; at the top level they were
    ignored (a regex gave unconstrained text, max_new_tokens the default 128)."""
    client, manager = client_for(builder)
    r = client.post("/generate", json={"text": "Hi", field: value})
    assert_400(r, field)
    message = r.json()["error"]["message"]
    assert "inside sampling_params" in message and manager.sent == []
    assert (
        "not supported" not in message
    )  # it is supported, in sampling_params (it said "not supported by this server")


@pytest.mark.parametrize(
    "path,field,value,says",
    [
        (
            "/v1/chat/completions",
            "system",
            "Answer in French.",
            "system is not a field of this route: put it in a system message (system is the Anthropic API's field)",
        ),
        (
            "/v1/chat/completions",
            "max_new_tokens",
            2,
            "max_new_tokens is not a field of this route: use max_tokens (max_new_tokens is /generate's",
        ),
        ("/v1/chat/completions", "stop_sequences", ["."], "use stop"),
        ("/v1/chat/completions", "enable_thinking", False, "use chat_template_kwargs"),
        ("/v1/completions", "messages", [{"role": "user", "content": "Hi"}], "use chat completions"),
        (
            "/v1/completions",
            "max_output_tokens",
            2,
            "is not a field of this route: use max_tokens (max_output_tokens is the Responses API's name)",
        ),
        ("/generate", "max_tokens", 4, "max_tokens is not a field of this route: use sampling_params.max_new_tokens"),
        ("/generate", "prompt", "Hello", "use text, or input_ids for token ids"),
    ],
    ids=[
        "chat-system",
        "chat-max_new_tokens",
        "chat-stop_sequences",
        "chat-enable_thinking",
        "completions-messages",
        "completions-max_output_tokens",
        "native-max_tokens",
        "native-prompt",
    ],
)
def test_other_apis_fields_are_400_naming_their_api(builder, path, field, value, says):
    """A field of another of this server's APIs, sent to a route that does not read it, is a
    400 naming the API it belongs to and what to use here. Each was dropped: chat without the
    system prompt or generating up to the whole context (max_new_tokens), completions without
    the messages, /generate with the default 128 tokens."""
    client, manager = client_for(builder)
    base, _ = ROUTES[path]
    r = client.post(path, json={**base, field: value})
    assert_400(r, field)
    assert says in r.json()["error"]["message"], r.json()
    assert manager.sent == []


@pytest.mark.parametrize("path,field,value", ACCEPTED, ids=[f"{p}-{f}-{v!r}" for p, f, v in ACCEPTED])
def test_unimplemented_field_with_a_value_that_asks_nothing_is_accepted(builder, path, field, value):
    """null, and the values that ask for what the server does anyway (functions [],
    function_call "none", echo false on chat, suffix "", use_beam_search false, ...)."""
    client, manager = client_for(builder)
    base, _ = ROUTES[path]
    r = client.post(path, json={**base, field: value})
    assert r.status_code == 200, r.text
    assert len(manager.sent) == 1


CHAT_ONLY = [
    ("top_logprobs", 2),
    ("tools", [{"type": "function", "function": {"name": "f"}}]),
    ("tool_choice", "required"),
    ("functions", [{"name": "f"}]),
    ("function_call", "auto"),
    ("reasoning_effort", "high"),
    ("chat_template_kwargs", {"enable_thinking": False}),
    ("audio", {"voice": "alloy", "format": "wav"}),
    ("modalities", ["text", "audio"]),
    ("prediction", {"type": "content", "content": "x"}),
    ("web_search_options", {}),
    ("verbosity", "low"),
    ("service_tier", "flex"),
    ("moderation", {"model": "omni-moderation-latest"}),
    ("thinking_budget", 64),
]


@pytest.mark.parametrize("field,value", CHAT_ONLY, ids=[f for f, _ in CHAT_ONLY])
def test_chat_fields_sent_to_completions_are_400(builder, field, value):
    """Chat fields that would change the answer are refused by completions, which would
    otherwise drop them as unknown (top_logprobs gave no logprobs, tools no calls; audio,
    modalities ["audio"], prediction, web_search_options, verbosity, service_tier "flex",
    moderation and thinking_budget were answered with text, as if asked for nothing)."""
    client, manager = client_for(builder)
    assert_400(client.post("/v1/completions", json={**COMPLETION, field: value}), field)
    assert manager.sent == []


OTHER_ROUTES_FIELDS = [
    ("/v1/chat/completions", "max_output_tokens", 3, "use max_tokens"),
    ("/v1/chat/completions", "max_new_tokens", 3, "use max_tokens"),
    ("/v1/chat/completions", "stop_sequences", ["5"], "use stop"),
    ("/v1/chat/completions", "system", "Be brief.", "system message"),
    ("/v1/chat/completions", "instructions", "Be brief.", "system message"),
    ("/v1/chat/completions", "input", "Hi", "use messages"),
    ("/v1/chat/completions", "text", {"format": {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", "output_config", {"format": {"type": "json_schema", "schema": {}}}, "response_format"),
    ("/v1/chat/completions", "thinking", {"type": "enabled", "budget_tokens": 8}, "thinking_token_budget"),
    ("/v1/chat/completions", "sampling_params", {"max_new_tokens": 3}, "top-level"),
    ("/v1/completions", "max_output_tokens", 3, "use max_tokens"),
    ("/v1/completions", "min_new_tokens", 3, "use min_tokens"),
    ("/v1/completions", "stop_sequences", ["5"], "use stop"),
    ("/v1/completions", "messages", [{"role": "user", "content": "Hi"}], "chat completions"),
    ("/v1/completions", "system", "Be brief.", "in the prompt"),
    ("/v1/completions", "input_ids", [1, 2], "use prompt"),
    ("/v1/responses", "max_new_tokens", 3, "use max_output_tokens"),
    ("/v1/responses", "stop_sequences", ["5"], "chat completions"),
    ("/v1/responses", "system", "Be brief.", "use instructions"),
    ("/v1/responses", "output_config", {"format": {"type": "json_schema", "schema": {}}}, "use text.format"),
    ("/v1/responses", "thinking", {"type": "enabled", "budget_tokens": 8}, "use thinking_token_budget"),
    ("/v1/responses", "sampling_params", {"max_new_tokens": 3}, "top-level"),
    ("/v1/responses", "input_ids", [1, 2], "use input"),
    ("/generate", "max_tokens", 3, "sampling_params.max_new_tokens"),
    ("/generate", "max_completion_tokens", 3, "sampling_params.max_new_tokens"),
    ("/generate", "max_output_tokens", 3, "sampling_params.max_new_tokens"),
    ("/generate", "min_tokens", 3, "sampling_params.min_new_tokens"),
    ("/generate", "stop_sequences", ["5"], "sampling_params.stop"),
    ("/generate", "response_format", {"type": "json_object"}, "sampling_params.json_schema"),
    ("/generate", "stream_options", {"include_usage": True}, "meta_info carries the token counts"),
    ("/generate", "messages", [{"role": "user", "content": "Hi"}], "/v1/chat/completions"),
    ("/generate", "prompt", "Hi", "use text"),
    ("/generate", "input", "Hi", "use text"),
    ("/generate", "system", "Be brief.", "in text"),
]
BASES = {**{path: base for path, (base, _) in ROUTES.items()}, "/v1/responses": {"input": "Hi"}}


@pytest.mark.parametrize(
    "path,field,value,says", OTHER_ROUTES_FIELDS, ids=[f"{p}-{f}" for p, f, _, _ in OTHER_ROUTES_FIELDS]
)
def test_another_routes_name_for_a_field_is_400_saying_this_routes_name(builder, path, field, value, says):
    """The fields of this server's other routes (OpenAI's, Anthropic's, /generate's) sent to
    a route that names them otherwise were dropped as unknown: stop_sequences did not stop,
    max_output_tokens, max_new_tokens or max_tokens left the budget at the whole context (or
    /generate's 128), system or instructions were no system prompt, text, output_config or
    response_format no format. Each is now a 400 naming the field and saying what this route
    takes instead; an empty stop_sequences asks for nothing."""
    client, manager = client_for(builder)
    base = BASES[path]
    r = client.post(path, json={**base, field: value})
    assert_400(r, field)
    message = r.json()["error"]["message"]
    assert says in message and "not a field of this route" in message, message
    assert manager.sent == []
    assert client.post(path, json={**base, "stop_sequences": []}).status_code == 200


RESPONSES_CHAT_ONLY = [
    ("max_tokens", 3),
    ("max_completion_tokens", 3),
    ("messages", [{"role": "user", "content": "x"}]),
    ("response_format", {"type": "json_object"}),
    ("n", 2),
    ("stop", ["."]),
    ("seed", 1),
    ("frequency_penalty", 1.0),
    ("presence_penalty", 1.0),
    ("logit_bias", {"5": 10}),
    ("logprobs", True),
    ("top_k", 5),
    ("min_p", 0.5),
    ("repetition_penalty", 1.3),
    ("min_tokens", 8),
    ("best_of", 2),
    ("stop_token_ids", [5]),
    ("ignore_eos", True),
    ("custom_logit_processor", "x"),
    ("custom_params", {"a": 1}),
    ("guided_json", {}),
    ("regex", "a+"),
]


@pytest.mark.parametrize("field,value", RESPONSES_CHAT_ONLY, ids=[f for f, _ in RESPONSES_CHAT_ONLY])
def test_chat_fields_sent_to_responses_are_400(builder, field, value):
    """Chat fields that would change the answer are refused by the Responses route, which
    would otherwise drop them as unknown (max_tokens left the length unbounded, seed and
    stop did nothing); a value that asks for nothing passes."""
    client, manager = client_for(builder)
    body = {"model": "m", "input": "Hi", "max_output_tokens": 4}
    assert_400(client.post("/v1/responses", json={**body, field: value}), field)
    assert manager.sent == []
    for nothing in RESPONSES_REFUSED[field].accepts:
        assert client.post("/v1/responses", json={**body, field: nothing}).status_code == 200


@pytest.mark.parametrize("part", [{"type": "text"}, {"type": "text", "text": None}, {"type": "text", "text": 5}])
def test_text_part_without_text_is_400_naming_its_text(builder, part):
    """A text part whose text is missing or not a string is named as such (it was once told
    "this model takes text only", about a text part)."""
    client, manager = client_for(builder)
    messages = [{"role": "user", "content": [{"type": "text", "text": "Hi"}, part]}]
    r = client.post("/v1/chat/completions", json={**CHAT, "messages": messages})
    assert_400(r, "messages.0.content.1.text")
    assert "text only" not in r.json()["error"]["message"]
    assert manager.sent == []


@pytest.mark.parametrize(
    "arguments,says",
    [("{not json", "is not valid JSON"), ('{"a": ' + "[" * 5000 + "]" * 5000 + "}", "nests too deeply")],
    ids=["not-json", "too-deep"],
)
def test_earlier_call_arguments_that_cannot_be_read_say_why(builder, arguments, says):
    """An assistant turn's call arguments that are not JSON, or nest too deeply to decode
    (they were called "not valid JSON"), are a 400 naming them and why."""
    client, manager = client_for(builder)
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    r = client.post("/v1/chat/completions", json={**CHAT, "messages": messages})
    assert_400(r, "messages.1.tool_calls.0.function.arguments")
    assert says in r.json()["error"]["message"]
    assert manager.sent == []


@pytest.mark.parametrize(
    "arguments,read",
    [('{"city": "Par', "{}"), ('{"city": "Paris", "days": 12', '{"city": "Paris"}'), ("", "{}"), ("{\n ", "{}")],
    ids=["string", "number", "empty", "open"],
)
def test_earlier_call_arguments_cut_by_the_token_limit_are_their_finished_members(builder, arguments, read):
    """Arguments this server answered for a call cut by max_tokens (the beginning of a JSON
    object), sent back in the next turn of an agent loop, were a 400 ("is not valid JSON"): they
    are read as the object's finished members, the prompt of the same turn with those."""
    client, manager = client_for(builder)

    def turn(args: str) -> list:
        call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}
        return [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ]

    assert client.post("/v1/chat/completions", json={**CHAT, "messages": turn(arguments)}).status_code == 200
    assert client.post("/v1/chat/completions", json={**CHAT, "messages": turn(read)}).status_code == 200
    cut, whole = manager.sent
    assert cut.input_ids == whole.input_ids


REFUSAL = "I can't help with that."


@pytest.mark.parametrize(
    "turn",
    [{"content": None, "refusal": REFUSAL}, {"content": [{"type": "refusal", "refusal": REFUSAL}]}],
    ids=["field", "part"],
)
def test_an_assistant_refusal_is_text_it_wrote(builder, turn):
    """An assistant turn as OpenAI answers a refusal (``refusal`` set, content null; or a
    refusal part) is that text in the prompt: the field was dropped (an empty turn) and the
    part was a 400 saying the model takes text only."""
    client, manager = client_for(builder)

    def conversation(assistant: dict) -> list:
        return [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", **assistant},
            {"role": "user", "content": "Why?"},
        ]

    assert client.post("/v1/chat/completions", json={**CHAT, "messages": conversation(turn)}).status_code == 200
    assert (
        client.post("/v1/chat/completions", json={**CHAT, "messages": conversation({"content": REFUSAL})}).status_code
        == 200
    )
    refused, written = manager.sent
    assert refused.input_ids == written.input_ids


def test_an_empty_refusal_adds_nothing(builder):
    """``refusal: ""`` beside the content (clients that send every field of OpenAI's message
    type) put a newline after the assistant's text."""
    client, manager = client_for(builder)
    for assistant in ({"content": "Hello", "refusal": ""}, {"content": "Hello"}):
        messages = [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", **assistant},
            {"role": "user", "content": "Why?"},
        ]
        assert client.post("/v1/chat/completions", json={**CHAT, "messages": messages}).status_code == 200
    with_empty, without = manager.sent
    assert with_empty.input_ids == without.input_ids


@pytest.mark.parametrize(
    "message, param",
    [
        ({"role": "user", "content": "Hi", "refusal": REFUSAL}, "messages.0.refusal"),
        ({"role": "user", "content": [{"type": "refusal", "refusal": REFUSAL}]}, "messages.0.content.0"),
        ({"role": "assistant", "content": [{"type": "refusal"}]}, "messages.0.content.0.refusal"),
    ],
)
def test_a_refusal_outside_an_assistant_turn_or_without_text_is_400(builder, message, param):
    client, manager = client_for(builder)
    assert_400(client.post("/v1/chat/completions", json={**CHAT, "messages": [message]}), param)
    assert manager.sent == []


@pytest.mark.parametrize("field", list(MESSAGE_REFUSED))
def test_message_function_call_and_audio_are_400(builder, field):
    client, manager = client_for(builder)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yes", field: ASKING}]
    assert_400(client.post("/v1/chat/completions", json={**CHAT, "messages": messages}), f"messages.1.{field}")
    assert manager.sent == []


@pytest.mark.parametrize("rid", ["", "a\nb", "\u0000", "x" * 257, ["ok", "tab\there"]])
def test_a_client_request_id_with_control_characters_or_too_long_is_400(builder, rid):
    """A native ``rid`` is echoed as ``meta_info.id`` and written to the logs: a newline in it
    forged log lines in the console format, so it is 1 to 256 characters, no control one."""
    client, manager = client_for(builder)
    text = ["a", "b"] if isinstance(rid, list) else "a"
    r = client.post("/generate", json={"text": text, "rid": rid, "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 400 and r.json()["error"]["param"].startswith("rid"), r.text
    assert "none of them a control character" in r.json()["error"]["message"]
    assert manager.sent == []


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/completions", {"prompt": "PROMPT", "max_tokens": 2}, "prompt"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "PROMPT"}], "max_tokens": 2}, "messages"),
        ("/generate", {"text": "PROMPT"}, "text"),
        (
            "/v1/messages",
            {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "PROMPT"}]},
            "messages",
        ),
    ],
)
def test_a_prompt_far_past_the_context_is_refused_from_its_head(builder, monkeypatch, path, body, param):
    """A prompt of millions of characters was tokenized whole (a 14 MB one: 21-45 s of CPU,
    2 GB of memory) before the context check refused it: now its head is tokenized, and the
    head alone being past the context is the 400. Text under the head's length is tokenized
    whole, as before."""
    client, manager = client_for(builder)
    encoded = []
    encode = builder.tok.encode
    monkeypatch.setattr(builder.tok, "encode", lambda text, **kw: encoded.append(len(text)) or encode(text, **kw))
    huge = "the quick brown fox jumps over the lazy dog " * 200_000  # 9 MB, 8192 * 32 characters in the head
    r = client.post(path, json=json.loads(json.dumps(body).replace("PROMPT", huge)))
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text[:300]
    assert (
        "is longer than the context length of 8192 tokens: its first 262144 characters alone are"
        in r.json()["error"]["message"]
    )
    assert max(encoded) <= 8192 * 32 and manager.sent == []


def test_a_legacy_function_message_is_400_saying_what_to_send_instead(builder):
    client, manager = client_for(builder)
    messages = [{"role": "user", "content": "Hi"}, {"role": "function", "name": "f", "content": "42"}]
    r = client.post("/v1/chat/completions", json={**CHAT, "messages": messages})
    assert_400(r, "messages.1.role")
    assert "legacy function calling" in r.json()["error"]["message"] and "role 'tool'" in r.json()["error"]["message"]
    assert manager.sent == []


@pytest.mark.parametrize("mark", ["prefix", "partial"])
def test_vendor_prefill_marks_on_a_message_are_400_pointing_at_continue_final_message(builder, mark):
    """DeepSeek's ``prefix: true`` and Moonshot's ``partial: true`` on the last assistant
    message ask to continue it; they were dropped, so the model began a new assistant turn.
    false asks for nothing and is served."""
    client, manager = client_for(builder)
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "The answer is", mark: True}]
    r = client.post("/v1/chat/completions", json={**CHAT, "messages": messages})
    assert_400(r, f"messages.1.{mark}")
    assert "continue_final_message: true" in r.json()["error"]["message"] and manager.sent == []
    messages[1][mark] = False
    assert client.post("/v1/chat/completions", json={**CHAT, "messages": messages}).status_code == 200


ALLOWED = [
    ("user", "user-42"),
    ("metadata", {"team": "a", "k" * 64: "v" * 512}),
    ("store", False),
    ("store", True),
    ("service_tier", "auto"),
    ("service_tier", "default"),
    ("modalities", ["text"]),
    ("prompt_cache_key", "p1"),
    ("prompt_cache_retention", "24h"),
    ("safety_identifier", "h-1"),
    ("prompt_cache_options", {"mode": "explicit", "ttl": "30m", "prewarm": False}),
    ("some_vendor_field", 1),
    ("priority", 3),
    ("best_of", 1),
]


@pytest.mark.parametrize("field,value", ALLOWED, ids=[f for f, _ in ALLOWED])
def test_allow_listed_and_unknown_top_level_fields_change_nothing(builder, field, value):
    """The allow-list (no-op OpenAI fields) and an unknown vendor field (V3): a 200 whose
    request is the one sent without the field."""
    client, manager = client_for(builder)
    plain = client.post("/v1/chat/completions", json=CHAT)
    r = client.post("/v1/chat/completions", json={**CHAT, field: value})
    assert r.status_code == 200, r.text
    assert r.json()["choices"] == plain.json()["choices"]
    first, second = manager.sent
    assert (second.input_ids, second.max_new_tokens, second.sampling, second.detok) == (
        first.input_ids,
        first.max_new_tokens,
        first.sampling,
        first.detok,
    )


BAD_VALUES = [
    ("/v1/chat/completions", {**CHAT, "service_tier": "flex"}, "service_tier"),
    ("/v1/chat/completions", {**CHAT, "modalities": ["text", "audio"]}, "modalities.1"),
    ("/v1/chat/completions", {**CHAT, "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ("/v1/chat/completions", {**CHAT, "metadata": {"k": "v" * 513}}, "metadata.k"),
    ("/v1/chat/completions", {**CHAT, "metadata": {"k": 1}}, "metadata.k"),
    ("/v1/chat/completions", {**CHAT, "store": "yes"}, "store"),
    ("/v1/chat/completions", {**CHAT, "user": 7}, "user"),
    ("/v1/chat/completions", {**CHAT, "best_of": 2}, "best_of"),
    ("/v1/chat/completions", {**CHAT, "prompt_cache_options": {"mode": "always"}}, "prompt_cache_options.mode"),
    ("/v1/chat/completions", {**CHAT, "prompt_cache_options": {"ttl": "1h"}}, "prompt_cache_options.ttl"),
    ("/v1/chat/completions", {**CHAT, "prompt_cache_options": {"prewarm": True}}, "prompt_cache_options.prewarm"),
    ("/v1/chat/completions", {**CHAT, "prompt_cache_options": {"x": 1}}, "prompt_cache_options.x"),
    (
        "/v1/chat/completions",
        {**CHAT, "stream": True, "stream_options": {"continuous_usage_stats": 1}},
        "stream_options.continuous_usage_stats",
    ),
    (
        "/v1/completions",
        {**COMPLETION, "stream": True, "stream_options": {"include_usage": True, "x": 1}},
        "stream_options.x",
    ),
    ("/v1/chat/completions", {**CHAT, "stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/completions", {**COMPLETION, "stream": False, "stream_options": {}}, "stream_options"),
    # one rule on every route that streams: the Responses route took stream_options without stream
    (
        "/v1/responses",
        {"model": "m", "input": "Hi", "stream_options": {"include_obfuscation": False}},
        "stream_options",
    ),
    ("/v1/responses", {"model": "m", "input": "Hi", "stream": False, "stream_options": {}}, "stream_options"),
    ("/generate", {"text": "Hi", "sampling_params": {"max_tokens": 4}}, "sampling_params.max_tokens"),
    ("/generate", {"text": "Hi", "sampling_params": {"stop_regex": "a"}}, "sampling_params.stop_regex"),
    ("/generate", {"input_ids": []}, "input_ids"),
    ("/generate", {"text": ""}, "text"),
]


@pytest.mark.parametrize("path,body,param", BAD_VALUES, ids=[p for _, _, p in BAD_VALUES])
def test_bad_values_and_unknown_nested_keys_are_400(builder, path, body, param):
    client, manager = client_for(builder)
    assert_400(client.post(path, json=body), param)
    assert manager.sent == []


def test_stream_options_need_stream_on_every_route_alike(builder):
    """One rule (`request.fields.Streamed`): the same 400 on chat, completions and Responses
    (the Responses route answered 200, not streaming); with stream true, accepted."""
    client, manager = client_for(builder)
    errors = []
    for path, body in (
        ("/v1/chat/completions", CHAT),
        ("/v1/completions", COMPLETION),
        ("/v1/responses", {"model": "m", "input": "Hi", "max_output_tokens": 4}),
    ):
        r = client.post(path, json={**body, "stream_options": {}})
        assert r.status_code == 400, (path, r.text)
        errors.append(r.json()["error"])
        assert client.post(path, json={**body, "stream": True, "stream_options": {}}).status_code == 200
    assert (
        errors
        == [
            {
                "message": "stream_options: only allowed when stream is true",
                "type": "invalid_request_error",
                "param": "stream_options",
                "code": 400,
            }
        ]
        * 3
    )
    assert len(manager.sent) == 3  # the streamed ones


EMPTY_STOPS = [
    ("/v1/chat/completions", {**CHAT, "stop": ""}, "stop"),
    ("/v1/chat/completions", {**CHAT, "stop": ["END", ""]}, "stop"),
    ("/v1/completions", {**COMPLETION, "stop": [""]}, "stop"),
    ("/generate", {"text": "Hi", "sampling_params": {"stop": ""}}, "sampling_params.stop"),
    (
        "/v1/messages",
        {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}], "stop_sequences": ["x", ""]},
        "stop_sequences",
    ),
]


@pytest.mark.parametrize("path,body,param", EMPTY_STOPS, ids=[f"{p}-{param}" for p, _, param in EMPTY_STOPS])
def test_empty_stop_string_is_400(builder, path, body, param):
    """An empty stop string would match before any text; it was silently dropped once."""
    client, manager = client_for(builder)
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and "empty" in err["message"], err
    assert manager.sent == []
    stop = client.get("/openapi.json").json()["components"]["schemas"]["ChatCompletionRequest"]["properties"]["stop"]
    assert stop["anyOf"][0]["minLength"] == 1 and stop["anyOf"][1]["items"]["minLength"] == 1


UNREADABLE = [
    (b"", "the request body is empty"),
    (b'{"prompt": "Hi", "max_tokens": ', "not valid JSON: Expecting value at character 31"),
    (b'{"prompt": "\xff\xfe", "max_tokens": 2}', "not valid JSON: it is not UTF-8"),
    (b'{"prompt": "Hi", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}", "not valid JSON: it nests too deeply"),
    (b'{"prompt": "Hi", "max_tokens": 1' + b"0" * 5000 + b"}", "it has an integer of more than 4300 digits"),
]


@pytest.mark.parametrize("path", list(ROUTES) + ["/v1/messages", "/v1/responses"])
@pytest.mark.parametrize("raw,says", UNREADABLE, ids=["empty", "truncated", "not-utf8", "too-deep", "long-int"])
def test_unreadable_body_says_why(builder, path, raw, says):
    """A body that cannot be read as JSON is a 400 saying why (FastAPI's own words were
    "There was an error parsing the body", or "Field required" for an empty body)."""
    client, manager = client_for(builder)
    r = client.post(path, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert says in r.json()["error"]["message"], r.json()
    assert manager.sent == []


CHECKED = [
    ("/v1/completions", '{"prompt": "Hi \\ud800", "max_tokens": 2}', "prompt"),
    ("/v1/completions", '{"prompt": "Hi", "stop": ["a", "\\udc00"]}', "stop.1"),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\ud83d"}]}', "messages.0.content"),
    ("/generate", '{"text": "Hi", "sampling_params": {"stop": "\\ud800"}}', "sampling_params.stop"),
    (
        "/v1/messages",
        '{"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "\\ud800"}]}',
        "messages.0.content",
    ),
    (
        "/v1/completions",
        '{"prompt": "Hi", "stop": ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", '
        '"n", "o", "p", "q"]}',
        "stop",
    ),
]


@pytest.mark.parametrize("path,raw,param", CHECKED, ids=[p for _, _, p in CHECKED])
def test_checks_of_the_models_name_their_field(builder, path, raw, param):
    """The models' own checks (unpaired surrogates anywhere, stop lists) name the field as
    param, and their text comes without pydantic's "Value error, " (param was null for a
    surrogate)."""
    client, manager = client_for(builder)
    r = client.post(path, content=raw.encode(), headers={"content-type": "application/json"})
    assert_400(r, param)
    assert "Value error" not in r.json()["error"]["message"]
    assert manager.sent == []


@pytest.mark.parametrize(
    "path,body,param",
    [
        ("/v1/completions", {**COMPLETION, "min_tokens": 2, "stop_token_ids": list(range(VOCAB))}, "min_tokens"),
        (
            "/v1/completions",
            {**COMPLETION, "min_tokens": 2, "stop_token_ids": list(range(VOCAB)), "ignore_eos": True},
            "min_tokens",
        ),
        (
            "/generate",
            {
                "text": "Hi",
                "sampling_params": {
                    "max_new_tokens": 4,
                    "min_new_tokens": 1,
                    "stop_token_ids": [t for t in range(VOCAB) if t != IM_END],
                },
            },
            "sampling_params.min_new_tokens",
        ),
    ],
    ids=["all-stop-ids", "all-stop-ids-ignore-eos", "stop-ids-and-eos"],
)
def test_min_tokens_that_would_mask_every_token_is_400(builder, path, body, param):
    """min_tokens masks EOS and the stop_token_ids; when they are the whole vocabulary nothing
    is left to sample (such a request once ended at its first token, on a masked stop token)."""
    client, manager = client_for(builder)
    r = client.post(path, json=body)
    assert_400(r, param)
    assert "nothing would be left to sample" in r.json()["error"]["message"]
    assert manager.sent == []
    one_left = {**COMPLETION, "min_tokens": 2, "stop_token_ids": list(range(1, VOCAB)), "ignore_eos": True}
    assert client.post("/v1/completions", json=one_left).status_code == 200


# ---------------------------------------------------------------- token limits
LIMITS = [
    ("/v1/completions", {"prompt": [5] * CONTEXT}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a " * CONTEXT}]}, "messages"),
    ("/generate", {"input_ids": [5] * CONTEXT}, "input_ids"),
    ("/generate", {"text": "a " * CONTEXT}, "text"),
    ("/v1/completions", {"prompt": [5] * 100, "max_tokens": CONTEXT - 99}, "max_tokens"),
    ("/v1/chat/completions", {"messages": CHAT["messages"], "max_completion_tokens": CONTEXT}, "max_completion_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": -1}, "max_tokens"),
    (
        "/generate",
        {"input_ids": [5] * 100, "sampling_params": {"max_new_tokens": CONTEXT - 99}},
        "sampling_params.max_new_tokens",
    ),
]


@pytest.mark.parametrize("path,body,param", LIMITS, ids=[f"{p}-{param}" for p, _, param in LIMITS])
def test_prompt_and_max_tokens_beyond_the_context_are_400(builder, path, body, param):
    client, manager = client_for(builder)
    r = client.post(path, json=body)
    assert_400(r, param)
    assert "context length" in r.json()["error"]["message"] or param == "max_tokens"
    assert manager.sent == []


@pytest.mark.parametrize(
    "path,body,message",
    [
        (
            "/v1/completions",
            {"prompt": [5] * 100, "max_tokens": CONTEXT - 99},
            f"max_tokens={CONTEXT - 99} plus the prompt's 100 tokens exceeds the context length of {CONTEXT} tokens: "
            f"ask for at most {CONTEXT - 100}",
        ),
        (
            "/v1/completions",
            {"prompt": [5] * CONTEXT},
            f"prompt: the prompt has {CONTEXT} tokens, which leaves no room in the context length of {CONTEXT} tokens: "
            f"shorten it to at most {CONTEXT - 1} tokens",
        ),
    ],
)
def test_a_budget_beyond_the_context_says_what_fits(builder, path, body, message):
    """The 400 for a prompt or a token budget that does not fit says how much would."""
    client, _ = client_for(builder)
    assert client.post(path, json=body).json()["error"]["message"] == message


def test_budgets_that_fill_the_context_exactly_are_accepted(builder):
    client, manager = client_for(builder)
    assert client.post("/v1/completions", json={"prompt": [5] * 100, "max_tokens": CONTEXT - 100}).status_code == 200
    assert client.post("/v1/completions", json={"prompt": [5] * (CONTEXT - 1)}).status_code == 200
    assert [r.max_new_tokens for r in manager.sent] == [CONTEXT - 100, 1]


def test_native_default_max_new_tokens_is_cut_to_the_room_left(builder):
    """Without max_new_tokens a native request gets SGLang's 128, or the room the context
    leaves when that is less (never a 400 about a field the client did not send)."""
    client, manager = client_for(builder)
    for n_prompt in (10, CONTEXT - 5):
        assert client.post("/generate", json={"input_ids": [5] * n_prompt}).status_code == 200
    assert [r.max_new_tokens for r in manager.sent] == [NATIVE_MAX_NEW_TOKENS, 5]


def test_completions_default_max_tokens_is_16_cut_to_the_room_left(builder):
    """Without max_tokens a completions request gets 16 tokens, the default of OpenAI's,
    vLLM's and SGLang's completions (it ran to EOS or the end of the context), or the room
    the context leaves when that is less; null is the same; chat keeps all the room."""
    client, manager = client_for(builder)
    for body in (
        {"prompt": [5] * 10},
        {"prompt": [5] * 10, "max_tokens": None},
        {"prompt": [5] * (CONTEXT - 5)},
        {"prompt": [5] * 10, "max_tokens": 100},
    ):
        assert client.post("/v1/completions", json=body).status_code == 200
    assert [r.max_new_tokens for r in manager.sent] == [COMPLETION_MAX_TOKENS, COMPLETION_MAX_TOKENS, 5, 100]
    assert COMPLETION_MAX_TOKENS == 16
    assert client.post("/v1/chat/completions", json={"messages": CHAT["messages"]}).status_code == 200
    assert manager.sent[-1].max_new_tokens == CONTEXT - len(manager.sent[-1].input_ids)


# ---------------------------------------------------------------- found by fuzzing
@pytest.mark.parametrize("ebnf", ["\U000a4260G", "é" * 3 + "("])
def test_grammar_whose_xgrammar_error_cannot_be_decoded_is_400(builder, ebnf):
    """xgrammar's error for these quotes the grammar cut inside a multi-byte character and
    raises UnicodeDecodeError (a 500 once, found by tests/e2e/test_fuzz.py)."""
    client, manager = client_for(builder)
    r = client.post("/generate", json={"text": "Hi", "sampling_params": {"ebnf": ebnf}})
    assert_400(r, "sampling_params.ebnf")
    assert "xgrammar could not parse it" in r.json()["error"]["message"]
    assert manager.sent == []


def test_integral_floats_are_integers_and_other_numbers_are_not(builder):
    """JSON has one number type: 4.0 is the integer 4 (schema-valid, and sent by fuzzers and
    some clients); 4.5, "4" and true stay 400s."""
    client, manager = client_for(builder)
    r = client.post("/v1/completions", json={"prompt": [5.0, 6], "max_tokens": 4.0, "n": 1.0, "seed": -3.0})
    assert r.status_code == 200, r.text
    req = manager.sent[0]
    assert (req.input_ids, req.max_new_tokens, req.sampling.seed) == ([5, 6], 4, -3)
    assert all(type(t) is int for t in req.input_ids)
    for bad in (4.5, "4", True, 1e300 * 10):
        assert_400(client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": bad}), "max_tokens")


FLOAT_FIELDS = [
    ("/v1/completions", {**COMPLETION, "temperature": None}, "temperature"),
    ("/v1/completions", {**COMPLETION, "top_p": None}, "top_p"),
    ("/v1/chat/completions", {**CHAT, "presence_penalty": None}, "presence_penalty"),
    ("/v1/completions", {**COMPLETION, "repetition_penalty": None}, "repetition_penalty"),
    ("/v1/completions", {**COMPLETION, "min_p": None}, "min_p"),
    (
        "/generate",
        {**NATIVE, "sampling_params": {"max_new_tokens": 8, "temperature": None}},
        "sampling_params.temperature",
    ),
]


@pytest.mark.parametrize("path,body,param", FLOAT_FIELDS, ids=[p for _, _, p in FLOAT_FIELDS])
def test_float_fields_take_numbers_only(builder, path, body, param):
    """A float field takes a JSON number (an integer too); a string or a bool is a 400 naming
    it, never converted."""
    client, manager = client_for(builder)
    field = param.split(".")[-1]

    def with_value(value):
        if "sampling_params" in body:
            return {**body, "sampling_params": {**body["sampling_params"], field: value}}
        return {**body, field: value}

    for bad in ("0.5", True):
        assert_400(client.post(path, json=with_value(bad)), param)
    assert manager.sent == []
    assert client.post(path, json=with_value(1)).status_code == 200


@pytest.mark.parametrize("key", [" 5", "+5", "1_0", "\u0665", "5.0", "-5", ""])
def test_logit_bias_keys_are_decimal_token_ids(builder, key):
    """Only plain decimal digits name a token (int() alone would read " 5", "+5", "1_0" and an
    Arabic-Indic five as ids)."""
    client, manager = client_for(builder)
    assert_400(client.post("/v1/completions", json={**COMPLETION, "logit_bias": {key: 5}}), "logit_bias")
    assert client.post("/v1/completions", json={**COMPLETION, "logit_bias": {"5": 5}}).status_code == 200
    assert manager.sent[0].sampling.logit_bias == {5: 5.0}


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/completions", {**COMPLETION, "logit_bias": {"5": 100, "05": -100}}),
        ("/generate", {"text": "Hi", "sampling_params": {"logit_bias": {"007": 1, "7": 2}}}),
    ],
    ids=["completions", "native"],
)
def test_logit_bias_keys_naming_one_token_twice_are_400(builder, path, body):
    """Two keys that read as one token id ("5" and "05") are a 400 naming both; the last one's
    value was taken silently, so which bias held depended on the key order."""
    client, manager = client_for(builder)
    r = client.post(path, json=body)
    param = "sampling_params.logit_bias" if path == "/generate" else "logit_bias"
    assert_400(r, param)
    keys = list((body.get("sampling_params") or body)["logit_bias"])
    assert f"keys {keys[0]!r} and {keys[1]!r} both name token {int(keys[0])}" in r.json()["error"]["message"]
    assert manager.sent == []


@pytest.mark.parametrize(
    "path,base", [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)], ids=["chat", "completions"]
)
def test_max_tokens_and_max_completion_tokens_that_disagree_are_400(builder, path, base):
    """Both limits given with different values are a 400 naming both (max_completion_tokens
    was taken silently, max_tokens ignored); the same value in both is served."""
    client, manager = client_for(builder)
    body = {k: v for k, v in base.items() if k != "max_tokens"}
    r = client.post(path, json={**body, "max_tokens": 1, "max_completion_tokens": 3})
    assert_400(r, "max_completion_tokens")
    assert "max_tokens=1 and max_completion_tokens=3" in r.json()["error"]["message"]
    assert manager.sent == []
    assert client.post(path, json={**body, "max_tokens": 3, "max_completion_tokens": 3}).status_code == 200
    assert manager.sent[0].max_new_tokens == 3


def test_openapi_schema_bounds_token_ids_by_the_vocabulary(builder):
    """The schema fuzzers and clients read says what a request may hold, token ids included."""
    client, _ = client_for(builder)
    schemas = client.get("/openapi.json").json()["components"]["schemas"]
    one, batch = schemas["GenerateRequest"]["properties"]["input_ids"]["anyOf"]  # a prompt, or a batch of them
    for input_ids in (one["items"], batch["items"]["items"]):
        assert (input_ids["minimum"], input_ids["maximum"]) == (0, VOCAB - 1)
    stop_ids = schemas["NativeSamplingParams"]["properties"]["stop_token_ids"]["anyOf"][0]["items"]
    assert stop_ids["maximum"] == VOCAB - 1
    assert "x-token-id" not in str(client.get("/openapi.json").json())
    assert schemas["ChatCompletionRequest"]["properties"]["service_tier"]["anyOf"][0]["enum"] == ["auto", "default"]


# ---------------------------------------------------------------- null is absent
def _optional_fields(model) -> list[str]:
    return [name for name, f in model.model_fields.items() if not f.is_required()]


def _nulls():
    from tokenizer_proc.openai.models import ChatCompletionRequest, CompletionRequest

    return [("/v1/chat/completions", f) for f in _optional_fields(ChatCompletionRequest)] + [
        ("/v1/completions", f) for f in _optional_fields(CompletionRequest)
    ]


NULLS = _nulls()


def _same_request(a, b) -> bool:
    import msgspec

    return msgspec.structs.replace(a, rid="") == msgspec.structs.replace(b, rid="")


@pytest.mark.parametrize("path,field", NULLS, ids=[f"{p}-{f}" for p, f in NULLS])
def test_null_for_an_optional_field_is_the_field_absent(builder, path, field):
    """OpenAI marks its optional fields nullable and its SDK sends null for a parameter given
    as None: null is the field left out (n null was a 400, "n: Input should be a valid
    integer", and so were stream, echo and the vLLM booleans), the same request and the same
    body as without it."""
    client, manager = client_for(builder)
    base = {k: v for k, v in ROUTES[path][0].items() if k != field}
    with_null = client.post(path, json={**base, field: None})
    assert with_null.status_code == 200, with_null.text
    without = client.post(path, json=base)
    assert len(manager.sent) == 2 and _same_request(*manager.sent)
    strip = ("id", "created")
    assert {k: v for k, v in with_null.json().items() if k not in strip} == {
        k: v for k, v in without.json().items() if k not in strip
    }


def test_null_inside_stream_options_is_absent(builder):
    client, _ = client_for(builder)
    r = client.post("/v1/chat/completions", json={**CHAT, "stream": True, "stream_options": {"include_usage": None}})
    assert r.status_code == 200, r.text
    assert "usage" not in r.text


def test_null_for_a_required_field_is_400_naming_it(builder):
    client, manager = client_for(builder)
    assert_400(client.post("/v1/chat/completions", json={**CHAT, "messages": None}), "messages")
    assert_400(client.post("/v1/completions", json={**COMPLETION, "prompt": None}), "prompt")
    assert manager.sent == []


@pytest.mark.parametrize("role", ["system", "developer", "user", "tool"])
@pytest.mark.parametrize("null", [{"content": None}, {}], ids=["null", "missing"])
def test_content_of_a_turn_other_than_the_assistants_is_required(builder, role, null):
    """As OpenAI's API: only an assistant turn (one that calls tools) may leave content out."""
    client, manager = client_for(builder)
    extra = {"tool_call_id": "call_1"} if role == "tool" else {}
    body = {**CHAT, "messages": [{"role": "user", "content": "Hi"}, {"role": role, **extra, **null}]}
    assert_400(client.post("/v1/chat/completions", json=body), "messages.1.content")
    assert manager.sent == []


@pytest.mark.parametrize("role", ["user", "assistant", "system"])
def test_an_empty_list_of_content_parts_is_400(builder, role):
    """As OpenAI's API: content is a string or at least one part (an empty list rendered as an
    empty turn)."""
    client, manager = client_for(builder)
    body = {**CHAT, "messages": [{"role": "user", "content": "Hi"}, {"role": role, "content": []}]}
    assert_400(client.post("/v1/chat/completions", json=body), "messages.1.content")
    assert manager.sent == []


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_temperature_above_openais_range_is_400(builder, path):
    """OpenAI's chat and completions take a temperature from 0 to 2, as the Responses route
    already checked; 2.5 was accepted and sampled nearly uniformly until max_tokens (a
    chat request without max_tokens ran to the end of the context). 2 itself passes."""
    client, manager = client_for(builder)
    base = ROUTES[path][0]
    assert_400(client.post(path, json={**base, "temperature": 2.5}), "temperature")
    assert manager.sent == []
    assert client.post(path, json={**base, "temperature": 2}).status_code == 200


def test_a_deeply_nested_template_kwarg_is_a_400_that_says_so(builder):
    """chat_template_kwargs nested ~900 levels deep: the template's recursive walk ran out of
    stack and the 400 quoted Python ("maximum recursion depth exceeded in comparison") under
    param messages; it names the nesting and the field now, and nothing is sent."""
    client, manager = client_for(builder)
    deep: dict = {}
    cur = deep
    for _ in range(900):
        cur["a"] = {}
        cur = cur["a"]
    r = client.post("/v1/chat/completions", json={**CHAT, "chat_template_kwargs": deep})
    assert_400(r, "chat_template_kwargs")
    message = r.json()["error"]["message"]
    assert "nested too deeply" in message and "recursion" not in message
    assert manager.sent == []
