"""The worker's model runner against a plain mlx-lm loop on the same loaded model, batched
against solo, sampling, and the forward-mode contract (DESIGN.md §4, §5, §8).

The tests on the default model loaded in this process (`loaded`), too slow for the
fast loop: tests/e2e/real/test_worker.py."""

from __future__ import annotations

import mlx.core as mx
import pytest

from protocol.enums import ForwardMode
from protocol.messages import SamplingParams
from tests.support.worker_runs import GREEDY
from worker_proc.logits.row import RowSampling
from worker_proc.logits.sampling import sample

VOCAB = 100


def test_sampler_rows_are_independent():
    mx.random.seed(0)
    logits = mx.random.normal((3, 100))
    greedy = mx.argmax(logits, axis=-1).tolist()
    rows = [
        RowSampling.start(GREEDY, VOCAB),
        RowSampling.start(SamplingParams(temperature=1.0, top_k=1, seed=3), VOCAB),
        RowSampling.start(SamplingParams(temperature=0.7, seed=5), VOCAB),
    ]
    first = sample(logits, rows).tolist()
    assert first[0] == greedy[0] and first[1] == greedy[1]  # top_k=1 is greedy
    again = [RowSampling.start(SamplingParams(temperature=0.7, seed=5), VOCAB)]
    assert sample(logits[2:], again).tolist()[0] == first[2]  # same seed, same step, any batch


def test_sampler_top_p_keeps_nucleus():
    logits = mx.log(mx.array([[0.5, 0.3, 0.15, 0.05]]))
    seen = set()
    row = RowSampling.start(SamplingParams(temperature=1.0, top_p=0.7, seed=1), VOCAB)
    for _ in range(200):
        seen.add(sample(logits, [row]).item())
        row.generated += 1
    assert seen == {0, 1}


def test_sampler_logit_bias():
    from worker_proc.logits.edits import apply_edits

    logits = mx.zeros((2, VOCAB))
    rows = [
        RowSampling.start(SamplingParams(temperature=0.0, logit_bias={7: 100.0}), VOCAB),
        RowSampling.start(GREEDY, VOCAB),
    ]
    assert sample(apply_edits(logits, rows), rows).tolist() == [7, 0]


def test_worker_chain_decode_on_empty_batch_keeps_its_error_for_finalize():
    from worker_proc.model.runner import ModelRunner, Pending  # imports mlx_lm: only here
    from worker_proc.model.running_batch import RunningBatch

    runner = ModelRunner.__new__(ModelRunner)  # no model needed: the failure comes before any compute
    runner.batch, runner.partial, runner.trace, runner._finalized = RunningBatch(VOCAB), {}, None, 0
    runner.deferred = set()
    runner.pending = {1: Pending(ForwardMode.DECODE, [], None)}
    runner.last_launch_id = 1
    with pytest.raises(ValueError, match="empty running batch"):
        runner.chain_decode(2, 1)
    with pytest.raises(RuntimeError, match="empty running batch"):
        runner.finalize(2)
