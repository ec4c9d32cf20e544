"""Completions prompts (issue 10 item 4) greedy on the tiny model's server (the session's):
a list of prompts answers as each prompt alone, and a batch of more prompts than --max-n
is served. In-process: tests/api/test_completions_prompts.py."""

from __future__ import annotations

import httpx


def test_greedy_lists_match_single_prompts_on_the_tiny_model(tiny_server, tokenizer):
    url = f"{tiny_server.base_url}/v1/completions"
    base = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
    prompts = ["Once upon a time", "The cat"]
    singles = [httpx.post(url, json={**base, "prompt": p}).json()["choices"][0]["text"] for p in prompts]
    listed = httpx.post(url, json={**base, "prompt": prompts, "n": 2}).json()
    assert [c["index"] for c in listed["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in listed["choices"]] == [s for s in singles for _ in range(2)]
    ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    by_ids = httpx.post(url, json={**base, "prompt": ids}).json()
    assert [c["text"] for c in by_ids["choices"]] == singles
    assert by_ids["usage"]["prompt_tokens"] == sum(map(len, ids))


def test_a_batch_of_more_prompts_than_max_n_is_served(tiny_server):
    """40 prompts (the server's --max-n is 16) to /v1/completions and to native /generate:
    every prompt answered once, in order, each as its own request alone would be."""
    base = {"max_tokens": 3, "temperature": 0, "ignore_eos": True}
    prompts = [f"Item {i}:" for i in range(40)]
    listed = httpx.post(f"{tiny_server.base_url}/v1/completions", json={**base, "prompt": prompts}, timeout=120)
    assert listed.status_code == 200, listed.text
    texts = [c["text"] for c in listed.json()["choices"]]
    assert [c["index"] for c in listed.json()["choices"]] == list(range(40))
    for i in (0, 17, 39):
        alone = httpx.post(f"{tiny_server.base_url}/v1/completions", json={**base, "prompt": prompts[i]}, timeout=60)
        assert alone.json()["choices"][0]["text"] == texts[i]
    native = httpx.post(
        f"{tiny_server.base_url}/generate",
        timeout=120,
        json={"text": prompts, "sampling_params": {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}},
    )
    assert native.status_code == 200, native.text
    assert [o["text"] for o in native.json()] == texts
