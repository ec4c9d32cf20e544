"""Reasoning end to end: a tiny random-weight model with a Qwen3-style chat template, served
with ``--reasoning-parser qwen3``, made to write chosen texts one character per token (a
custom logit processor, `tests.support.forced_tokens`), so the ``<think>`` tags fall across every
token (and so stream chunk) boundary: streamed and non-streamed splits agree and are right;
``chat_template_kwargs`` reaches the template; ``thinking_token_budget`` closes the block
after that many tokens (the template opens it, as R1 distills' do, when asked)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.launcher import Server, stop_and_check

QWEN_STYLE = (
    "{%- for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- if open_think is defined and open_think %}{{ '<think>\\n' }}{%- endif %}"
    "{%- endif %}"
)
ASK = [{"role": "user", "content": "Hi"}]
TEXTS = [
    ("<think>\nstep 1 < 2</think>\n\nans <think>x", "\nstep 1 < 2", "ans <think>x"),
    ("plain </think> text", "", "plain </think> text"),
    ("<think>unfinished </thi", "unfinished ", ""),  # a cut </think> is markup, not reasoning
]


@pytest.fixture(scope="module")
def server(tiny_model_dir, tokenizer, tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-qwen-style")
    for name in ("model.safetensors", "config.json"):
        (path / name).symlink_to(tiny_model_dir / name)
    tok = type(tokenizer).from_pretrained(str(tiny_model_dir))
    tok.chat_template = QWEN_STYLE
    tok.save_pretrained(str(path))
    server = Server(
        [
            "--model",
            str(path),
            "--reasoning-parser",
            "qwen3",
            "--enable-custom-logit-processor",
            "--logit-processor-module",
            "tests.support.forced_tokens",
        ],
        path / "server.log",
    )
    yield server
    stop_and_check(server)


def one_token_per_char(tokenizer, text: str) -> list[int]:
    ids = [tokenizer.encode(ch, add_special_tokens=False) for ch in text]
    assert all(len(i) == 1 for i in ids), "each character must be one token"
    return [i[0] for i in ids]


def body(tokenizer, text: str, **extra) -> dict:
    return {
        "messages": ASK,
        "temperature": 0,
        "max_tokens": 64,
        "custom_logit_processor": "forced",
        "custom_params": {"ids": one_token_per_char(tokenizer, text), "eos": tokenizer.eos_token_id},
        **extra,
    }


def streamed(url: str, payload: dict) -> tuple[str, str, int]:
    """(reasoning, content, chunks that showed text) of a streamed request."""
    reasoning = content = ""
    shown = 0
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**payload, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"]
            assert delta.get("reasoning") == delta.get("reasoning_content")
            reasoning += delta.get("reasoning_content") or ""
            content += delta.get("content") or ""
            shown += bool(delta.get("reasoning_content") or delta.get("content"))
    return reasoning, content, shown


@pytest.mark.parametrize("text,reasoning,content", TEXTS)
def test_streamed_and_whole_splits_agree_at_every_boundary(server, tokenizer, text, reasoning, content):
    payload = body(tokenizer, text)
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=payload, timeout=60).json()
    msg = r["choices"][0]["message"]
    assert r["usage"]["completion_tokens"] == len(text) + 1 and r["choices"][0]["finish_reason"] == "stop"
    assert (msg["reasoning_content"] or "", msg["content"] or "") == (reasoning, content)
    assert msg["reasoning"] == msg["reasoning_content"]
    got_reasoning, got_content, shown = streamed(server.base_url, payload)
    assert (got_reasoning, got_content) == (reasoning, content)
    assert shown > len(text) // 3  # the text came in many chunks, not one


def test_chat_template_kwargs_reach_the_template(server, tokenizer):
    url = f"{server.base_url}/v1/chat/completions"
    on = httpx.post(url, json=body(tokenizer, "ok"), timeout=60).json()
    off = httpx.post(
        url, json=body(tokenizer, "ok", chat_template_kwargs={"enable_thinking": False}), timeout=60
    ).json()
    closed_block = len(tokenizer.encode("<think>\n\n</think>\n\n", add_special_tokens=False))
    assert off["usage"]["prompt_tokens"] == on["usage"]["prompt_tokens"] + closed_block
    assert off["choices"][0]["message"]["content"] == "ok"


@pytest.mark.parametrize("budget", [None, 0, 3])
def test_thinking_token_budget_closes_the_block(server, tokenizer, budget):
    a = tokenizer.encode("a", add_special_tokens=False)
    close = len(tokenizer.encode("</think>", add_special_tokens=False))
    payload = {
        "messages": ASK,
        "temperature": 0,
        "max_tokens": 12,
        "logit_bias": {str(a[0]): 100},
        "chat_template_kwargs": {"open_think": True},
        "thinking_token_budget": budget,
    }
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=payload, timeout=60).json()
    msg = r["choices"][0]["message"]
    want = ("a" * 12, None) if budget is None else ("a" * budget or None, "a" * (12 - budget - close))
    assert (msg["reasoning_content"], msg["content"] or None) == want, r
    assert r["usage"]["completion_tokens"] == 12 and r["choices"][0]["finish_reason"] == "length"
    reasoning, content, _ = streamed(server.base_url, payload)
    assert (reasoning or None, content or None) == want


def test_a_forced_closing_tag_cut_by_max_tokens_does_not_leak(server, tokenizer):
    """The budget forces </think> as several tokens (`</`, `think`, `>`); max_tokens ending
    inside them left `</` or `</think` at the end of reasoning_content, streamed and not."""
    a = tokenizer.encode("a", add_special_tokens=False)
    close = len(tokenizer.encode("</think>", add_special_tokens=False))
    assert close > 1
    for cut in range(1, close):
        payload = {
            "messages": ASK,
            "temperature": 0,
            "max_tokens": 3 + cut,
            "logit_bias": {str(a[0]): 100},
            "chat_template_kwargs": {"open_think": True},
            "thinking_token_budget": 3,
        }
        r = httpx.post(f"{server.base_url}/v1/chat/completions", json=payload, timeout=60).json()
        msg = r["choices"][0]["message"]
        assert (msg["reasoning_content"], msg["content"], r["choices"][0]["finish_reason"]) == ("aaa", None, "length")
        reasoning, content, _ = streamed(server.base_url, payload)
        assert (reasoning, content or None) == ("aaa", None)


def test_thinking_token_budget_is_refused_under_a_grammar(server):
    r = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        timeout=60,
        json={"messages": ASK, "max_tokens": 4, "thinking_token_budget": 2, "response_format": {"type": "json_object"}},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "thinking_token_budget"


def test_a_strict_tool_under_auto_leaves_the_think_block_free_and_enforces_the_call_after_it(server, tokenizer):
    """The strict ``auto`` grammar (`tools.grammar.auto_calls`) with a reasoning parser: a call
    marker inside the think block is free text; the call after it is enforced (the model
    wants arguments without the required ``unit``)."""
    enc = lambda t: tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
    }
    text = (
        '<think>use <tool_call>{bad</think>\nSure. <tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call>'
    )
    payload = {
        "messages": ASK,
        "temperature": 0,
        "max_tokens": 80,
        "custom_logit_processor": "ranked",
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": schema, "strict": True}}],
        "custom_params": {
            "ids": enc(text),
            "eos": tokenizer.eos_token_id,
            "fallback": list(dict.fromkeys(enc(', "unit": "celsius"}}\n</tool_call>'))),
        },
    }
    r = httpx.post(f"{server.base_url}/v1/chat/completions", json=payload, timeout=60).json()
    choice = r["choices"][0]
    msg = choice["message"]
    assert (msg["reasoning_content"], msg["content"], choice["finish_reason"]) == (
        "use <tool_call>{bad",
        "Sure.",
        "tool_calls",
    ), r
    assert [json.loads(c["function"]["arguments"]) for c in msg["tool_calls"]] == [{"city": "Paris", "unit": "celsius"}]
