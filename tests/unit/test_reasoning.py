"""The <think> reasoning parser (tokenizer_proc/output/reasoning.py) on canned outputs split at
every position, where the output starts (from the rendered prompt), and together with the
tool parser (`ChatOutput`)."""

from __future__ import annotations

import pytest

from tokenizer_proc.output.chat_output import ChatOutput, OutputPlan
from tokenizer_proc.output.reasoning import ReasoningParser, starts_in_reasoning
from tokenizer_proc.tools.parsers import parser_class

CASES = [
    (
        False,
        "<think>\nLet me think: 2 < 3 </thinking> ok.\n</think>\n\nThe answer is 4.",
        "\nLet me think: 2 < 3 </thinking> ok.\n",
        "The answer is 4.",
    ),
    (False, "  <think>é🌍</think>Done <think>again</think>", "é🌍", "Done <think>again</think>"),
    (False, "No reasoning here. </think>", "", "No reasoning here. </think>"),
    (False, "<thinking is not a tag", "", "<thinking is not a tag"),
    (True, "reasoning from the prompt's open block</think>answer", "reasoning from the prompt's open block", "answer"),
    # a </think> cut short (the token limit or a stop string inside the tag a reasoning budget
    # forces) is markup, not reasoning text; a lone "<" is text
    (True, "cut off while reasoning </thi", "cut off while reasoning ", ""),
    (True, "returnreturn</", "returnreturn", ""),
    (True, "a <", "a <", ""),
    (False, "<think>never closed", "never closed", ""),
]


def split(parser: ReasoningParser, pieces: list[str]) -> tuple[str, str]:
    reasoning = content = ""
    for piece in pieces:
        d = parser.feed(piece)
        reasoning, content = reasoning + d.reasoning, content + d.content
    d = parser.finish()
    return reasoning + d.reasoning, content + d.content


@pytest.mark.parametrize("inside,text,reasoning,content", CASES)
def test_split_is_the_same_at_every_position(inside, text, reasoning, content):
    assert split(ReasoningParser(inside), [text]) == (reasoning, content)
    for k in range(len(text) + 1):
        assert split(ReasoningParser(inside), [text[:k], text[k:]]) == (reasoning, content), f"split at {k}"
    assert split(ReasoningParser(inside), list(text)) == (reasoning, content)


def test_tags_never_leak_into_a_stream():
    parser = ReasoningParser()
    shown = [parser.feed(c) for c in "<think>ab</think>cd"]
    assert not any("<" in d.content or "<" in d.reasoning for d in shown)


@pytest.mark.parametrize(
    "name,prompt,inside",
    [
        ("qwen3", "<|im_start|>assistant\n", False),
        ("qwen3", "<|im_start|>assistant\n<think>\n", True),
        ("qwen3", "<|im_start|>assistant\n<think>\n\n</think>\n\n", False),  # enable_thinking: false
        ("deepseek_r1", "<｜Assistant｜>", True),
        ("deepseek_r1", "<｜Assistant｜><think>\n\n</think>", False),
        ("smollm3", "<|im_start|>assistant\n", False),
    ],
)
def test_where_the_output_starts(name, prompt, inside):
    assert starts_in_reasoning(name, prompt) is inside


def test_reasoning_and_tool_calls_together():
    text = '<think>call <tool_call> here?</think>\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    whole = ChatOutput(OutputPlan(parser_class("hermes"), reasoning=True))
    whole.step(text, final=True)
    msg = whole.message()
    assert msg["reasoning_content"] == msg["reasoning"] == "call <tool_call> here?"
    assert msg["content"] is None and msg["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"a": 1}'}
    for k in range(len(text) + 1):
        out = ChatOutput(OutputPlan(parser_class("hermes"), reasoning=True))
        pieces = [out.step(text[:k]), out.step(text[k:], final=True)]
        assert "".join(p.reasoning for p in pieces) == msg["reasoning"]
        assert "".join(p.content for p in pieces) == ""
        assert out.calls()[0]["function"] == msg["tool_calls"][0]["function"]
