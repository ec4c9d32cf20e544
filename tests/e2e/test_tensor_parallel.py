"""Tensor-parallel worker ranks (issue 12): ``--tp 2`` over MLX's ring backend on loopback.

One ``--tp 2`` server on the tiny random llama (4 query / 2 KV heads) serves the module's
server tests; its greedy and seeded outputs are compared token for token with the same
`ModelRunner` unsharded in this process (``--tp 1``). The last of them kills a rank
mid-decode. Start-up error: launch refuses the default model (9 / 3 heads) at ``--tp 2``.
The ranks' and launch's parts in this process: tests/unit/test_tensor_parallel.py."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from protocol.messages import SamplingParams
from tests.support.launcher import Server, alive, run_launch, stop_and_check
from tests.support.stream_faults import kill_mid_stream
from tests.support.tensor_parallel import CHUNK, MAX_TOKENS, PROMPTS, generate_all, ids_of, native, prompt


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    """``--tp 2`` on the tiny model, prompts chunked by `CHUNK` tokens, chunks mixed with
    running decodes (MIXED launches)."""
    srv = Server(
        [
            "--model",
            str(tiny_model_dir),
            "--tp",
            "2",
            "--chunked-prefill-size",
            str(CHUNK),
            "--enable-mixed-chunk",
            "--max-running-requests",
            "4",
        ],
        tmp_path_factory.mktemp("logs") / "tp2.log",
    )
    yield srv
    stop_and_check(srv)


def test_batched_greedy_equals_tp1_token_for_token(server, tp1):
    """Three prompts at once (one prefilled in 3 chunks): the tokens equal --tp 1's and the
    logprobs agree to 1e-4."""
    got = asyncio.run(generate_all(server.base_url, [native(p) for p in PROMPTS]))
    for p, body in zip(PROMPTS, got):
        want, want_lp = tp1(p, SamplingParams(temperature=0.0, top_logprobs=0))
        assert ids_of(body) == want
        lps = [lp for lp, _, _ in body["meta_info"]["output_token_logprobs"]]
        assert lps == pytest.approx([w.logprobs[0] for w in want_lp], abs=1e-4)


def test_streamed_prompt_hits_the_radix_cache_and_equals_tp1(server, tp1):
    """A prompt run once, then again streamed: the second takes its prefix from the radix
    cache (cached_tokens > 0) and both equal --tp 1."""
    p = prompt(37, 3)
    want, _ = tp1(p, SamplingParams(temperature=0.0))
    first = httpx.post(f"{server.base_url}/generate", json=native(p), timeout=60).json()
    events = []
    with httpx.stream("POST", f"{server.base_url}/generate", json=native(p, True), timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(httpx.Response(200, content=line[6:]).json())
    assert ids_of(first) == want and ids_of(events[-1]) == want
    assert events[-1]["meta_info"]["cached_tokens"] > 0, events[-1]["meta_info"]


def test_penalties_and_seeded_sampling_equal_tp1(server, tp1):
    """Penalized greedy rows and a seeded sampled row, batched: the same tokens as --tp 1
    (the ranks sample alike)."""
    cases = [
        dict(frequency_penalty=1.5, repetition_penalty=1.3),
        dict(temperature=0.9, seed=11),
        dict(temperature=1.0, top_k=20, seed=5, presence_penalty=0.5),
    ]
    got = asyncio.run(generate_all(server.base_url, [native(PROMPTS[1], **c) for c in cases]))
    for c, body in zip(cases, got):
        want, _ = tp1(PROMPTS[1], SamplingParams(**{"temperature": 0.0, **c}))
        assert ids_of(body) == want, c


def test_grammar_mask_holds_under_tp(server):
    """A regex-constrained request: every rank applies the scheduler's mask."""
    body = {
        "text": "Answer:",
        "sampling_params": {"max_new_tokens": MAX_TOKENS, "temperature": 0.0, "regex": "(yes|no)"},
    }
    r = httpx.post(f"{server.base_url}/generate", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["text"] in ("yes", "no"), r.text


def test_rank_killed_mid_decode_fails_clearly_and_the_group_restarts(server, tp1):
    """kill -9 of rank 1 while a stream decodes: the stream ends with a 503 error event naming
    the rank, then [DONE]; launch kills rank 0, restarts both, and the new group serves the
    same greedy tokens."""
    url = server.base_url
    rank0, rank1 = server.child("worker"), server.child("worker-rank1")
    error, recovery_s = kill_mid_stream(url, lambda: os.kill(rank1, signal.SIGKILL))
    assert error["code"] == 503 and "rank 1 was killed by SIGKILL" in error["message"], error
    deadline = time.monotonic() + 10
    while alive(rank0) or alive(rank1):
        assert time.monotonic() < deadline, "the old ranks are still alive"
        time.sleep(0.05)
    assert {server.child("worker"), server.child("worker-rank1")}.isdisjoint({rank0, rank1})
    body = httpx.post(f"{url}/generate", json=native(PROMPTS[0]), timeout=60).json()
    assert ids_of(body) == tp1(PROMPTS[0], SamplingParams(temperature=0.0))[0]
    print(f"\nTP rank kill: stream failed with 503, group back after {recovery_s:.1f} s")


# --------------------------------------------------------------------------- start-up errors
def test_indivisible_heads_fail_at_start_naming_them():
    """The default model has 9 query and 3 KV heads: launch refuses --tp 2 before it starts
    any process."""
    t0 = time.monotonic()
    r = run_launch(["--tp", "2"])
    elapsed = time.monotonic() - t0
    assert r.returncode == 1
    assert (
        "--tp 2: the heads of this llama model do not divide by 2 (num_attention_heads=9, "
        "num_key_value_heads=3)" in r.stderr
    ), r.stderr[-2000:]
    assert elapsed < 15, elapsed
    print(f"\nTP indivisible heads refused in {elapsed:.1f} s")
