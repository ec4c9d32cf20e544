"""The app in-process against `test_http_output.FakeManager` (scripted deltas, no model
server), for the API-shape tests of the Anthropic, Responses and utility routes."""

from __future__ import annotations

from typing import Callable

from fastapi.testclient import TestClient

from tests.test_http_output import IM_END, VOCAB, FakeManager
from tokenizer_proc.hf_tokenizer import ModelFacts
from tokenizer_proc.request_builder import RequestBuilder
from tokenizer_proc.server import create_app
from tokenizer_proc.tokenizer_manager import Delta

CONTEXT = 8192


def app_client(tokenizer, script: Callable[..., list], **app_kwargs) -> tuple[TestClient, FakeManager]:
    """A test client of the app served as model "m" (context `CONTEXT`) whose manager answers
    every request with `script(req)`'s deltas."""
    builder = RequestBuilder(tokenizer, ModelFacts(CONTEXT, (IM_END,), VOCAB), {"m"}, max_n=4)
    manager = FakeManager(script)
    return TestClient(create_app(manager, builder, "m", **app_kwargs)), manager


def deltas(*steps: Delta) -> Callable[..., list]:
    """A script answering every request with `steps`."""
    return lambda req: list(steps)


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
