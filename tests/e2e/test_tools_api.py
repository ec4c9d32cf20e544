"""Strict tools under ``tool_choice: auto`` on the tiny model's server (the session's, whose
forced-token processors make it want a chosen text): calls are schema-valid where the model
writes invalid arguments, one call without parallel calls, an unknown processor refused.
On the default model: tests/e2e/real/test_tools_api.py; in-process: tests/api/."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.tool_defs import TOOLS

MODEL = "SmolLM2-135M-Instruct"


ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def post(url: str, **body) -> dict:
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "temperature": 0, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


# ---------------------------------------------------------------- strict tools under tool_choice auto
def strict_tools(strict: bool | None = True) -> list[dict]:
    return [{"type": "function", "function": {**t["function"], "strict": strict}} for t in TOOLS]


@pytest.fixture(scope="module")
def ranked_server(tiny_server):
    """The session's tiny random model server (SmolLM2's tokenizer and template: hermes
    calls), which loads the `tests.support.forced_tokens` processors, so a request can be made to
    want a chosen text."""
    tiny_server.model = httpx.get(f"{tiny_server.base_url}/v1/models", timeout=10).json()["data"][0]["id"]
    return tiny_server


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_an_unknown_processor_is_refused_also_for_no_tokens(ranked_server, max_tokens):
    """The scheduler decides every finish after its checks (DESIGN.md §6: one place): a
    request for 0 tokens naming a processor the server has not loaded is the same 400 as
    one for 1 token (the HTTP process ended it at once with a 200 and empty text)."""
    r = httpx.post(
        f"{ranked_server.base_url}/v1/chat/completions",
        timeout=60,
        json={
            "model": ranked_server.model,
            "messages": ASK,
            "max_tokens": max_tokens,
            "custom_logit_processor": "no_such_processor",
        },
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "custom_logit_processor" and "no_such_processor" in err["message"], err
    ok = httpx.post(
        f"{ranked_server.base_url}/v1/completions",
        timeout=60,
        json={"prompt": "Hi", "max_tokens": max_tokens, "temperature": 0},
    )
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == max_tokens, ok.text
    assert ok.json()["choices"][0]["finish_reason"] == "length"


def wants(tokenizer, text: str, fallback: str) -> dict:
    """Request fields that make the model want `text` (then EOS), and, where a grammar
    refuses its next token, the tokens of `fallback` in their order."""
    enc = lambda t: tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
    return {
        "custom_logit_processor": "ranked",
        "custom_params": {
            "ids": enc(text),
            "eos": tokenizer.eos_token_id,
            "fallback": list(dict.fromkeys(enc(fallback))),
        },
    }


BAD_CALL = 'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_strict_auto_call_is_schema_valid_where_the_model_writes_invalid_arguments(ranked_server, tokenizer):
    url = ranked_server.base_url
    body = dict(
        model=ranked_server.model,
        messages=ASK,
        max_tokens=60,
        **wants(tokenizer, BAD_CALL, ', "unit": "celsius"}}\n</tool_call>'),
    )
    plain = post(url, tools=TOOLS, **body)["choices"][0]
    assert plain["message"]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'  # invalid
    for n in (1, 2):
        r = post(url, tools=strict_tools(), n=n, **body)
        for choice in r["choices"]:
            assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Sure."
            (call,) = choice["message"]["tool_calls"]
            assert call["function"]["name"] == "get_weather"
            assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "unit": "celsius"}
    # streamed: the same deltas as a streamed request without the grammar would carry
    content, calls, reason = streamed_calls_at(url, tools=strict_tools(), **body)
    assert (content, reason) == ("Sure.", "tool_calls")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris", "unit": "celsius"})
    ]


def test_strict_auto_without_parallel_calls_ends_after_the_first(ranked_server, tokenizer):
    """parallel_tool_calls false: after one call the grammar allows only EOS (the model
    wanted a second call and more text)."""
    call = '<tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call>'
    body = dict(
        model=ranked_server.model,
        messages=ASK,
        max_tokens=80,
        tools=strict_tools(),
        **wants(tokenizer, f"{call}\n{call} and more", ""),
    )
    two = post(ranked_server.base_url, **body)["choices"][0]
    assert [c["function"]["arguments"] for c in two["message"]["tool_calls"]] == ['{"city": "Oslo"}'] * 2
    one = post(ranked_server.base_url, parallel_tool_calls=False, **body)["choices"][0]
    assert one["finish_reason"] == "tool_calls" and one["message"]["content"] is None
    assert [c["function"]["arguments"] for c in one["message"]["tool_calls"]] == ['{"city": "Oslo"}']
    assert (
        post(ranked_server.base_url, parallel_tool_calls=False, **body)["usage"]["completion_tokens"]
        == len(tokenizer.encode(call, add_special_tokens=False)) + 1
    )  # the call, then EOS


def streamed_calls_at(url: str, **body) -> tuple[str, list[dict], str]:
    """(content, calls, finish_reason) of a streamed request to `url` (body: its fields)."""
    content, calls, reason = "", {}, None
    with httpx.stream(
        "POST", f"{url}/v1/chat/completions", json={"temperature": 0, **body, "stream": True}, timeout=120
    ) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            content += choice["delta"].get("content") or ""
            for tc in choice["delta"].get("tool_calls") or []:
                call = calls.setdefault(tc["index"], {"name": tc["function"].get("name"), "arguments": ""})
                call["arguments"] += tc["function"].get("arguments") or ""
            reason = choice.get("finish_reason") or reason
    return content, [calls[i] for i in sorted(calls)], reason
