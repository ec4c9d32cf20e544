"""The app in-process against `test_http_output.FakeManager` (scripted deltas, no model
server), for the API-shape tests of the Anthropic, Responses and utility routes."""

from __future__ import annotations

from typing import Callable

from fastapi.testclient import TestClient

from protocol.enums import FinishReason
from tests.test_http_output import IM_END, VOCAB, FakeManager
from text.hf_tokenizer import ModelFacts
from tokenizer_proc.request.builder import RequestBuilder
from tokenizer_proc.app import create_app
from tokenizer_proc.link.tokenizer_manager import Delta
from tokenizer_proc.tools.parsers import HermesParser

CONTEXT = 8192


def app_client(tokenizer, script: Callable[..., list], builder_kwargs: dict | None = None,
               **app_kwargs) -> tuple[TestClient, FakeManager]:
    """A test client of the app served as model "m" (context `CONTEXT`) whose manager answers
    every request with `script(req)`'s deltas; builder_kwargs: more `RequestBuilder`
    arguments (tool_parser, reasoning_parser)."""
    builder = RequestBuilder(tokenizer, ModelFacts(CONTEXT, (IM_END,), VOCAB), ("m",), max_n=4, max_batch_choices=5,
                             **(builder_kwargs or {}))
    manager = FakeManager(script)
    return TestClient(create_app(manager, builder, "m", **app_kwargs)), manager


def deltas(*steps: Delta) -> Callable[..., list]:
    """A script answering every request with `steps`."""
    return lambda req: list(steps)


HELLO = deltas(Delta(" Hel", 2, cached_tokens=3), Delta("lo", 4, FinishReason.STOP, IM_END, cached_tokens=3))
"""Every request answered " Hello" in two steps, ending at the chat's end of turn (3 cached)."""


def sse_events(text: str) -> list[tuple[str | None, str]]:
    """(event name or None, data) of each event of an SSE body (comments skipped)."""
    out = []
    for block in text.split("\n\n"):
        name, data = None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        if data is not None:
            out.append((name, data))
    return out


AGENT_OUTPUT = ('<think>The user wants the weather.</think>Let me check.<tool_call>\n'
                '{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>')
"""A model output with reasoning, text and one Hermes-style tool call."""
AGENT_PARSERS = {"tool_parser": HermesParser, "reasoning_parser": "qwen3"}
"""Builder arguments that parse `AGENT_OUTPUT` (as --tool-call-parser hermes --reasoning-parser qwen3)."""
CALL_THEN_TEXT = deltas(Delta('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', 5),
                        Delta('is"}}\n</tool_call>\nDone.', 12, FinishReason.STOP, IM_END))
"""A Hermes-style call and text after it, the call's end and the text in one delta (several tokens)."""


def in_pieces(text: str, size: int = 7) -> Callable[..., list]:
    """A script answering every request with `text` in pieces of `size` characters, ending with EOS."""
    pieces = [text[i:i + size] for i in range(0, len(text), size)]
    return lambda req: [Delta(p, i + 1, FinishReason.STOP if i == len(pieces) - 1 else None,
                              IM_END if i == len(pieces) - 1 else None) for i, p in enumerate(pieces)]
