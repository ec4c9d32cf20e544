"""Prefix cache and KV memory on real processes (cases P1, P2 of serving-cases.md): warm
output equals cold output token for token, usage reports the hit, retraction under a
tiny pool loses nothing, and the slot accounting returns to idle."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.support.launcher import Server
from tests.support.pool_state import metrics, wait_idle

pytestmark = pytest.mark.slow  # default-model servers of its own

C = 64  # the test server's chunk size
N = 16  # completion tokens of the S and L cases
POOL = 600
"""KV pool (tokens) of the cold server: room for its longest request (L: 500 + `N`), too
little for the retraction test's 6 requests at once."""
TEXT = (
    "The history of bread begins in the Neolithic era, when people first ground grains and mixed them with water. "
    "Over thousands of years bakers learned to use yeast, to build ovens, and to shape loaves of many kinds. "
    "Today bread is eaten all over the world, from flat breads baked on hot stones to tall loaves in bakeries. "
)


def complete(url: str, prompt, max_tokens: int, **kw) -> dict:
    r = httpx.post(
        f"{url}/v1/completions",
        json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, **kw},
        timeout=300,
    )
    assert r.status_code == 200, r.text
    return r.json()


def stream_text(url: str, prompt, max_tokens: int) -> str:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    out = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                import json

                chunk = json.loads(line[6:])
                if chunk["choices"]:
                    out.append(chunk["choices"][0]["text"])
    return "".join(out)


@pytest.fixture(scope="module")
def ids(tokenizer) -> list[int]:
    out = tokenizer.encode(TEXT * 30, add_special_tokens=False)
    assert len(out) > 1200
    return out


@pytest.fixture(scope="module")
def cold_server(tmp_path_factory):
    """A server without prefix cache, without chunking and with a `POOL`-token KV pool: it
    computes the cold references, then runs the retraction test."""
    server = Server(
        ["--disable-radix-cache", "--chunked-prefill-size", "0", "--max-total-tokens", str(POOL)],
        tmp_path_factory.mktemp("cold") / "log",
    )
    yield server
    server.stop()


@pytest.fixture(scope="module")
def cold(ids, cold_server):
    """Cold references from `cold_server`."""
    url = cold_server.base_url
    refs = {
        "S": complete(url, ids[:200], N),
        "L": complete(url, ids[:500], N),
        "S1": complete(url, ids[:200], 1),
    }
    for k, n in enumerate((C - 1, C, C + 1, 2 * C - 1, 2 * C, 2 * C + 1)):
        refs[("chunk", n)] = complete(url, ids[300 : 300 + n], 8)
        refs[("chunk", n, 1)] = complete(url, ids[1500 + 7 * k : 1500 + 7 * k + n], 1)
    turn1 = [{"role": "user", "content": "Tell me about bread in two sentences."}]
    r1 = httpx.post(
        f"{url}/v1/chat/completions", json={"messages": turn1, "max_tokens": 32, "temperature": 0}, timeout=300
    ).json()
    turn2 = turn1 + [r1["choices"][0]["message"], {"role": "user", "content": "And about yeast?"}]
    r2 = httpx.post(
        f"{url}/v1/chat/completions", json={"messages": turn2, "max_tokens": 32, "temperature": 0}, timeout=300
    ).json()
    refs["chat"] = (turn1, r1, turn2, r2)
    return refs


@pytest.fixture(scope="module")
def warm_url(tmp_path_factory):
    """A server with the prefix cache and `C`-token chunks; its 4,096-token pool holds every
    prompt of the module (under 2,100 tokens) without evicting any."""
    server = Server(
        ["--chunked-prefill-size", str(C), "--max-total-tokens", "4096"], tmp_path_factory.mktemp("warm") / "log"
    )
    yield server.base_url
    server.stop()


def same(a: dict, b: dict) -> None:
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    assert a["usage"]["prompt_tokens"] == b["usage"]["prompt_tokens"]
    assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"]


def test_p1_exact_and_strict_prefix_hits(warm_url, cold, ids):
    same(complete(warm_url, ids[:200], N), cold["S"])
    same(complete(warm_url, ids[:500], N), cold["L"])
    again = complete(warm_url, ids[:200], N)
    same(again, cold["S"])
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 199  # all but the last token
    assert stream_text(warm_url, ids[:200], N) == cold["S"]["choices"][0]["text"]
    l_again = complete(warm_url, ids[:500], N)
    same(l_again, cold["L"])
    assert l_again["usage"]["prompt_tokens_details"]["cached_tokens"] == 499
    same(complete(warm_url, ids[:200], 1), cold["S1"])
    wait_idle(warm_url, 5)


def test_flush_cache_drops_the_cached_prefixes(warm_url, cold, ids):
    """``/flush_cache`` (SGLang's route) frees what the cache holds: the next run of a prompt
    served from the cache before computes it whole, with the same output; a second flush frees
    nothing more."""
    complete(warm_url, ids[:200], N)
    assert complete(warm_url, ids[:200], N)["usage"]["prompt_tokens_details"]["cached_tokens"] == 199
    wait_idle(warm_url, 5)
    r = httpx.post(f"{warm_url}/flush_cache", timeout=60)
    assert r.status_code == 200 and r.json()["message"] == "Cache flushed." and r.json()["held_tokens"] == 0
    assert r.json()["freed_tokens"] >= 200
    cold_again = complete(warm_url, ids[:200], N)
    same(cold_again, cold["S"])
    assert cold_again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    wait_idle(warm_url, 5)
    httpx.get(f"{warm_url}/flush_cache", timeout=60)  # GET too, as SGLang
    assert httpx.post(f"{warm_url}/flush_cache", timeout=60).json()["freed_tokens"] == 0


def test_p2_chunk_boundaries_and_one_uncached_token(warm_url, cold, ids):
    """P2 with the server's chunk size set small (C): prompts of C-1 .. 2C+1 tokens, chunked
    on the warm server and whole on the cold one, give the same tokens, for max_tokens 8 and
    for max_tokens 1 (each from its own place in the periodic text, which no earlier prompt
    starts with, so that the whole prompt is computed in chunks)."""
    for k, n in enumerate((C - 1, C, C + 1, 2 * C - 1, 2 * C, 2 * C + 1)):
        got = complete(warm_url, ids[300 : 300 + n], 8)
        same(got, cold[("chunk", n)])
        one = complete(warm_url, ids[1500 + 7 * k : 1500 + 7 * k + n], 1)
        same(one, cold[("chunk", n, 1)])
        assert one["usage"]["completion_tokens"] == 1 and one["usage"]["prompt_tokens"] == n
        assert one["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # C-1 tokens are cached now; C tokens has one uncached token; C again is fully cached
    complete(warm_url, ids[1000 : 1000 + C - 1], 1)
    ref = complete(warm_url, ids[1000 : 1000 + C], 8)
    cached = ref["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == C - 1
    full = complete(warm_url, ids[1000 : 1000 + C], 8)
    assert full["usage"]["prompt_tokens_details"]["cached_tokens"] == C - 1  # the last token is recomputed
    same(full, ref)
    wait_idle(warm_url, 5)


def test_chat_turn_that_extends_an_earlier_turn(warm_url, cold):
    turn1, r1, turn2, r2 = cold["chat"]
    w1 = httpx.post(
        f"{warm_url}/v1/chat/completions", json={"messages": turn1, "max_tokens": 32, "temperature": 0}, timeout=300
    ).json()
    assert w1["choices"][0]["message"]["content"] == r1["choices"][0]["message"]["content"]
    w2 = httpx.post(
        f"{warm_url}/v1/chat/completions", json={"messages": turn2, "max_tokens": 32, "temperature": 0}, timeout=300
    ).json()
    assert w2["choices"][0]["message"]["content"] == r2["choices"][0]["message"]["content"]
    assert w2["usage"]["prompt_tokens_details"]["cached_tokens"] > w1["usage"]["prompt_tokens"] - 2


async def test_aborted_requests_sharing_the_prefix(warm_url, cold, ids):
    body = {"prompt": ids[:500], "max_tokens": 200, "temperature": 0, "ignore_eos": True, "stream": True}
    async with httpx.AsyncClient(timeout=120) as c:
        for _ in range(3):
            async with c.stream("POST", f"{warm_url}/v1/completions", json=body) as r:
                n = 0
                async for line in r.aiter_lines():
                    n += line.startswith("data: ")
                    if n >= 2:
                        break
    same(complete(warm_url, ids[:500], N), cold["L"])
    wait_idle(warm_url, 5)


def test_cache_salt_isolates_equal_prompts(warm_url, cold, ids):
    """vLLM's ``cache_salt``: a prompt cached without a salt, or under another salt, is not
    reused (cached_tokens 0, the same output as cold); under its own salt it is."""
    complete(warm_url, ids[:200], N)
    assert complete(warm_url, ids[:200], N)["usage"]["prompt_tokens_details"]["cached_tokens"] == 199
    first = complete(warm_url, ids[:200], N, cache_salt="tenant-a")
    same(first, cold["S"])
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    again = complete(warm_url, ids[:200], N, cache_salt="tenant-a")
    same(again, cold["S"])
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 199
    other = complete(warm_url, ids[:200], N, cache_salt="tenant-b")
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    wait_idle(warm_url, 5)


def test_tiny_pool_retracts_and_loses_nothing(cold_server):
    """A prompt larger than the whole 600-token pool is a clear 400; then 6 concurrent
    requests through that pool (prompts of 91 to 102 tokens, 40 generated each): all
    complete, each equals its solo run, and retractions happened. Admission reserves nothing
    for decoding, so it takes prompts while they fit: at least 5 (5 x 102 <= 600) holding more
    than 600 - 102 = 498 positions, which grow by 5 x 40 = 200 before any finishes. The real model,
    whose top-2 logit gaps are wide enough that recomputed KV gives the same greedy tokens.
    (The cold references ran before on this server, one at a time: retractions are counted
    from here.)"""
    url = cold_server.base_url
    OUT = 40
    r = httpx.post(f"{url}/v1/completions", json={"prompt": list(range(100, 100 + POOL + 100)), "max_tokens": 4})
    assert r.status_code == 400
    assert (
        f"the KV cache can ever hold {POOL}, the prompt and at least one generated token: send at most "
        f"{POOL - 1} prompt tokens" in r.json()["error"]["message"]
    )
    prompts = [
        f"Request {i}: the numbers from {10 * i} on are " + " ".join(str(10 * i + k) for k in range(30))
        for i in range(6)
    ]
    solo = [complete(url, p, OUT)["choices"][0]["text"] for p in prompts]
    retractions = metrics(url)["lazyserve_retractions"]

    async def run_all():
        async with httpx.AsyncClient(timeout=300) as c:

            async def one(p):
                r = await c.post(
                    f"{url}/v1/completions", json={"prompt": p, "max_tokens": OUT, "temperature": 0, "ignore_eos": True}
                )
                return r.json()["choices"][0]["text"]

            return await asyncio.gather(*(one(p) for p in prompts))

    together = asyncio.run(run_all())
    assert together == solo
    assert metrics(url)["lazyserve_retractions"] > retractions
    wait_idle(url, 5)
