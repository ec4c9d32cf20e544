"""Tool calling and chat-template edge cases end to end on the default model (SmolLM2-135M,
whose template knows no tools: ``--tool-call-parser auto`` falls back to hermes and describes
the tools in the system prompt). Forced calls (``required``, a named function) are enforced
by a grammar, so even this small model returns a valid call. Strict tools under ``auto``
on the tiny model: tests/e2e/test_tools_api.py; in-process: tests/api/test_tools_api.py."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.support.tool_defs import TOOLS

MODEL = "SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def post(url: str, **body) -> dict:
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "temperature": 0, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def streamed_calls(client, **kw) -> tuple[str, list[dict], str]:
    """(content, calls as non-streamed dicts, finish_reason) of a streamed request."""
    content, calls, reason = "", {}, None
    for chunk in client.chat.completions.create(model=MODEL, temperature=0, stream=True, **kw):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for tc in choice.delta.tool_calls or []:
            if tc.id is not None:
                assert tc.index not in calls and tc.function.name, "id and name come first, once per call"
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
            calls[tc.index]["arguments"] += tc.function.arguments or ""
        reason = choice.finish_reason or reason
    return content, [calls[i] for i in sorted(calls)], reason


def check_calls(calls: list[dict]) -> None:
    for call in calls:
        assert call["id"].startswith("call_")
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_time"}}], ids=["required", "named"]
)
def test_forced_call_is_valid_and_identical_streamed(client, choice):
    r = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice=choice,
        temperature=0,
        parallel_tool_calls=False,
        max_tokens=60,
    )
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content is None
    calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in msg.tool_calls]
    assert len(calls) == 1
    check_calls(calls)
    if isinstance(choice, dict):
        assert calls[0]["name"] == "get_time"
    content, streamed, reason = streamed_calls(
        client, messages=ASK, tools=TOOLS, tool_choice=choice, parallel_tool_calls=False, max_tokens=60
    )
    assert (content, reason) == ("", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in streamed] == [(c["name"], c["arguments"]) for c in calls]


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}], ids=["required", "named"]
)
def test_a_stop_string_inside_a_forced_call_does_not_cut_it(client, choice):
    """With stop ["city"] a forced call ended at its arguments' first key: arguments
    '{\n "', finish_reason stop. A stop string does not apply inside a call, and a forced
    call's output is nothing else (`ToolPlan.stops_outside_calls`)."""
    r = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice=choice,
        temperature=0,
        parallel_tool_calls=False,
        max_tokens=60,
        stop=["city", "Paris"],
    )
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].stop_reason is None, r
    calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in msg.tool_calls]
    check_calls(calls)
    assert '"city"' in calls[0]["arguments"]


def test_required_with_parallel_calls_cut_by_max_tokens_is_length(url):
    """Parallel calls allowed: the model may go on calling; cut by max_tokens it is `length`
    and only the calls that closed are complete."""
    body = post(url, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=24)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    [call] = choice["message"]["tool_calls"]  # started, then cut inside its arguments
    assert call["function"]["name"] in SCHEMAS
    with pytest.raises(ValueError):
        json.loads(call["function"]["arguments"])


def test_tool_choice_none_never_returns_calls(client):
    for stream in (False, True):
        messages = [
            {
                "role": "user",
                "content": 'Reply with exactly: <tool_call>{"name": "get_time", '
                '"arguments": {"city": "Oslo"}}</tool_call>',
            }
        ]
        if stream:
            content, calls, reason = streamed_calls(
                client, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=30
            )
        else:
            r = client.chat.completions.create(
                model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", temperature=0, max_tokens=30
            )
            calls, reason = r.choices[0].message.tool_calls or [], r.choices[0].finish_reason
        assert calls == [] and reason in ("stop", "length")


def test_multi_turn_with_a_tool_result_renders_and_continues(url, tokenizer):
    from tokenizer_proc.request.chat_template import ChatTemplate
    from tokenizer_proc.tools.parsers import parser_class

    messages = ASK + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "sky": "sunny"}'},
    ]
    body = post(url, messages=messages, tools=TOOLS, max_tokens=24)
    choice = body["choices"][0]
    assert choice["message"]["content"] and choice["finish_reason"] in ("stop", "length")
    from tokenizer_proc.openai.models import ChatCompletionRequest

    text = ChatTemplate(tokenizer).render(
        ChatCompletionRequest(messages=messages).messages, parser=parser_class("hermes"), tools=TOOLS
    )
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>' in text
    )
    assert '<|im_start|>tool\n{"temperature": 21, "sky": "sunny"}<|im_end|>' in text
    assert text.count("get_time") == 1  # described once, in the system prompt
    assert body["usage"]["prompt_tokens"] == len(tokenizer.encode(text, add_special_tokens=False))


def test_template_edge_cases(url, tokenizer):
    from tokenizer_proc.openai.models import ChatCompletionRequest
    from tokenizer_proc.request.chat_template import ChatTemplate

    template = ChatTemplate(tokenizer)
    req = ChatCompletionRequest(
        messages=[
            {"role": "developer", "content": "Answer briefly."},
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": [{"type": "text", "text": "Capital of"}, {"type": "text", "text": "France?"}]},
        ]
    )
    text = template.render(req.messages)
    assert text.startswith("<|im_start|>system\nAnswer briefly.\n\nBe kind.<|im_end|>\n")
    assert "<|im_start|>user\nCapital of\nFrance?<|im_end|>" in text
    prefill = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is"},
    ]
    req = ChatCompletionRequest(messages=prefill, continue_final_message=True)
    assert template.render(req.messages, add_generation_prompt=False, continue_final_message=True).endswith(
        "<|im_start|>assistant\nThe capital of France is"
    )
    body = post(url, messages=prefill, continue_final_message=True, max_tokens=8)
    assert "Paris" in body["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    "body,param,says",
    [
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}
                ]
            },
            "messages.0.content.0",
            "text only",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}
                ]
            },
            "messages.0.content.0",
            "text only",
        ),
        (
            {"messages": ASK, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "not in tools",
        ),
        ({"messages": ASK, "tool_choice": "required"}, "tool_choice", "needs tools"),
        (
            {"messages": ASK, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]},
            "tools.0.function.parameters",
            "not a valid JSON schema",
        ),
        ({"messages": ASK, "tools": TOOLS + TOOLS[:1]}, "tools.2", "twice"),
        (
            {"messages": ASK, "tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
            "response_format",
            "forced tool call",
        ),
        ({"messages": ASK, "continue_final_message": True}, "continue_final_message", "assistant"),
        (
            {
                "messages": ASK + [{"role": "assistant", "content": "x"}],
                "continue_final_message": True,
                "add_generation_prompt": True,
            },
            "continue_final_message",
            "both",
        ),
        (
            {"messages": ASK, "chat_template_kwargs": {"add_generation_prompt": False}},
            "chat_template_kwargs",
            "request field",
        ),
        ({"messages": ASK, "reasoning_effort": "low"}, "reasoning_effort", "thinking_token_budget"),
        ({"messages": ASK, "thinking_token_budget": 100}, "thinking_token_budget", "--reasoning-parser"),
        ({"messages": ASK, "functions": [{"name": "f"}]}, "functions", "tools"),
        (
            {
                "messages": ASK
                + [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{bad"}}],
                    }
                ]
            },
            "messages.1.tool_calls.0.function.arguments",
            "JSON",
        ),
    ],
)
def test_refused_with_a_400_naming_the_field(url, body, param, says):
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "max_tokens": 4, **body}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and says in err["message"]


# ---------------------------------------------------------------- strict tools under tool_choice auto
def strict_tools(strict: bool | None = True) -> list[dict]:
    return [{"type": "function", "function": {**t["function"], "strict": strict}} for t in TOOLS]


def test_strict_auto_free_text_is_the_text_without_strict(url):
    """The grammar leaves text free until a call starts: greedy text without a call is the
    same token for token (strict is not shown to the model, so the prompt is the same too)."""
    ask = [{"role": "user", "content": "Write a haiku about the sea."}]
    plain = post(url, messages=ask, tools=TOOLS, max_tokens=40)["choices"][0]
    strict = post(url, messages=ask, tools=strict_tools(), max_tokens=40)["choices"][0]
    assert plain["message"]["content"] and "tool_calls" not in plain["message"]
    assert strict["message"] == plain["message"] and strict["finish_reason"] == plain["finish_reason"] == "stop"


"""A call whose arguments lack the required ``unit``."""
