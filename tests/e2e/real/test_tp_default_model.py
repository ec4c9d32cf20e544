"""Tensor parallelism on the default model (issue 12): its 9 query and 3 KV heads divide by 3,
so ``--tp 3`` runs three ring ranks on loopback (slowly: three ranks on this machine's two
cores). Greedy output equals the unsharded model (`ModelRunner` in this process) token for
token, batched (one prompt prefilled in 3 chunks) and streamed from the radix cache."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from protocol.messages import SamplingParams
from tests.support.launcher import Server, stop_and_check
from tests.support.tensor_parallel import CHUNK, MAX_TOKENS, generate_all, ids_of, native, prompt
from tests.support.worker_runs import run

pytestmark = pytest.mark.slow  # default-model servers of its own


@pytest.fixture(scope="module")
def tp3(tmp_path_factory):
    """One ``--tp 3`` server on the default model for the module (prompts prefilled in
    `CHUNK`-token chunks, 2 requests running at most, a KV pool of 1,024 tokens: its
    prompts take under 100, and each rank would zero-fill 1.4 GiB for the default one),
    stopped and checked for orphans after."""
    srv = Server(
        [
            "--tp",
            "3",
            "--chunked-prefill-size",
            str(CHUNK),
            "--max-running-requests",
            "2",
            "--max-total-tokens",
            "1024",
        ],
        tmp_path_factory.mktemp("logs") / "tp3.log",
    )
    yield srv
    stop_and_check(srv)


def test_default_model_at_tp3_equals_tp1(tp3, loaded):
    """Two prompts batched (one of 40 tokens in 3 chunks), then the long one again,
    streamed: it takes its prefix from the radix cache, and every answer equals the
    unsharded model's greedy tokens."""
    from worker_proc.model.runner import ModelRunner

    prompts = [prompt(6, 4), prompt(40, 5)]
    want = [
        run(ModelRunner(loaded), {"r": p}, {"r": SamplingParams(temperature=0.0)}, MAX_TOKENS)[0]["r"] for p in prompts
    ]
    got = asyncio.run(generate_all(tp3.base_url, [native(p) for p in prompts]))
    assert [ids_of(body) for body in got] == want
    events = []
    with httpx.stream("POST", f"{tp3.base_url}/generate", json=native(prompts[1], True), timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(httpx.Response(200, content=line[6:]).json())
    assert ids_of(events[-1]) == want[1]
    assert events[-1]["meta_info"]["cached_tokens"] > 0, events[-1]["meta_info"]
