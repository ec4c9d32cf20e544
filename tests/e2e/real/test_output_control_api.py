"""Output control end to end on the default model (cases F1, F3, J1 and the issue's list):
seeds and penalties in mixed concurrent batches, n > 1, logprobs streamed and not, prompt
logprobs against a plain mlx-lm forward pass, structured output."""

from __future__ import annotations

import asyncio
import json
import random
import re

import httpx
import jsonschema
import pytest

MODEL = "SmolLM2-135M-Instruct"
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}


def chat(url: str, content: str, **kw) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 24, **kw}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


async def achat(c: httpx.AsyncClient, url: str, content: str, **kw) -> dict:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 24, **kw}
    r = await c.post(f"{url}/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def texts(resp: dict) -> list[str]:
    return [c["message"]["content"] for c in sorted(resp["choices"], key=lambda c: c["index"])]


# ---------------------------------------------------------------------- F1
def test_f1_logit_bias(url, tokenizer):
    base = {"temperature": 0, "max_tokens": 1}
    first = chat(url, "Name a fruit.", **base)
    t = tokenizer.encode(first["choices"][0]["message"]["content"], add_special_tokens=False)[0]
    banned = chat(url, "Name a fruit.", logit_bias={str(t): -100}, **base)
    assert banned["choices"][0]["message"]["content"] != first["choices"][0]["message"]["content"]
    banana = tokenizer.encode(" banana", add_special_tokens=False)
    assert len(banana) == 1
    forced = httpx.post(
        f"{url}/v1/completions",
        json={"prompt": "Name a fruit.", "max_tokens": 3, "temperature": 0, "logit_bias": {str(banana[0]): 100}},
        timeout=60,
    ).json()
    assert forced["choices"][0]["text"] == " banana banana banana"
    bad = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "logit_bias": {"999999": 1}}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "logit_bias"


# ---------------------------------------------------------------------- seeds, penalties, mixes
MIX = [
    dict(temperature=0.9, seed=1234, top_p=0.95, min_p=0.02),  # the seeded row under test
    dict(temperature=0.9),  # unseeded
    dict(temperature=0, frequency_penalty=1.2, presence_penalty=0.8, repetition_penalty=1.3),
    dict(temperature=0, logit_bias={"30": 5.0, "31": -5.0}, min_tokens=4),
    dict(temperature=0, response_format=JSON_SCHEMA, max_tokens=40),
    dict(temperature=0.7, top_k=20, seed=9, logprobs=True, top_logprobs=3),
]


async def test_seeded_and_penalized_rows_are_the_same_alone_and_in_shuffled_mixes(url):
    prompt = "Tell me a story about a cat."
    async with httpx.AsyncClient(timeout=300) as c:
        alone = {i: texts(await achat(c, url, prompt, **MIX[i]))[0] for i in (0, 2, 3, 4)}
        for trial in range(2):
            order = list(range(len(MIX))) * 2
            random.Random(trial).shuffle(order)
            got = await asyncio.gather(*(achat(c, url, prompt, **MIX[i]) for i in order))
            for i, resp in zip(order, got):
                if i in alone:
                    assert texts(resp)[0] == alone[i], (i, trial)
        plain = texts(await achat(c, url, prompt, temperature=0))[0]
        after = texts(await achat(c, url, prompt, temperature=0))[0]
    assert plain == after  # the penalized rows left nothing behind in the rows plain requests reuse
    assert alone[2] != plain  # and the penalties did act


def test_penalized_request_with_a_cached_prompt_equals_it_cold(url):
    kw = dict(
        temperature=0,
        frequency_penalty=1.0,
        presence_penalty=0.5,
        repetition_penalty=1.2,
        logprobs=True,
        top_logprobs=2,
        max_tokens=16,
    )
    content = "Penalized prompt " + "".join(random.choice("abcdefgh") for _ in range(12))
    cold = chat(url, content, **kw)
    warm = chat(url, content, **kw)
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert texts(warm) == texts(cold)
    lc = [e["logprob"] for e in cold["choices"][0]["logprobs"]["content"]]
    lw = [e["logprob"] for e in warm["choices"][0]["logprobs"]["content"]]
    assert lw == pytest.approx(lc, abs=1e-4)


# ---------------------------------------------------------------------- n > 1
def test_n_seeded_choices_differ_repeat_and_usage_counts_them(url):
    a = chat(url, "Name an animal.", n=4, temperature=1.0, seed=42, max_tokens=12, ignore_eos=True)
    b = chat(url, "Name an animal.", n=4, temperature=1.0, seed=42, max_tokens=12, ignore_eos=True)
    assert len(set(texts(a))) == 4 and texts(a) == texts(b)
    assert [c["index"] for c in a["choices"]] == [0, 1, 2, 3]
    assert a["usage"]["completion_tokens"] == 48
    greedy = chat(url, "Name an animal.", n=2, temperature=0, max_tokens=12)
    assert texts(greedy)[0] == texts(greedy)[1]


async def test_concurrent_n3_requests_never_swap_or_mix_choices(url):
    async with httpx.AsyncClient(timeout=300) as c:
        solo_a = texts(await achat(c, url, "Name a color.", n=3, temperature=1.0, seed=7, max_tokens=10))
        solo_b = texts(await achat(c, url, "Name a city.", n=3, temperature=1.0, seed=8, max_tokens=10))
        both = await asyncio.gather(
            achat(c, url, "Name a color.", n=3, temperature=1.0, seed=7, max_tokens=10),
            achat(c, url, "Name a city.", n=3, temperature=1.0, seed=8, max_tokens=10),
            achat(c, url, "Name a fruit.", temperature=0, max_tokens=10),
        )
    assert texts(both[0]) == solo_a and texts(both[1]) == solo_b


def test_f3_usage_with_n2_counts_both_choices(url, tokenizer):
    prompt = "Once upon a time"
    n_prompt = len(tokenizer.encode(prompt, add_special_tokens=False))
    body = {"prompt": prompt, "max_tokens": 5, "temperature": 0, "n": 2, "ignore_eos": True}
    full = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
    assert full["usage"]["completion_tokens"] == 10 and full["usage"]["prompt_tokens"] == n_prompt
    usage = []
    with httpx.stream(
        "POST", f"{url}/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    assert chunk["choices"] == []
                    usage.append(chunk["usage"])
    drop = lambda u: {k: v for k, v in u.items() if k != "prompt_tokens_details"}  # noqa: E731 (cache hits differ)
    assert [drop(u) for u in usage] == [drop(full["usage"])]


# ---------------------------------------------------------------------- logprobs
def stream_chat(url: str, body: dict) -> tuple[str, list[dict]]:
    text, entries = "", []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                for ch in chunk["choices"]:
                    text += ch["delta"].get("content") or ""
                    entries += (ch.get("logprobs") or {}).get("content") or []
    return text, entries


def test_chat_logprobs_streamed_equal_non_streamed_and_concatenate_to_the_text(url):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Copy this: 🌶️🍣 日本語 café ✓"}],
        "max_tokens": 40,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 5,
    }
    full = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300).json()
    text = full["choices"][0]["message"]["content"]
    entries = full["choices"][0]["logprobs"]["content"]
    assert "".join(e["token"] for e in entries) == text
    assert b"".join(bytes(e["bytes"]) for e in entries) == text.encode()
    for e in entries:
        tops = e["top_logprobs"]
        assert e["logprob"] <= 0 and len(tops) == 5
        assert [t["logprob"] for t in tops] == sorted((t["logprob"] for t in tops), reverse=True)
        assert e["logprob"] == pytest.approx(tops[0]["logprob"], abs=1e-5)  # greedy: the chosen token is the top one
    s_text, s_entries = stream_chat(url, body)
    assert s_text == text
    assert [(e["token"], e["bytes"]) for e in s_entries] == [(e["token"], e["bytes"]) for e in entries]
    assert [e["logprob"] for e in s_entries] == pytest.approx([e["logprob"] for e in entries], abs=1e-5)


def test_prompt_logprobs_equal_mlx_lm_and_survive_a_fully_cached_prompt(url, tokenizer, loaded):
    import mlx.core as mx

    prompt = "The quick brown fox jumps over the lazy dog because"
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0, "logprobs": 1, "echo": True}
    first = httpx.post(f"{url}/v1/completions", json=body, timeout=300).json()
    again = httpx.post(f"{url}/v1/completions", json=body, timeout=300).json()
    model = loaded.model
    logits = model(mx.array(ids)[None])[0].astype(mx.float32)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    ref = [lp[j - 1, ids[j]].item() for j in range(1, len(ids))]
    for resp in (first, again):
        got = resp["choices"][0]["logprobs"]["token_logprobs"]
        assert got[0] is None
        assert got[1 : len(ids)] == pytest.approx(ref, abs=1e-3)
        assert resp["choices"][0]["text"].startswith(prompt)


def test_native_logprob_fields(url, tokenizer):
    ids = tokenizer.encode("Hello there, how are", add_special_tokens=False)
    r = httpx.post(
        f"{url}/generate",
        json={
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": 3, "temperature": 0},
            "return_logprob": True,
            "top_logprobs_num": 2,
            "token_ids_logprob": [11, 12],
            "logprob_start_len": 2,
        },
        timeout=60,
    ).json()
    meta = r["meta_info"]
    assert [t[1] for t in meta["input_token_logprobs"]] == ids[2:]
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"]
    assert all(len(t) == 2 for t in meta["output_top_logprobs"])
    assert all([x[1] for x in row] == [11, 12] for row in meta["output_token_ids_logprobs"])


# ---------------------------------------------------------------------- structured output (J1)
@pytest.mark.parametrize("rf", [JSON_SCHEMA, {"type": "json_object"}], ids=["json_schema", "json_object"])
def test_j1_json_schema_and_json_object_are_enforced(client, rf):
    """J1: the content parses (and validates against the schema) streamed and not, and both
    modes give the same content."""
    kw = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Write a short poem about rain."}],
        max_tokens=128,
        temperature=0,
        response_format=rf,
    )
    full = client.chat.completions.create(**kw).choices[0].message.content
    streamed = "".join(
        c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw) if c.choices
    )
    assert streamed == full
    obj = json.loads(full)
    assert isinstance(obj, dict)
    if rf is JSON_SCHEMA:
        jsonschema.validate(obj, SCHEMA)


async def test_unconstrained_rows_beside_grammar_rows_give_their_solo_text(url):
    async with httpx.AsyncClient(timeout=300) as c:
        solo = texts(await achat(c, url, "Explain why the sky is blue.", temperature=0, max_tokens=32))[0]
        got = await asyncio.gather(
            *(achat(c, url, "Explain why the sky is blue.", temperature=0, max_tokens=32) for _ in range(3)),
            *(
                achat(c, url, f"Describe person {i}.", temperature=0, max_tokens=64, response_format=JSON_SCHEMA)
                for i in range(3)
            ),
        )
    for resp in got[:3]:
        assert texts(resp)[0] == solo
    for resp in got[3:]:
        jsonschema.validate(json.loads(texts(resp)[0]), SCHEMA)


def test_regex_and_ebnf_constrain_the_text(url):
    r = httpx.post(
        f"{url}/generate",
        json={
            "text": "My phone number is",
            "sampling_params": {"regex": r"\(\d{3}\) \d{3}-\d{4}", "max_new_tokens": 30, "temperature": 0},
        },
        timeout=60,
    ).json()
    assert re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", r["text"]), r
    ebnf = 'root ::= "yes" | "no" | "maybe"'
    r = httpx.post(
        f"{url}/generate",
        json={
            "text": "Is the sky blue? Answer:",
            "sampling_params": {"ebnf": ebnf, "max_new_tokens": 10, "temperature": 0},
        },
        timeout=60,
    ).json()
    assert r["text"] in ("yes", "no", "maybe") and r["meta_info"]["finish_reason"]["type"] == "stop"


@pytest.mark.parametrize(
    "path,body,param",
    [
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "x"}],
                "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}},
            },
            "response_format",
        ),
        ("/generate", {"text": "x", "sampling_params": {"regex": "(unclosed"}}, "sampling_params.regex"),
        ("/generate", {"text": "x", "sampling_params": {"ebnf": "root ::= "}}, "sampling_params.ebnf"),
        ("/generate", {"text": "x", "sampling_params": {"regex": "a", "ebnf": 'root ::= "a"'}}, None),
    ],
)
def test_invalid_grammars_are_400(url, path, body, param):
    r = httpx.post(f"{url}{path}", json=body, timeout=60)
    assert r.status_code == 400, r.text
    if param:
        assert r.json()["error"]["param"] == param
    assert (
        httpx.post(
            f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 4, "temperature": 0}, timeout=10
        ).status_code
        == 200
    )
