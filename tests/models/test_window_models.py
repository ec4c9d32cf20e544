"""Sliding-window models (issue 41, item 1), in this process: gpt-oss (window layers with
attention sinks), Gemma 3 and Ministral 3 are served token for token like mlx-lm's own loop
(its `RotatingKVCache`s) through batched prefill of unequal prompts longer than the window,
chunked prefill across it, a MIXED launch, chained decodes, a request leaving and another
joining into its free row, and decodes past the point where the running batch cuts its window
layers back (`WINDOW_SLACK`); a running request holds its window, not its history; a cached
prefix resumes from a window snapshot before and past the window. End to end:
tests/e2e/test_window_models.py."""

from __future__ import annotations

import pytest
from mlx_lm.models.cache import BatchKVCache

from protocol.config import ModelSource
from protocol.enums import ForwardMode
from protocol.messages import ForwardBatch
from tests.support.tiny_model import write_random_model
from tests.support.window_configs import WINDOW, WINDOW_CONFIGS
from tests.support.worker_runs import LOGPROB_GREEDY as GREEDY
from tests.support.worker_runs import Collector, assert_captured_as_uncompiled, assert_reference, leave_and_join
from worker_proc.memory import window_cache
from worker_proc.memory.kv_pool import KVPool
from worker_proc.memory.layer_caches import KV
from worker_proc.memory.layer_caches import WINDOW as WINDOW_KIND
from worker_proc.memory.state_pool import StatePool, state_rows
from worker_proc.memory.window_cache import WindowBatchKVCache
from worker_proc.model.decode_graph import supports
from worker_proc.model.loader import load
from worker_proc.model.runner import ModelRunner

A = list(range(10, 17))  # shorter than the window
B = [(5 * i) % 800 + 20 for i in range(29)]  # several windows
C = [(7 * i) % 900 + 30 for i in range(23)]
SLACK = 4
"""The running batch's window slack in these tests (the server's is `WINDOW_SLACK`): cut
back every few steps, so the decodes below cross several cuts."""
STEPS = 14


@pytest.fixture(scope="module", params=sorted(WINDOW_CONFIGS))
def window_model(request, tokenizer, tmp_path_factory):
    path = write_random_model(tmp_path_factory.mktemp(request.param), tokenizer, WINDOW_CONFIGS[request.param])
    return load(ModelSource("hf", str(path), "m"))


@pytest.fixture(autouse=True)
def small_slack(monkeypatch):
    monkeypatch.setattr(window_cache, "WINDOW_SLACK", SLACK)
    monkeypatch.setattr(window_cache.trim_window, "__defaults__", (SLACK,))


def test_runner_equals_the_reference_loop(window_model):
    """c's chunks: the first longer than the window, the second of one token (which wraps
    mlx-lm's ring buffer round); decodes cross several window cuts."""
    loaded = window_model
    kinds = loaded.caches
    assert set(kinds.kinds) == {WINDOW_KIND, KV}
    assert kinds.windows == tuple(WINDOW if k == WINDOW_KIND else 0 for k in kinds.kinds)
    runner = ModelRunner(loaded)
    widths = []

    def record():
        widths.append([runner.batch.cache[i]._idx for i in (kinds.window[0], kinds.kv[0])])

    real_launch = runner.launch

    def launch(lid, mode, batch):  # the ring has wrapped after the one-token chunk
        real_launch(lid, mode, batch)
        if batch.input_ids and batch.input_ids[-1] == C[13:14]:
            assert runner.partial["c"].cache[kinds.window[0]]._idx < WINDOW

    runner.launch = launch
    out, lps = leave_and_join(runner, (A, B, C), [13, 14], STEPS, record)
    window_layers = [c for c in runner.batch.cache if isinstance(c, WindowBatchKVCache)]
    assert len(window_layers) == len(kinds.window) >= 2
    # the window layers were cut back (to the window) while the full layers grew
    assert min(w[0] for w in widths) == WINDOW and max(w[0] for w in widths) == WINDOW + SLACK
    assert widths[-1][1] >= len(B) + STEPS
    # a running request holds its window (plus the slack and mlx-lm's growth step), not its history
    assert all(c.keys.shape[2] <= WINDOW + SLACK + BatchKVCache.step for c in window_layers)
    assert_reference(loaded.model, out, lps, {"a": A, "b": B, "c": C}, 2e-3)


@pytest.mark.parametrize("cut", [5, 16, 24])
def test_a_cached_prefix_resumes_from_a_window_snapshot(window_model, cut):
    """The first request's window is snapshotted after `cut` prompt positions (before the
    window fills, and past it); a second request with the same first `cut` tokens gathers
    the full layers' KV from the pool and restores its window layers from the snapshot, and
    answers like the reference loop; the snapshot slot's earlier occupant (a longer prompt)
    leaks nothing into it."""
    loaded = window_model
    states = StatePool(loaded.caches, state_rows(loaded.model, loaded.caches), 4)
    pool = KVPool(loaded.model, 128, loaded.dtype)
    runner = ModelRunner(loaded, pool=pool, states=states)
    launch = Collector(runner)
    # an earlier occupant of state slot 2: a full window of other positions
    launch(ForwardMode.EXTEND, ForwardBatch(["x"], [C], [GREEDY], [True], state_save_at=[[20]], state_save_slots=[[2]]))
    runner.abort(["x"])
    launch(
        ForwardMode.EXTEND, ForwardBatch(["a"], [B], [GREEDY], [True], state_save_at=[[cut]], state_save_slots=[[2]])
    )
    runner.store(["a"], [0], [list(range(1, cut + 1))])
    runner.abort(["a"])
    tail = [3, 4, 5, 6, 7, 8, 9, 11, 12, 13]
    slots = list(range(1, cut + 1))
    launch(
        ForwardMode.EXTEND,
        ForwardBatch(["b"], [tail], [GREEDY], [True], prefix_slots=[slots], state_restores=[2], prefix_ids=[B[:cut]]),
    )
    for _ in range(6):
        launch(ForwardMode.DECODE, ForwardBatch(["b"]))
    assert_reference(loaded.model, {"b": launch.out["b"]}, {"b": launch.lps["b"]}, {"b": B[:cut] + tail}, 2e-3)


def test_decode_captured_as_uncompiled(window_model, tokenizer):
    """The captured step (window layers with their own index, padding and window mask) gives
    the uncompiled step's tokens through joins, a leave, a MIXED launch and window cuts."""
    loaded = window_model
    assert supports(loaded.model)
    assert_captured_as_uncompiled(loaded, tokenizer)


def test_the_lm_head_runs_on_the_last_position_only(window_model):
    """Every window family's call is inner model + head (Gemma 4's head soft-capped), so
    prefills build logits for their last positions only."""
    from worker_proc.model.forward import head_check

    assert head_check(window_model.model) == (True, "")
