"""How a reasoning server reads requests (in-process, scripted outputs), with
``--reasoning-parser deepseek_r1``, whose output starts inside the think block when the
prompt shows no tag (SmolLM2's template shows none): a grammar-forced call or
response_format is content, never reasoning; thinking turned off closes the block at once
(a budget of 0); budgets reach the request from chat, Responses and Anthropic, and are
refused where they cannot apply."""

from __future__ import annotations

import pytest

from tests.support.fake_app import app_client, in_pieces
from tokenizer_proc.tools.parsers import HermesParser

ASK = [{"role": "user", "content": "Weather in Paris?"}]
TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def r1(tokenizer):
    return app_client(tokenizer, in_pieces(CALL), {"tool_parser": HermesParser, "reasoning_parser": "deepseek_r1"})


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_call_is_a_call_not_reasoning(r1, stream):
    client, manager = r1
    r = client.post(
        "/v1/chat/completions",
        json={"messages": ASK, "tools": [TOOL], "tool_choice": "required", "max_tokens": 40, "stream": stream},
    )
    assert r.status_code == 200
    if stream:
        assert "reasoning" not in r.text and '"name":"get_weather"' in r.text.replace(" ", "")
    else:
        msg = r.json()["choices"][0]
        assert msg["finish_reason"] == "tool_calls" and "reasoning_content" not in msg["message"]
        assert msg["message"]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    assert manager.sent[-1].grammar is not None and manager.sent[-1].reasoning_budget is None


def test_response_format_output_is_content(r1):
    client, _ = r1
    msg = client.post(
        "/v1/chat/completions", json={"messages": ASK, "response_format": {"type": "json_object"}, "max_tokens": 40}
    ).json()["choices"][0]["message"]
    assert msg["content"] == CALL and "reasoning_content" not in msg


@pytest.mark.parametrize(
    "route,body",
    [
        (
            "/v1/chat/completions",
            {"messages": ASK, "max_tokens": 8, "chat_template_kwargs": {"enable_thinking": False}},
        ),
        ("/v1/messages", {"model": "m", "messages": ASK, "max_tokens": 8, "thinking": {"type": "disabled"}}),
    ],
)
def test_thinking_turned_off_closes_the_block_at_once(r1, route, body):
    client, manager = r1
    assert client.post(route, json=body).status_code == 200
    budget = manager.sent[-1].reasoning_budget
    assert budget.budget == 0 and budget.inside


@pytest.mark.parametrize(
    "route,body,want",
    [
        ("/v1/chat/completions", {"messages": ASK, "max_tokens": 8, "thinking_token_budget": 3}, 3),
        ("/v1/responses", {"input": "Hi", "max_output_tokens": 8, "thinking_token_budget": 4}, 4),
        (
            "/v1/messages",
            {"model": "m", "messages": ASK, "max_tokens": 8, "thinking": {"type": "enabled", "budget_tokens": 5}},
            5,
        ),
    ],
)
def test_budgets_reach_the_request(r1, route, body, want):
    client, manager = r1
    assert client.post(route, json=body).status_code == 200
    assert manager.sent[-1].reasoning_budget.budget == want


@pytest.mark.parametrize(
    "route,body,param",
    [
        ("/v1/completions", {"prompt": "Hi", "thinking_token_budget": 3}, "thinking_token_budget"),
        (
            "/v1/chat/completions",
            {"messages": ASK, "thinking_token_budget": 3, "tools": [TOOL], "tool_choice": "required"},
            "thinking_token_budget",
        ),
        (
            "/v1/chat/completions",
            {
                "messages": ASK,
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
            },
            "tools.0.function.parameters",
        ),
        ("/v1/chat/completions", {"messages": ASK + [{"role": "tool", "content": "18C"}]}, "messages.1.tool_call_id"),
        (
            "/v1/chat/completions",
            {
                "messages": ASK
                + [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1, 2]"}}
                        ],
                    }
                ]
            },
            "messages.1.tool_calls.0.function.arguments",
        ),
    ],
)
def test_refused_where_it_cannot_apply(r1, route, body, param):
    r = r1[0].post(route, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_anthropic_budget_must_stay_below_max_tokens(r1):
    r = r1[0].post(
        "/v1/messages",
        json={"model": "m", "messages": ASK, "max_tokens": 8, "thinking": {"type": "enabled", "budget_tokens": 8}},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "thinking.budget_tokens"
    assert "less than max_tokens" in r.json()["error"]["message"]
