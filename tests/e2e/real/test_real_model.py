"""Integration tests on the default model, SmolLM2-135M-Instruct (cases S1-S3, F2, C1)."""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from tests.support.pool_state import wait_idle

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture
def aclient(url):
    """An async OpenAI client for one test (its connections belong to that test's event loop)."""
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none")


def chat_text(client, content: str, max_tokens: int = 64, **kw) -> str:
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=max_tokens, temperature=0, **kw
    )
    return r.choices[0].message.content


def chat_stream_deltas(client, content: str, max_tokens: int = 64) -> list[str]:
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=max_tokens, temperature=0, stream=True
    )
    return [c.choices[0].delta.content or "" for c in stream if c.choices]


def test_paris(client):
    r = client.chat.completions.create(
        model=MODEL,
        temperature=0,
        max_tokens=32,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    )
    assert "Paris" in r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"


def test_emoji_stream_equals_non_stream(client):
    """S1: multi-byte characters split across tokens stream byte-identically, never as U+FFFD."""
    prompt = "Copy this line exactly: 🌶️🍣 日本語 café ✓ 한국어"
    full = chat_text(client, prompt)
    deltas = chat_stream_deltas(client, prompt)
    assert "".join(deltas).encode() == full.encode()
    assert any(ord(ch) > 0xFFFF for ch in full), f"expected an emoji in {full!r}"
    if "\ufffd" not in full:
        assert not any("\ufffd" in d for d in deltas)


def test_spaces_between_chunks(client):
    """S2: streamed completion text equals the non-streamed text."""
    kw = dict(
        model=MODEL,
        prompt="The quick brown fox jumps over the lazy dog. The quick brown fox",
        max_tokens=96,
        temperature=0,
    )
    full = client.completions.create(**kw).choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, **kw) if c.choices)
    assert streamed == full


STOP_CASE = dict(model=MODEL, prompt="1 2 3 4 5 6 7 8 9 10 11", max_tokens=120, temperature=0)
"""The request of the stop-string cases (S3)."""


@pytest.fixture(scope="module")
def stop_ref(client) -> str:
    """The greedy text of `STOP_CASE` without a stop string (EOS ignored)."""
    return client.completions.create(extra_body={"ignore_eos": True}, **STOP_CASE).choices[0].text


@pytest.mark.parametrize("at_token", [10, 50, 100])
async def test_stop_string_spanning_tokens(aclient, tokenizer, stop_ref, at_token):
    """S3: a stop string spanning tokens ends the text right before it, streamed or not, and
    no character of it reaches a streaming client; include_stop_str_in_output keeps it. The
    three requests run together (greedy rows of one batch give their solo text)."""
    kw, ref = STOP_CASE, stop_ref
    ids = tokenizer.encode(ref, add_special_tokens=False)
    start = len(tokenizer.decode(ids[:at_token]))
    stop = ref[start - 2 : start + 3]
    assert len(stop) == 5
    cut = ref.index(stop)
    ends = [len(tokenizer.decode(ids[:k])) for k in range(len(ids) + 1)]
    assert sum(ends[k] < cut + len(stop) and ends[k + 1] > cut for k in range(len(ids))) >= 2  # spans tokens

    async def streamed() -> tuple[str, str | None]:
        text, reason = "", None
        async for c in await aclient.completions.create(stop=[stop], stream=True, **kw):
            if c.choices:
                text += c.choices[0].text
                reason = c.choices[0].finish_reason or reason
                assert ref[:cut].startswith(text)
        return text, reason

    r, (text, reason), inc = await asyncio.gather(
        aclient.completions.create(stop=[stop], **kw),
        streamed(),
        aclient.completions.create(stop=[stop], extra_body={"include_stop_str_in_output": True}, **kw),
    )
    assert r.choices[0].text == ref[:cut]
    assert r.choices[0].finish_reason == "stop"
    assert (text, reason) == (ref[:cut], "stop")
    assert inc.choices[0].text == ref[:cut] + stop


def test_special_tokens_and_eos(client):
    """F2: no chat markers in the content; it ends on EOS with "stop" before max_tokens."""
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi in one word."}], max_tokens=64, temperature=0
    )
    content = r.choices[0].message.content
    for marker in ("<|im_end|>", "<|im_start|>", "<|endoftext|>"):
        assert marker not in content
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].model_extra["stop_reason"] is None  # EOS, as vLLM reports it
    assert r.usage.completion_tokens < 64


def test_skip_special_tokens_false_shows_markers(client):
    r = client.completions.create(
        model=MODEL,
        prompt="<|im_start|>user\nHi<|im_end|>\n",
        max_tokens=6,
        temperature=0,
        extra_body={"skip_special_tokens": False, "ignore_eos": True},
    )
    assert "<|im_start|>" in r.choices[0].text


async def test_concurrent_equals_solo(client, aclient):
    """8 concurrent greedy requests give the same text as each sent alone (C1 in small)."""
    prompts = [
        "What is the capital of France?",
        "Name three colors.",
        "Explain why the sky is blue in three sentences.",
        "Write a haiku about the sea.",
        "What is 2+2?",
        "Give me a synonym for happy.",
        "List two fruits.",
        "Who wrote Hamlet?",
    ]
    solo = [chat_text(client, p, 32) for p in prompts]

    async def one(p: str) -> str:
        r = await aclient.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": p}], max_tokens=32, temperature=0
        )
        return r.choices[0].message.content

    together = await asyncio.gather(*(one(p) for p in prompts))
    assert list(together) == solo


SKY = "Explain why the sky is blue in three sentences."
"""The prompt of case C1."""


async def test_c1_greedy_is_the_same_in_sequence_and_in_16_identical_copies(client, aclient):
    """C1 (its batch of copies; the mix with 16 prompts of 5-1,500 tokens takes minutes on
    two CPU cores: ``python -m bench.mixed_case``): 5 sequential greedy runs of 96 tokens are
    identical, and 16 copies sent at once give that text too."""
    runs = [chat_text(client, SKY, 96) for _ in range(5)]
    assert len(set(runs)) == 1, runs
    copies = await asyncio.gather(
        *(
            aclient.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": SKY}], max_tokens=96, temperature=0
            )
            for _ in range(16)
        )
    )
    assert [c.choices[0].message.content for c in copies] == runs[:1] * 16


async def test_c2_twenty_streams_left_after_three_chunks_free_everything(url):
    """C2: a 4,000-token stream (ignore_eos) read for 3 chunks and closed, 20 times, beside a
    greedy request that runs through all of them and still gives its solo text; afterwards
    nothing runs and the KV pool is idle within 2 s."""
    neighbour = {
        "messages": [{"role": "user", "content": "Name three colors."}],
        "max_tokens": 200,
        "temperature": 0,
        "ignore_eos": True,
    }
    leaver = {
        "messages": [{"role": "user", "content": "Write a very long story."}],
        "max_tokens": 4000,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        solo = (await c.post("/v1/chat/completions", json=neighbour)).json()["choices"][0]["message"]["content"]
        beside = asyncio.create_task(c.post("/v1/chat/completions", json=neighbour))
        for _ in range(20):
            async with c.stream("POST", "/v1/chat/completions", json=leaver) as r:
                assert r.status_code == 200
                chunks = 0
                async for line in r.aiter_lines():
                    chunks += line.startswith("data: {")
                    if chunks == 3:
                        break
            assert chunks == 3
        together = (await beside).json()
    assert together["choices"][0]["message"]["content"] == solo
    assert together["usage"]["completion_tokens"] == 200
    await asyncio.to_thread(wait_idle, url, 2.0)


def test_liveness_after_everything(url):
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 4, "temperature": 0}, timeout=10)
    assert r.status_code == 200


def test_requests_used_both_detokenizer_replicas(url):
    """The cases above ran on 2 detokenizer replicas, taken in turn when equally loaded, so
    both rendered some of them."""
    st = httpx.get(f"{url}/v1/internal/detokenizers", timeout=10).json()
    assert [r["state"] for r in st["replicas"]] == ["live", "live"]
    assert all(r["routed"] >= 3 for r in st["replicas"]), st
