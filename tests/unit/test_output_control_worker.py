"""Output control in the worker's graph against independent references: sampling sets and
frequencies, seeds independent of the batch, penalties against mlx-lm's own processors,
output and prompt logprobs against a plain mlx-lm forward pass, min_tokens, grammar masks,
and no leak of a row's state into its neighbours.

The tests on the default model loaded in this process (`loaded`), too slow for the
fast loop: tests/e2e/real/test_output_control_worker.py."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from protocol.messages import SamplingParams
from worker_proc.logits.edits import unpack_bitmasks
from worker_proc.logits.row import RowSampling
from worker_proc.logits.sampling import sample

# ---------------------------------------------------------------------- sampling statistics
LOGITS = np.log(np.array([0.30, 0.20, 0.15, 0.10, 0.08, 0.06, 0.05, 0.03, 0.02, 0.01]))


def reference(temperature: float, top_k: int, top_p: float, min_p: float) -> np.ndarray:
    """The distribution the sampler must draw from, computed with numpy."""
    p = np.exp(LOGITS / temperature)
    p /= p.sum()
    order = np.argsort(-p)
    keep = np.zeros_like(p, dtype=bool)
    keep[order[:top_k]] = True
    mass_before = np.cumsum(p[order]) - p[order]
    nucleus = np.zeros_like(keep)
    nucleus[order[mass_before < top_p]] = True
    keep &= nucleus
    keep &= p >= min_p * p.max()
    q = np.where(keep, p, 0.0)
    return q / q.sum()


@pytest.mark.parametrize(
    "temperature,top_k,top_p,min_p",
    [
        (1.0, 3, 1.0, 0.0),
        (1.0, 10, 0.6, 0.0),
        (1.0, 10, 1.0, 0.3),
        (0.7, 6, 0.9, 0.1),
        (1.5, 10, 1.0, 0.0),
    ],
)
def test_sampled_tokens_stay_in_the_allowed_set_with_the_reference_frequencies(temperature, top_k, top_p, min_p):
    n = 4000
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)
    rows = [
        RowSampling.start(
            SamplingParams(**{**{f: getattr(params, f) for f in params.__struct_fields__}, "seed": s}), len(LOGITS)
        )
        for s in range(n)
    ]
    logits = mx.broadcast_to(mx.array(LOGITS, dtype=mx.float32), (n, len(LOGITS)))
    got = np.bincount(np.array(sample(logits, rows).tolist()), minlength=len(LOGITS)) / n
    want = reference(temperature, top_k, top_p, min_p)
    assert set(np.nonzero(got)[0]) <= set(np.nonzero(want)[0])
    assert 0.5 * np.abs(got - want).sum() < 0.04, (got, want)


def test_a_seeded_row_draws_the_same_tokens_in_any_batch():
    vocab = 50
    mx.random.seed(1)
    logits = mx.random.normal((4, vocab))
    seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=77)
    alone = sample(logits[2:3], [RowSampling.start(seeded, vocab)]).tolist()
    mix = [
        RowSampling.start(SamplingParams(temperature=0.0), vocab),
        RowSampling.start(SamplingParams(seed=5), vocab),
        RowSampling.start(seeded, vocab),
        RowSampling.start(SamplingParams(temperature=1.3), vocab),
    ]
    assert sample(logits, mix).tolist()[2] == alone[0]


def test_seeds_a_multiple_of_2_62_apart_draw_different_tokens():
    """Every int64 seed has its own stream: seeds were taken modulo 2**62, so 5, 5 + 2**62 and
    5 - 2**62 drew the same tokens, and -1 the same as 2**62 - 1."""
    vocab, steps = 1000, 8
    logits = mx.zeros((1, vocab))  # uniform: two distinct streams agree on a step with p = 1/1000

    def draws(seed: int) -> list[int]:
        row = RowSampling.start(SamplingParams(temperature=1.0, seed=seed), vocab)
        out = []
        for _ in range(steps):
            out += sample(logits, [row]).tolist()
            row.generated += 1
        return out

    assert draws(5) == draws(5)
    for a, b in ((5, 5 + 2**62), (5, 5 - 2**62), (-1, 2**62 - 1), (0, -(2**63))):
        assert draws(a) != draws(b), (a, b)


def test_grammar_bitmasks_unpack_little_endian():
    words = np.array([0b1011, -(2**31)], dtype="<i4").tobytes()
    allowed = unpack_bitmasks([words], 64).tolist()[0]
    assert [j for j, a in enumerate(allowed) if a] == [0, 1, 3, 63]


@pytest.mark.parametrize("top_k,top_p,min_p", [(20, 1.0, 0.0), (4096, 0.5, 0.0), (4096, 1.0, 0.02), (300, 0.8, 0.01)])
def test_candidate_sampling_over_a_large_vocabulary_matches_the_reference(top_k, top_p, min_p):
    """Truncating rows sample among partially sorted candidates; with a vocabulary larger
    than `CANDIDATES` the frequencies still follow the full-vocabulary reference."""
    global LOGITS
    vocab, n = 4096, 3000
    zipf = 1.0 / np.arange(1, vocab + 1) ** 1.1
    saved, LOGITS = LOGITS, np.log(zipf / zipf.sum())
    try:
        want = reference(1.0, min(top_k, vocab), top_p, min_p)
        rows = [
            RowSampling.start(SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p, min_p=min_p, seed=s), vocab)
            for s in range(n)
        ]
        logits = mx.broadcast_to(mx.array(LOGITS, dtype=mx.float32), (n, vocab))
        got = np.bincount(np.array(sample(logits, rows).tolist()), minlength=vocab) / n
    finally:
        LOGITS = saved
    assert set(np.nonzero(got)[0]) <= set(np.nonzero(want)[0])
    assert 0.5 * np.abs(got - want).sum() < 0.06, 0.5 * np.abs(got - want).sum()


def test_gumbel_noise_is_finite_at_the_extremes_of_the_hash():
    from worker_proc.logits.sampling import gumbel_at, uniform

    u = uniform(mx.array([0, 1, 0xFFFFFFFE, 0xFFFFFFFF], dtype=mx.uint32)).tolist()
    assert all(0.0 < x < 1.0 for x in u) and u[-1] > 1 - 2**-22

    keys = mx.array(np.array([[s >> 32, s & 0xFFFFFFFF] for s in range(0, 2**62, 2**56)], dtype=np.uint32))
    noise = gumbel_at(keys, mx.arange(1 << 16, dtype=mx.int32))
    assert mx.all(mx.isfinite(noise)).item()
