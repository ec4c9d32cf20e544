"""The app in-process against a fake manager (`FakeManager`: scripted deltas, no model
server), for the API-shape tests (tests/api/): `tok` and `builder` (fixtures, registered
by tests/api/conftest.py), `client_for` and its `two_steps` script, and `app_client` with the
scripts of the Anthropic, Responses and utility routes' tests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

import pytest
from fastapi.testclient import TestClient

from protocol.enums import FinishReason
from protocol.messages import GenerateReq, LogprobEntries
from text.hf_tokenizer import ModelFacts
from tokenizer_proc.app import create_app
from tokenizer_proc.link.metrics import RequestMetrics
from tokenizer_proc.link.request_hold import Hold
from tokenizer_proc.link.scheduler_probe import SchedulerProbe
from tokenizer_proc.link.tokenizer_manager import Delta
from tokenizer_proc.request.builder import RequestBuilder
from tokenizer_proc.tools.parsers import HermesParser

IM_END = 2
VOCAB = 49152


@pytest.fixture(scope="module")
def tok():
    from protocol.model_source import resolve_model
    from text.hf_tokenizer import load_tokenizer

    return load_tokenizer(resolve_model(None))


@pytest.fixture(scope="module")
def builder(tok):
    return RequestBuilder(tok, ModelFacts(8192, (IM_END,), VOCAB), ("m",), max_n=4, max_batch_choices=5)


class FakeManager:
    """Stands in for `TokenizerManager`: `script(req)` gives each request's deltas."""

    ready, stopping, detok_status, stats, in_flight, worker_down = True, False, None, None, 0, ""

    def __init__(self, script: Callable[[GenerateReq], list]) -> None:
        self.script = script
        self.sent: list[GenerateReq] = []
        self.client_rids: set[str] = set()
        self.client_gone: dict = {}
        self.metrics = RequestMetrics(lambda: None, lambda: 0)
        self.probe = SchedulerProbe(lambda _: None, 0)  # 0: never probes

    def check_can_start(self, rid: str, client_rid: str | None = None) -> None:
        pass

    def check_room(self, n: int) -> None:
        pass

    def hold(self, n: int, client_rids: tuple[str, ...] = (), gone=None) -> Hold:
        return Hold(self, n, client_rids, gone)

    def release_client_rids(self, ids) -> None:
        self.client_rids.difference_update(ids)

    async def wait_rids_free(self, ids) -> None:
        pass

    held = 0

    async def generate(
        self, req: GenerateReq, client_rid: str | None = None, hold: Hold | None = None
    ) -> AsyncIterator[Delta]:
        self.sent.append(req)
        for d in self.script(req):
            if isinstance(d, Exception):
                raise d
            yield d


def entries(
    start: int, tokens: list[str], lps: list[float], top: int = 0, ids: list[int] | None = None
) -> LogprobEntries:
    """Fake entries: token ids 100 + start + j; top alternatives: the token then "alt" (id 7, -5.0)
    and a masked "bad" (id 8, -inf)."""
    tids = ids or [100 + start + j for j in range(len(tokens))]
    if not top:
        return LogprobEntries(start, tids, tokens, [t.encode() for t in tokens], lps)
    alts = [(7, "alt", -5.0), (8, "bad", float("-inf"))][: top - 1]
    return LogprobEntries(
        start,
        tids,
        tokens,
        [t.encode() for t in tokens],
        lps,
        top_ids=[[t] + [a[0] for a in alts] for t in tids],
        top_tokens=[[tok] + [a[1] for a in alts] for tok in tokens],
        top_bytes=[[tok.encode()] + [a[1].encode() for a in alts] for tok in tokens],
        top_logprobs=[[lp] + [a[2] for a in alts] for lp in lps],
        ids_logprobs=[[-3.0] for _ in tokens],
    )


def two_steps(req: GenerateReq) -> list[Delta]:
    """ " Hel" + "lo" with 3 entries (the last one ends a request of 4 tokens with EOS)."""
    lp = req.sampling.wants_logprobs
    k = max(req.sampling.top_logprobs, 0)
    prompt = entries(0, [" world"], [-2.5], k) if req.sampling.logprob_start_len >= 0 else None
    return [
        Delta(" Hel", 2, logprobs=entries(0, [" H", "el"], [-0.5, -1.0], k) if lp else None, prompt_logprobs=prompt),
        Delta(
            "lo",
            4,
            FinishReason.STOP,
            IM_END,
            cached_tokens=1,
            logprobs=entries(2, ["lo"], [float("-inf")], k) if lp else None,
        ),
    ]


def client_for(builder, script=two_steps) -> tuple[TestClient, FakeManager]:
    manager = FakeManager(script)
    return TestClient(create_app(manager, builder, "m")), manager


def sse(r) -> list:
    out = []
    for line in r.text.splitlines():
        if line.startswith("data: "):
            payload = line[6:]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}


CONTEXT = 8192


def app_client(
    tokenizer, script: Callable[..., list], builder_kwargs: dict | None = None, **app_kwargs
) -> tuple[TestClient, FakeManager]:
    """A test client of the app served as model "m" (context `CONTEXT`) whose manager answers
    every request with `script(req)`'s deltas; builder_kwargs: more `RequestBuilder`
    arguments (tool_parser, reasoning_parser)."""
    builder = RequestBuilder(
        tokenizer, ModelFacts(CONTEXT, (IM_END,), VOCAB), ("m",), max_n=4, max_batch_choices=5, **(builder_kwargs or {})
    )
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


AGENT_OUTPUT = (
    "<think>The user wants the weather.</think>Let me check.<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>'
)
"""A model output with reasoning, text and one Hermes-style tool call."""
AGENT_PARSERS = {"tool_parser": HermesParser, "reasoning_parser": "qwen3"}
"""Builder arguments that parse `AGENT_OUTPUT` (as --tool-call-parser hermes --reasoning-parser qwen3)."""
CALL_THEN_TEXT = deltas(
    Delta('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', 5),
    Delta('is"}}\n</tool_call>\nDone.', 12, FinishReason.STOP, IM_END),
)
"""A Hermes-style call and text after it, the call's end and the text in one delta (several tokens)."""


def in_pieces(text: str, size: int = 7) -> Callable[..., list]:
    """A script answering every request with `text` in pieces of `size` characters, ending with EOS."""
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    return lambda req: [
        Delta(p, i + 1, FinishReason.STOP if i == len(pieces) - 1 else None, IM_END if i == len(pieces) - 1 else None)
        for i, p in enumerate(pieces)
    ]
