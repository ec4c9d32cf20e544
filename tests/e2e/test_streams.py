"""Many concurrent streams under a busy CPU (issue 14 item 6): 32 streams at once, chat and
completions, prompts in mixed scripts (Latin, CJK, emoji, code), stop strings, max_tokens
from 1 to 64, greedy and seeded sampling, while another process spins a core. Every stream
ends with a finish reason and ``data: [DONE]``, every SSE data line is JSON, no stop string
shows in a text that stopped, and each greedy stream's text equals the same request sent
without streaming in the same conditions (a concurrent wave; on the tiny random model).
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from bench.busy_core import spinning
from bench.outcome import send

PROMPTS = [
    "Once upon a time in a small village,",
    "東京は日本の首都です。次の文を続けてください：",
    "Write a haiku about the sea 🌊🐚 and the moon 🌙",
    "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n",
    "Привет! Как дела? Ответь коротко.",
    "نص عربي قصير مع أرقام 123 و emoji 😀",
    '{"name": "lazyserve", "version": ',
    "Mélange: café, naïve, façade — 咖啡 ☕ and code `x += 1`",
]
STOPS = [None, ["e"], ["。", "\n"], ["😀", "the"], [" "], None, ["a", "o"]]
STREAMS = 32


def spec(i: int) -> tuple[str, dict, bool]:
    """Request `i`: (path, body without ``stream``, greedy)."""
    greedy = i % 4 != 3
    body: dict = {"max_tokens": 1 + (i * 7) % 64, "temperature": 0 if greedy else 0.8}
    if not greedy:
        body["seed"] = i
    if (stop := STOPS[i % len(STOPS)]) is not None:
        body["stop"] = stop
    prompt = PROMPTS[i % len(PROMPTS)]
    if i % 3 == 1:
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": prompt}]}, greedy
    return "/v1/completions", {**body, "prompt": prompt}, greedy


async def wave(url: str, stream: bool, indexes: list[int]):
    """Send requests `indexes` all at once; their `bench.outcome.Outcome`s."""
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=STREAMS)) as client:
        return await asyncio.gather(*(send(client, url, spec(i)[0], {**spec(i)[1], "stream": stream}) for i in indexes))


@pytest.fixture(scope="module")
def busy_core():
    with spinning():
        yield


def test_many_mixed_streams_under_cpu_load(tiny_server, busy_core):
    url = tiny_server.base_url
    greedy = [i for i in range(STREAMS) if spec(i)[2]]
    plain = dict(zip(greedy, asyncio.run(wave(url, False, greedy))))
    streamed = asyncio.run(wave(url, True, list(range(STREAMS))))
    for i, out in enumerate(streamed):
        assert out.complete(1, True), (i, spec(i), out)
        assert out.chunks >= 2, (i, out)  # a finish chunk, then [DONE]
        stop = spec(i)[1].get("stop") or []
        assert not any(s in out.text[0] for s in stop), (i, stop, out.text[0])  # the first match ends the text
        if i in plain:
            assert plain[i].complete(1, False), (i, plain[i])
            assert (out.text[0], out.finish[0]) == (plain[i].text[0], plain[i].finish[0]), (i, spec(i))
    reasons = [out.finish[0] for out in streamed]
    assert reasons.count("stop") >= 3 and reasons.count("length") >= 3, reasons
