"""The error contract's ``param``: the field at fault named as the client wrote it, on every
route (OpenAI chat and completions, native, Anthropic, Responses), for pydantic's own errors
and for the scheduler's refusals. The app runs in-process against a fake manager
(`tests.support.fake_app`)."""

from __future__ import annotations

import json

import pytest

from protocol.enums import ReqField
from tests.support.fake_app import AGENT_PARSERS, HELLO, app_client
from tokenizer_proc.errors import FieldError, client_path

HI = [{"role": "user", "content": "Hi"}]
CHAT = {"messages": HI, "max_tokens": 8}
MESSAGES = {"model": "m", "max_tokens": 8, "messages": HI}


def _exists(body: object, param: str, missing: bool) -> bool:
    """Whether `param` is a path through `body` (its last key may be absent when `missing`)."""
    node = body
    parts = param.split(".")
    for i, part in enumerate(parts):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return missing and i == len(parts) - 1 and isinstance(node, dict)
    return True


# Each body has its error inside a union: pydantic's loc names the union member it tried
# (``str``, ``list[str]``, ``dict``, a tagged union's tag such as ``tool_result`` or ``text``,
# ``list[tagged-union[...]]``), which is not part of the body.
UNION_ERRORS = [
    ("/v1/chat/completions", {**CHAT, "stop": 5}, "stop"),
    ("/v1/chat/completions", {**CHAT, "stop": [5]}, "stop"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": {"type": "function"}}, "tool_choice.function"),
    (
        "/v1/chat/completions",
        {**CHAT, "tool_choice": {"type": "function", "function": {}}},
        "tool_choice.function.name",
    ),
    ("/v1/completions", {"prompt": [[1, "a"]]}, "prompt"),
    ("/v1/completions", {"prompt": "x", "stop": {"a": 1}}, "stop"),
    ("/generate", {"text": "x", "sampling_params": {"stop": 5}}, "sampling_params.stop"),
    (
        "/v1/messages",
        {
            **MESSAGES,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}
                    ],
                }
            ],
        },
        "messages.0.content.0.content.0.type",
    ),
    (
        "/v1/messages",
        {
            **MESSAGES,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": 5}]}],
                }
            ],
        },
        "messages.0.content.0.content.0.text",
    ),
    # the tag "text" is also the block's field "text": the error's own input tells them apart
    (
        "/v1/messages",
        {**MESSAGES, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        "messages.0.content.0.text",
    ),
    (
        "/v1/messages",
        {**MESSAGES, "messages": [{"role": "user", "content": [{"type": "text", "text": {"text": "a"}}]}]},
        "messages.0.content.0.text",
    ),
    (
        "/v1/messages",
        {**MESSAGES, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
        "messages.0.content.0.text",
    ),
    ("/v1/messages", {**MESSAGES, "system": [{"type": "text", "text": 5}]}, "system.0.text"),
    (
        "/v1/responses",
        {"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": 5}]}]},
        "input.0.content.0.text",
    ),
    (
        "/v1/responses",
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
        "input.0.content.0.text",
    ),
    ("/v1/responses", {"input": [{"type": "function_call_output", "call_id": "c", "output": 5}]}, "input.0.output"),
    ("/v1/responses", {"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input.0.arguments"),
]


@pytest.mark.parametrize(("path", "body", "param"), UNION_ERRORS)
def test_union_errors_name_the_field_as_the_client_wrote_it(tokenizer, path, body, param):
    client, manager = app_client(tokenizer, HELLO)
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"].startswith(f"{param}: "), error
    assert _exists(body, param, missing="Field required" in error["message"])
    assert manager.sent == []


def _error(loc: tuple, type_: str, input_: object) -> dict:
    return {"loc": loc, "type": type_, "input": input_, "msg": "x"}


def test_client_path_keeps_keys_and_indexes_and_drops_labels():
    body = {"a": [{"type": "text", "text": {"text": 5}}], "str": {"x": 1}}
    inner = body["a"][0]["text"]
    # a label that is also a key: the walk that ends at the error's input wins, either way round
    assert client_path(
        _error(("body", "a", "list[tagged-union[X,Y]]", 0, "text", "text"), "dict_type", inner), body
    ) == ["a", "0", "text"]
    assert client_path(_error(("a", 0, "text", "text", "text"), "string_type", 5), body) == ["a", "0", "text", "text"]
    # a missing field ends at the object that lacks it
    assert client_path(_error(("a", 0, "text", "x", "missing_key"), "missing", inner), body) == [
        "a",
        "0",
        "text",
        "missing_key",
    ]
    # a key named like a union member's label ("str") is kept when the walk ends at the input
    assert client_path(_error(("str", "dict[str,int]", "x"), "int_type", 1), body) == ["str", "x"]
    assert client_path(_error(("str", "function-after[f(), str]"), "string_type", body["str"]), body) == ["str"]
    # an index the body does not have: nothing to walk, the loc as it is
    assert client_path(_error(("a", 3, "b"), "string_type", 1), body) == ["a", "3", "b"]


# ---------------------------------------------------------------- the scheduler's refusals
def refused(
    field: ReqField, message: str = "the prompt has 300 tokens, more than the KV cache can ever hold (200 tokens)"
):
    """A script answering every request as the scheduler refuses it: a `ReqError` about
    `field`, as `TokenizerManager` hands it on (a fresh `FieldError` per request)."""
    return lambda req: [FieldError(message, 400, field)]


def _events(r) -> list[dict]:
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ") and line[6:] != "[DONE]"]


def _streamed_error(path: str, r) -> dict:
    """The error a stream ended with, in each route's shape."""
    events = _events(r)
    if path == "/v1/messages":
        return next(e["error"] for e in events if e.get("type") == "error")
    if path == "/v1/responses":
        return next(e for e in events if e.get("type") == "error")
    return next(e["error"] for e in events if "error" in e)


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
TOOL = {"type": "function", "function": {"name": "f", "parameters": SCHEMA}}

REFUSALS = [
    # (route, body, field the scheduler names, param as the body has it)
    ("/v1/chat/completions", CHAT, ReqField.PROMPT, "messages"),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 4}, ReqField.PROMPT, "prompt"),
    ("/generate", {"text": "Hi"}, ReqField.PROMPT, "text"),
    ("/generate", {"input_ids": [5, 6]}, ReqField.PROMPT, "input_ids"),
    ("/v1/messages", MESSAGES, ReqField.PROMPT, "messages"),
    ("/v1/responses", {"input": "Hi"}, ReqField.PROMPT, "input"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_object"}}, ReqField.GRAMMAR, "response_format"),
    ("/v1/chat/completions", {**CHAT, "tools": [TOOL], "tool_choice": "required"}, ReqField.GRAMMAR, "tools"),
    (
        "/v1/chat/completions",
        {**CHAT, "tools": [{**TOOL, "function": {**TOOL["function"], "strict": True}}]},
        ReqField.GRAMMAR,
        "tools",
    ),
    (
        "/v1/completions",
        {"prompt": "Hi", "response_format": {"type": "json_object"}},
        ReqField.GRAMMAR,
        "response_format",
    ),
    ("/generate", {"text": "Hi", "sampling_params": {"regex": "a+"}}, ReqField.GRAMMAR, "sampling_params.regex"),
    (
        "/generate",
        {"text": "Hi", "sampling_params": {"json_schema": json.dumps(SCHEMA)}},
        ReqField.GRAMMAR,
        "sampling_params.json_schema",
    ),
    (
        "/v1/messages",
        {**MESSAGES, "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}},
        ReqField.GRAMMAR,
        "output_config.format",
    ),
    ("/v1/responses", {"input": "Hi", "text": {"format": {"type": "json_object"}}}, ReqField.GRAMMAR, "text.format"),
    ("/v1/chat/completions", {**CHAT, "thinking_token_budget": 8}, ReqField.REASONING_BUDGET, "thinking_token_budget"),
    (
        "/v1/messages",
        {**MESSAGES, "max_tokens": 64, "thinking": {"type": "enabled", "budget_tokens": 16}},
        ReqField.REASONING_BUDGET,
        "thinking.budget_tokens",
    ),
    ("/generate", {"text": "Hi", "rid": "mine"}, ReqField.RID, "rid"),
]


@pytest.mark.parametrize(
    ("path", "body", "field", "param"), REFUSALS, ids=[f"{p}-{param}" for p, _, _, param in REFUSALS]
)
def test_scheduler_refusals_name_the_field_as_the_route_has_it(tokenizer, path, body, field, param):
    """The scheduler knows a field only as a `ReqField`; the route names it as its body has it
    (it was null), streamed or not, and leads the message with it, as the HTTP layer's checks do."""
    client, _ = app_client(tokenizer, refused(field), AGENT_PARSERS)
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == (param, 400), error
    assert error["message"].startswith(f"{param}: the prompt has 300 tokens"), error
    r = client.post(path, json={**body, "stream": True})
    error = _streamed_error(path, r)
    assert error["param"] == param and error["message"].startswith(f"{param}: "), error


def test_each_prompt_of_a_completions_request_is_named_by_its_index(tokenizer):
    def script(req):
        return [FieldError("too long", 400, ReqField.PROMPT)] if req.input_ids[0] == 7 else HELLO(req)

    client, _ = app_client(tokenizer, script)
    r = client.post("/v1/completions", json={"prompt": [[5, 6], [7, 8]], "max_tokens": 4, "n": 2})
    error = r.json()["error"]
    assert (r.status_code, error["param"], error["message"]) == (400, "prompt.1", "prompt.1: too long")


def test_a_refusal_about_no_field_stays_without_one(tokenizer):
    client, _ = app_client(tokenizer, lambda req: [FieldError("request timed out in the queue", 503, ReqField.NONE)])
    error = client.post("/v1/chat/completions", json=CHAT).json()["error"]
    assert (error["param"], error["message"], error["code"]) == (None, "request timed out in the queue", 503)


@pytest.mark.parametrize(
    "path, body",
    [
        ("/" + "a" * 60_000, None),  # a 404 quoting the path
        ("/v1/completions", {"prompt": "Hi", "model": "m" * 100_000}),  # a model-not-found quoting the name
        ("/v1/messages", {"model": "m" * 100_000, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}),
    ],
)
def test_an_error_quoting_a_huge_value_is_cut(tokenizer, path, body):
    """Messages quote what the request sent: a 60 kB path came back as a 60 kB 404 (and a
    100 kB model name as a 100 kB body); a message is cut at 2,000 characters, saying so."""
    client, _ = app_client(tokenizer, HELLO)
    r = client.get(path) if body is None else client.post(path, json=body)
    assert r.status_code == 404 and len(r.content) < 2500, len(r.content)
    assert "message cut:" in r.json()["error"]["message"]


def test_a_path_or_method_no_route_serves_says_what_does(tokenizer):
    """A path no route serves and a method its route does not take said only "Not Found" /
    "Method Not Allowed": now they say where the routes are listed, and which methods it takes."""
    client, _ = app_client(tokenizer, HELLO)
    r = client.post("/v1/chat/completion", json=CHAT)  # a typo
    assert r.status_code == 404 and r.json()["error"]["message"] == (
        "no route serves /v1/chat/completion: GET /openapi.json lists this server's routes"
    )
    r = client.put("/generate", json={})
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json()["error"]["message"] == "/generate does not take PUT: it takes POST"
    assert client.get("/v1/messages").json()["error"]["message"] == "/v1/messages does not take GET: it takes POST"
    r = client.put("/ping")  # served one route per method: every method is named, not the first route's
    assert r.headers["allow"] == "GET, HEAD, POST" and r.json()["error"]["message"].endswith("it takes GET, HEAD, POST")
    # a trailing slash: the same 404, not Starlette's 307 to a Location built from the client's Host header
    r = client.post("/v1/completions/", json={"prompt": "hi"}, follow_redirects=False)
    assert r.status_code == 404 and "location" not in r.headers
    assert r.json()["error"]["message"].startswith("no route serves /v1/completions/:")
    for path in ("/v1/models/", "/v1/models/m/"):  # the one route whose last part is free (a model id holds /)
        r = client.get(path)
        assert r.status_code == 404 and r.json()["error"]["message"].startswith(f"no route serves {path}:")
    assert client.get("/v1/models/m").status_code == 200
    assert client.head("/health").status_code == client.head("/ping").status_code == 200  # health checkers' HEAD


def test_every_5xx_of_the_openai_style_routes_has_one_type():
    """Whoever raises or renders a 5xx (a route's `APIError`, /health's `error_response`),
    its type is `SERVER_ERROR`, even when a raiser names another: one value for the family
    (/health's 503 said "unavailable" while the routes' 503 said "server_error")."""
    from tokenizer_proc.errors import SERVER_ERROR, APIError, error_response

    for status in (500, 503):
        assert APIError("x", status).type == APIError("x", status, type_="unavailable").type == SERVER_ERROR
        body = json.loads(error_response("x", status, type_="unavailable").body)
        assert body["error"]["type"] == SERVER_ERROR and body["error"]["code"] == status
    assert APIError("x", 429, type_="rate_limit_error").type == "rate_limit_error"
    assert APIError("x", 400).type == "invalid_request_error"


def test_every_get_route_that_only_reads_answers_head(tokenizer):
    """RFC 9110: a HEAD is the GET without content. FastAPI routes answered a HEAD 405 except
    on /health and /ping, so a load balancer's or uptime checker's HEAD probe of /v1/models or
    /metrics failed. Every GET route now answers HEAD with its GET's status and headers; the
    one whose GET changes the server (SGLang's GET /flush_cache) stays a 405."""
    from fastapi.routing import APIRoute

    client, _ = app_client(tokenizer, HELLO)
    gets = sorted({r.path for r in client.app.routes if isinstance(r, APIRoute) and "GET" in r.methods})
    assert {"/health", "/ping", "/metrics", "/v1/models", "/v1/models/{model_id:path}", "/version"} <= set(gets)
    for path in gets:
        url = path.replace("{model_id:path}", "m").replace("{completion_id}", "x").replace("{response_id}", "x")
        if path == "/flush_cache":  # (its GET is not sent: the fake manager has no cache to flush)
            head = client.head(url)
            assert (head.status_code, head.headers["allow"], head.content) == (405, "GET, POST", b"")
            continue
        get, head = client.get(url), client.head(url)
        assert (head.status_code, head.headers["content-type"], head.content) == (
            get.status_code,
            get.headers["content-type"],
            b"",
        ), url
    assert client.head("/v1/models").headers["content-length"] == str(len(client.get("/v1/models").content))
    assert [o for p, ops in client.get("/openapi.json").json()["paths"].items() for o in ops if o == "head"] == []
