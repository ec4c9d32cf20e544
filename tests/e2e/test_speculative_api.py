"""Speculative decoding through the HTTP API (issue 42), on the tiny random model: a server
with ``--speculative-algorithm NGRAM`` answers greedy requests exactly as the one without
(`tiny_server`), counts drafts in /metrics and its request log lines, and takes native
``speculative``."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.support.launcher import Server, stop_and_check
from tests.support.pool_state import metrics

REPEATING = [list(range(300, 340)) * 3, [5, 6, 7, 8] * 20, list(range(1000, 1100))]


@pytest.fixture(scope="module")
def spec_server(tiny_model_dir, tmp_path_factory):
    server = Server(
        ["--model", str(tiny_model_dir), "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "3"],
        tmp_path_factory.mktemp("logs") / "spec.log",
    )
    yield server
    stop_and_check(server)


def complete(url: str, prompt, **kw) -> dict:
    body = {"prompt": prompt, "max_tokens": 40, "temperature": 0, "ignore_eos": True, **kw}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_greedy_output_equals_the_server_without_speculation(spec_server, tiny_server):
    for prompt in REPEATING:
        ours = complete(spec_server.base_url, prompt)
        plain = complete(tiny_server.base_url, prompt)
        assert ours["choices"][0]["text"] == plain["choices"][0]["text"]
        assert ours["usage"]["completion_tokens"] == 40
    deadline = time.monotonic() + 15  # the scheduler's counters reach /metrics about once a second
    while (m := metrics(spec_server.base_url))["lazyserve_spec_decode_num_draft_tokens"] == 0:
        assert time.monotonic() < deadline, m
        time.sleep(0.2)
    assert m["lazyserve_spec_decode_acceptance_length_count"] == m["lazyserve_spec_decode_num_drafts"] > 0
    assert "spec_draft_tokens=" in spec_server.log_path.read_text()


def test_native_speculative_opt_out_and_a_bad_value(spec_server):
    url = spec_server.base_url
    body = {"input_ids": REPEATING[1], "sampling_params": {"max_new_tokens": 8, "temperature": 0, "speculative": False}}
    r = httpx.post(f"{url}/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    body["sampling_params"]["speculative"] = "no"
    r = httpx.post(f"{url}/generate", json=body, timeout=60)
    assert r.status_code == 400 and "speculative" in r.text


def test_logprobs_of_every_token_as_without_speculation(spec_server, tiny_server):
    """A drafting request that asks for logprobs gets one entry per token, those of the
    server without speculation (the accepted draft tokens' included)."""
    before = metrics(spec_server.base_url).get("lazyserve_spec_decode_num_accepted_tokens", 0)
    for prompt in REPEATING:
        ours = complete(spec_server.base_url, prompt, logprobs=2)["choices"][0]["logprobs"]
        plain = complete(tiny_server.base_url, prompt, logprobs=2)["choices"][0]["logprobs"]
        assert len(ours["tokens"]) == 40 and ours["tokens"] == plain["tokens"]
        assert ours["token_logprobs"] == pytest.approx(plain["token_logprobs"], abs=1e-3)
    deadline = time.monotonic() + 15
    while metrics(spec_server.base_url)["lazyserve_spec_decode_num_accepted_tokens"] <= before:
        assert time.monotonic() < deadline, "no draft token was accepted during the logprob requests"
        time.sleep(0.2)


def test_chat_and_completions_take_speculative(spec_server):
    url = spec_server.base_url
    ok = complete(url, REPEATING[1], speculative=False)
    assert ok["usage"]["completion_tokens"] == 40
    r = httpx.post(
        f"{url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "speculative": "off"},
        timeout=60,
    )
    assert r.status_code == 400 and "speculative" in r.text
