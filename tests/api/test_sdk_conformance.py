"""What the official SDKs send and read beyond the basics, in-process (the app on scripted
deltas): request-id headers on every kind of answer, through `openai` and `anthropic`; tool
choices of the API that are not served, refused saying so; the `openai` SDK's parse helper
sent its own message back."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

from tests.support.fake_app import AGENT_OUTPUT, AGENT_PARSERS, HELLO, app_client, in_pieces

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def sdks(tokenizer):
    client, _ = app_client(tokenizer, HELLO, api_key="k")
    oai = openai.OpenAI(base_url="http://testserver/v1", api_key="k", http_client=client, max_retries=0)
    ant = anthropic.Anthropic(base_url="http://testserver", api_key="k", http_client=client, max_retries=0)
    return client, oai, ant


def test_every_answer_carries_a_request_id_both_sdks_read(sdks):
    client, oai, ant = sdks
    ids = [
        oai.chat.completions.create(model="m", messages=HI)._request_id,
        oai.completions.create(model="m", prompt="Hi")._request_id,
        oai.responses.create(model="m", input="Hi")._request_id,
        ant.messages.create(model="m", max_tokens=8, messages=HI)._request_id,
    ]
    with oai.chat.completions.create(model="m", messages=HI, stream=True) as s:
        ids.append(s.response.headers["x-request-id"])
    with ant.messages.stream(model="m", max_tokens=8, messages=HI) as s:
        ids.append(s.request_id)
    with pytest.raises(openai.NotFoundError) as e1:
        oai.chat.completions.create(model="other", messages=HI)
    with pytest.raises(anthropic.NotFoundError) as e2:
        ant.messages.create(model="other", max_tokens=8, messages=HI)
    ids += [e1.value.request_id, e2.value.request_id]
    unauthorized = client.post("/v1/messages", json={}, headers={"x-api-key": "wrong"})  # answered by middleware
    assert unauthorized.status_code == 401
    ids.append(unauthorized.headers["request-id"])
    assert all(i and i.startswith("req_") and len(i) == 36 for i in ids), ids
    assert len(set(ids)) == len(ids)
    r = client.get("/v1/models", headers={"x-api-key": "k"})
    assert r.headers["x-request-id"] == r.headers["request-id"]


def test_a_client_request_id_is_echoed(sdks):
    """A proxy's or client's X-Request-Id comes back in both headers (as vLLM echoes it),
    also on an error; one longer than 128 characters or with a space gets a fresh id."""
    client, oai, _ = sdks
    r = client.get("/v1/models", headers={"x-api-key": "k", "X-Request-Id": "trace-42:a.b"})
    assert r.headers["x-request-id"] == r.headers["request-id"] == "trace-42:a.b"
    answer = oai.chat.completions.with_raw_response.create(
        model="m", messages=HI, extra_headers={"X-Request-Id": "abc"}
    )
    assert answer.headers["x-request-id"] == "abc"
    with pytest.raises(openai.NotFoundError) as e:
        oai.chat.completions.create(model="other", messages=HI, extra_headers={"X-Request-Id": "abc"})
    assert e.value.request_id == "abc"
    for bad in ("x" * 129, "a b", ""):
        got = client.get("/v1/models", headers={"x-api-key": "k", "X-Request-Id": bad}).headers["x-request-id"]
        assert got.startswith("req_") and len(got) == 36


@pytest.mark.parametrize(
    "path, body",
    [
        (
            "/chat/completions",
            {
                "messages": HI,
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {
                    "type": "allowed_tools",
                    "allowed_tools": {"mode": "auto", "tools": [{"type": "function", "function": {"name": "f"}}]},
                },
            },
        ),
        ("/chat/completions", {"messages": HI, "tool_choice": {"type": "custom", "custom": {"name": "f"}}}),
        (
            "/responses",
            {
                "input": "Hi",
                "tools": [{"type": "function", "name": "f"}],
                "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "f"}]},
            },
        ),
    ],
)
def test_other_tool_choice_types_are_refused_saying_so(sdks, path, body):
    _, oai, _ = sdks
    with pytest.raises(openai.BadRequestError) as e:
        oai.post(path, body={"model": "m", **body}, cast_to=object)
    assert e.value.body["param"] == "tool_choice"
    assert f"tool_choice of type {body['tool_choice']['type']!r} is not supported" in e.value.body["message"]


@pytest.mark.parametrize(
    "path, body, param",
    [
        (
            "/chat/completions",
            {
                "messages": HI,
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function"},
            },
            "tool_choice.function",
        ),
        (
            "/chat/completions",
            {
                "messages": HI,
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"type": "function", "function": {}},
            },
            "tool_choice.function.name",
        ),
        (
            "/responses",
            {"input": "Hi", "tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "function"}},
            "tool_choice.name",
        ),
        (
            "/chat/completions",
            {
                "messages": HI,
                "tools": [{"type": "function", "function": {"name": "f"}}],
                "tool_choice": {"function": {"name": "f"}},
            },
            "tool_choice.type",
        ),
    ],
)
def test_a_function_tool_choice_missing_its_name_says_so(sdks, path, body, param):
    """A function choice without the function's name (or its type) names the missing field (it said
    "Input should be 'none', 'auto' or 'required'", the string branch's error)."""
    _, oai, _ = sdks
    with pytest.raises(openai.BadRequestError) as e:
        oai.post(path, body={"model": "m", **body}, cast_to=object)
    assert e.value.body["param"] == param
    assert e.value.body["message"] == f"{param}: Field required"


def test_an_unexpected_error_carries_a_request_id_too(tokenizer):
    """A 500 answered for an exception no route handled (by Starlette's outermost error
    middleware) carries the request id as well (it had none: the SDKs' request_id was None)."""

    def fail(req):
        raise RuntimeError("scripted failure")

    client, _ = app_client(tokenizer, fail)
    client = TestClient(client.app, raise_server_exceptions=False)
    oai = openai.OpenAI(base_url="http://testserver/v1", api_key="k", http_client=client, max_retries=0)
    with pytest.raises(openai.InternalServerError) as e:
        oai.chat.completions.create(model="m", messages=HI)
    assert e.value.body["message"] == "internal error: RuntimeError"
    assert e.value.request_id.startswith("req_") and len(e.value.request_id) == 36
    assert e.value.response.headers["request-id"] == e.value.request_id


def test_chat_and_completions_carry_one_system_fingerprint_the_sdk_reads(sdks, tokenizer):
    """OpenAI (and vLLM) put a ``system_fingerprint`` in every chat and completions body and
    streamed chunk, the same while the configuration is, for clients that watch for backend
    changes (it was missing: the SDK read None). Another configuration has another."""
    _, oai, _ = sdks
    prints = [
        oai.chat.completions.create(model="m", messages=HI).system_fingerprint,
        oai.completions.create(model="m", prompt="Hi").system_fingerprint,
    ]
    prints += [
        c.system_fingerprint
        for c in oai.chat.completions.create(
            model="m", messages=HI, stream=True, stream_options={"include_usage": True}
        )
    ]
    prints += [c.system_fingerprint for c in oai.completions.create(model="m", prompt="Hi", stream=True)]
    assert len(prints) > 4 and len(set(prints)) == 1
    assert prints[0].startswith("fp_") and len(prints[0]) == 13
    other, _ = app_client(tokenizer, HELLO, settings=("another", "setting"))
    body = other.post("/v1/chat/completions", json={"model": "m", "messages": HI}).json()
    assert body["system_fingerprint"].startswith("fp_") and body["system_fingerprint"] != prints[0]


class Weather(BaseModel):
    city: str
    days: list[int]


def test_a_parsed_tool_call_sent_back_continues_the_conversation(tokenizer):
    """The SDK's agent loop: ``chat.completions.parse`` with a `pydantic_function_tool`, its
    message appended as it is (the SDK sends each call's ``parsed_arguments`` along), then the
    tool's result: the next request is served with the call in its prompt (it was a 400 naming
    messages.1.tool_calls.0.function.parsed_arguments)."""
    client, manager = app_client(tokenizer, in_pieces(AGENT_OUTPUT), AGENT_PARSERS)
    oai = openai.OpenAI(base_url="http://testserver/v1", api_key="k", http_client=client, max_retries=0)
    tools = [openai.pydantic_function_tool(Weather, name="get_weather")]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    first = oai.chat.completions.parse(model="m", messages=messages, tools=tools)
    call = first.choices[0].message.tool_calls[0]
    assert call.function.parsed_arguments == Weather(city="Paris", days=[1, 2])
    messages += [first.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": "Sunny all week"}]
    oai.chat.completions.parse(model="m", messages=messages, tools=tools)
    prompt = tokenizer.decode(manager.sent[-1].input_ids)
    assert '"city": "Paris"' in prompt and "Sunny all week" in prompt


def test_ids_not_kept_are_404s_naming_the_id_with_openai_codes(sdks):
    """The stored chat completion routes gave the bare 404 "Not Found" of a path no route
    serves (this server keeps no chat completion): now, as every store route, a 404 whose
    message names the id, type invalid_request_error, code not_found (the openai SDK's
    ``e.code``). Listing stored chat completions is a 400 saying it is not served; an
    unknown model is code model_not_found (it was in ``type``)."""
    _, oai, _ = sdks
    for call in (
        lambda: oai.chat.completions.retrieve("chatcmpl-gone"),
        lambda: oai.chat.completions.update("chatcmpl-gone", metadata={"k": "v"}),
        lambda: oai.chat.completions.delete("chatcmpl-gone"),
        lambda: oai.chat.completions.messages.list("chatcmpl-gone"),
        lambda: oai.responses.retrieve("resp_gone"),
        lambda: oai.responses.delete("resp_gone"),
        lambda: oai.responses.input_items.list("resp_gone"),
        lambda: oai.responses.cancel("resp_gone"),
    ):
        with pytest.raises(openai.NotFoundError) as e:
            call()
        body = e.value.body
        assert (body["type"], body["param"], e.value.code) == ("invalid_request_error", None, "not_found"), body
        assert "'chatcmpl-gone' not found" in body["message"] or "'resp_gone' not found" in body["message"]
    with pytest.raises(openai.BadRequestError, match="listing stored chat completions is not supported"):
        oai.chat.completions.list()
    with pytest.raises(openai.NotFoundError) as e:
        oai.chat.completions.create(model="other", messages=HI)
    assert (e.value.body["type"], e.value.code, e.value.param) == ("invalid_request_error", "model_not_found", "model")


def test_chat_says_the_tier_served_and_other_apis_run_under_their_own_ids(tokenizer):
    """service_tier: chat completions (and each chunk) say the tier used, "default", as
    OpenAI's do (absent before), for "auto" too; completions objects have no such field.
    An Anthropic message ran, and so was logged, as ``chatcmpl-<hex>``: it runs under its
    ``msg_`` id, as a response under its ``resp_`` one."""
    client, manager = app_client(tokenizer, HELLO)
    oai = openai.OpenAI(base_url="http://testserver/v1", api_key="k", http_client=client, max_retries=0)
    assert oai.chat.completions.create(model="m", messages=HI, service_tier="auto").service_tier == "default"
    chunks = list(
        oai.chat.completions.create(model="m", messages=HI, stream=True, stream_options={"include_usage": True})
    )
    assert [c.service_tier for c in chunks] == ["default"] * len(chunks) and len(chunks) > 2
    assert "service_tier" not in oai.completions.create(model="m", prompt="Hi").model_dump(exclude_unset=True)
    ant = anthropic.Anthropic(base_url="http://testserver", api_key="k", http_client=client, max_retries=0)
    msg = ant.messages.create(model="m", max_tokens=8, messages=HI)
    assert msg.id.startswith("msg_") and manager.sent[-1].rid == msg.id
    with ant.messages.stream(model="m", max_tokens=8, messages=HI) as s:
        assert s.get_final_message().id == manager.sent[-1].rid


def test_the_models_list_takes_anthropics_paging_parameters(sdks):
    """``models.list(after_id=..., before_id=..., limit=...)`` of the `anthropic` SDK: the page
    after or before the one model is empty, a limit outside 1..1000 and a cursor naming no
    listed model are 400s naming the parameter. They were ignored: every page held the model."""
    _, oai, ant = sdks
    assert [m.id for m in ant.models.list(limit=1)] == [m.id for m in oai.models.list()] == ["m"]
    for page in (ant.models.list(after_id="m"), ant.models.list(before_id="m")):
        assert (page.data, page.has_more, page.first_id, page.last_id) == ([], False, None, None)
    for kwargs, param in (({"limit": 0}, "limit"), ({"limit": 1001}, "limit"), ({"after_id": "other"}, "after_id")):
        with pytest.raises(anthropic.BadRequestError) as e:
            ant.models.list(**kwargs)
        assert e.value.body["error"]["param"] == param and e.value.body["error"]["message"].startswith(param)


@pytest.mark.parametrize(
    "path, body", [("/v1/chat/completions", {"messages": HI, "n": 2}), ("/v1/completions", {"prompt": "Hi"})]
)
def test_with_include_usage_every_chunk_has_a_usage_field_null_but_in_the_last(sdks, path, body):
    """OpenAI's stream_options.include_usage: "All other chunks will also include a usage
    field, but with a null value." They had no usage field at all (clients reading the raw
    JSON, such as ``chunk["usage"]``, failed); with continuous_usage_stats each holds its
    choice's usage (`test_http_output`)."""
    client, _, _ = sdks
    r = client.post(
        path,
        json={"model": "m", "stream": True, "stream_options": {"include_usage": True}, **body},
        headers={"x-api-key": "k"},
    )
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert len(chunks) > 3 and all("usage" in c for c in chunks), chunks
    assert [c["usage"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    plain = client.post(path, json={"model": "m", "stream": True, **body}, headers={"x-api-key": "k"})
    assert not any('"usage"' in line for line in plain.text.splitlines())


def test_a_chat_message_carries_a_null_refusal(sdks):
    """OpenAI's OpenAPI schema of a chat completion's message requires ``refusal`` (null when
    the model did not refuse), as its API and vLLM answer; it was missing, which clients
    validating against that schema refuse. This server never refuses: always null."""
    client, _, _ = sdks
    body = client.post(
        "/v1/chat/completions", json={"model": "m", "messages": HI, "n": 2}, headers={"x-api-key": "k"}
    ).json()
    assert [c["message"]["refusal"] for c in body["choices"]] == [None, None]
    assert [c["message"]["content"] for c in body["choices"]] == [" Hello", " Hello"]
