"""Recurrent and hybrid models (issue 11, first part) and sliding-window models (issue 41)
end to end: a server of a hybrid (Nemotron-H) or of gpt-oss (window layers with sinks)
resumes cached prefixes from state snapshots (recurrent state, or the window's last
positions: exact, strict and between-snapshot hits past the window, one uncached token, an
exact repeat (one token recomputed), the next turn of a chat after the previous answer with
``--enable-mamba-extra-buffer``), recomputes retracted requests, and answers like the
reference loop. In this process: tests/models/test_hybrid_models.py and
tests/models/test_window_models.py."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from protocol.config import ModelSource
from tests.support.hybrid_configs import HYBRID_CONFIGS
from tests.support.hybrid_reference import reference
from tests.support.launcher import Server, stop_and_check
from tests.support.pool_state import metrics, wait_metric
from tests.support.tiny_model import write_random_model
from tests.support.window_configs import WINDOW_CONFIGS
from worker_proc.model.loader import load

MODELS = {  # name -> (config, what its start-up line says about its snapshot layers)
    "nemotron-h": (HYBRID_CONFIGS["nemotron_h"], "recurrent_layers=2 window_layers=0"),
    "gpt-oss": (WINDOW_CONFIGS["gpt_oss"], "recurrent_layers=0 window_layers=2"),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def hybrid_server(request, tokenizer, tmp_path_factory):
    config, layers = MODELS[request.param]
    path = write_random_model(tmp_path_factory.mktemp(request.param), tokenizer, config)
    server = Server(
        [
            "--model",
            str(path),
            "--chunked-prefill-size",
            "16",
            "--max-running-requests",
            "6",
            "--mamba-cache-chunk-size",
            str(SNAP),
            "--max-total-tokens",
            "100",
            "--enable-mamba-extra-buffer",
        ],
        path / "server.log",
    )
    server.layers = layers
    yield server, load(ModelSource("hf", str(path), "m")).model
    stop_and_check(server)


SNAP = 8
P = [(11 * i) % 700 + 40 for i in range(37)]  # snapshots at 8, 16, 24, 32
CASES = [  # (prompt, cached tokens expected: the deepest snapshot before its last token)
    (P, 0),  # cold
    (P, 36),  # the same prompt: fully cached, its last token computed from the snapshot at P - 1
    (P[:20] + [5, 6, 7], 16),  # a hit between snapshots (20 tokens) resumes at 16
    (P[:16] + [9, 9], 16),  # a hit landing on a snapshot
    (P + [3], 37),  # one uncached token: resumes at the snapshot of the first prompt's end
    (P[:5] + [1] * 12, 0),  # a hit shorter than any snapshot: computed whole
]


def ask(client, url, ids, n=6):
    r = client.post(
        f"{url}/generate",
        json={"input_ids": ids, "return_logprob": True, "sampling_params": {"temperature": 0, "max_new_tokens": n}},
    )
    assert r.status_code == 200, r.text
    meta = r.json()["meta_info"]
    return (
        [e[1] for e in meta["output_token_logprobs"]],
        [e[0] for e in meta["output_token_logprobs"]],
        meta["cached_tokens"],
    )


def test_a_hybrid_server_resumes_cached_prefixes_from_state_snapshots(hybrid_server):
    server, model = hybrid_server
    with httpx.Client(timeout=120) as client:
        for ids, cached in CASES:  # one at a time, so each finds the cache the last ones left
            tokens, lps, got_cached = ask(client, server.base_url, ids)
            ref_lps: list[float] = []
            assert tokens == reference(model, ids, 6, ref_lps) and got_cached == cached, (ids, got_cached)
            assert lps == pytest.approx(ref_lps, abs=1e-2)
        # and all at once, batched, from a warm cache, in a pool too small to hold them all
        # (they wait for room, and cached prefixes are evicted with their snapshots)
        with ThreadPoolExecutor(len(CASES)) as pool:
            again = list(pool.map(lambda case: ask(client, server.base_url, case[0]), CASES))
        wait_metric(server.base_url, lambda m: m.get("lazyserve_requests_finished", 0) == 2 * len(CASES))
    assert [a[0] for a in again] == [reference(model, ids, 6) for ids, _ in CASES]
    log = server.log()
    assert "radix_cache_off" not in log and server.layers in log and "accounting is off" not in log


def test_a_multi_turn_chat_resumes_after_the_previous_answer(hybrid_server):
    """With the extra buffer, each turn resumes from the state at the end of the previous
    answer (its last token's KV is never computed: the turn recomputes it and the new
    tokens), and answers like the reference loop."""
    server, model = hybrid_server
    prompt, expect = [(13 * i) % 500 + 60 for i in range(12)], 0
    with httpx.Client(timeout=120) as client:
        for turn in range(3):
            tokens, lps, cached = ask(client, server.base_url, prompt)
            ref_lps: list[float] = []
            assert tokens == reference(model, prompt, 6, ref_lps) and cached == expect, (turn, cached)
            assert lps == pytest.approx(ref_lps, abs=1e-2)
            expect = len(prompt) + len(tokens) - 1
            prompt = prompt + tokens + [3 + turn, 4, 5]


def test_retracted_requests_recompute_the_same_answers(hybrid_server):
    """Four requests that outgrow the 100-token pool while decoding: some are retracted
    (their KV, state and track slots freed) and prefilled again with what they generated,
    and every answer equals the uninterrupted reference."""
    server, model = hybrid_server
    prompts = [[(17 * i + 5 * k) % 600 + 70 for i in range(15)] for k in range(4)]
    before = metrics(server.base_url).get("lazyserve_retractions", 0)
    with httpx.Client(timeout=120) as client, ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(lambda ids: ask(client, server.base_url, ids, 24)[0], prompts))
    # the scheduler reports its counters about once a second
    wait_metric(server.base_url, lambda m: m.get("lazyserve_retractions", 0) > before)
    assert got == [reference(model, ids, 24) for ids in prompts]
