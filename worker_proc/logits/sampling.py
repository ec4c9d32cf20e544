"""Sampling one token per row from processed logits: greedy, temperature, top-k, top-p, min-p.

Noise is Gumbel, drawn for every sampled row in one vmapped op from a per-row key derived
from (seed, tokens generated), so a seeded row's tokens depend only on its seed, its
position and its logits, whatever batch it runs in. Greedy rows take the argmax.
"""

from __future__ import annotations

import math
from functools import lru_cache

import mlx.core as mx
import numpy as np

from worker_proc.logits.row import RowSampling



@lru_cache(maxsize=8)
def _gumbel_rows(vocab: int):
    """keys uint32 [S, 2] -> Gumbel noise float32 [S, vocab], one key per row (one op)."""
    return mx.vmap(lambda key: mx.random.gumbel(shape=(vocab,), key=key))


def truncation_mask(scaled: mx.array, top_k: list[int], top_p: list[float], min_p: list[float]) -> mx.array:
    """Logits outside each row's top-k set, top-p nucleus and min-p set set to -inf.

    scaled: float32 [B, V] (after temperature); top_k[i] in 1..V (V = off); top_p[i] in
    (0, 1] (the smallest set of most likely tokens whose mass reaches top_p; the top token
    always stays); min_p[i] in [0, 1] (tokens with probability below min_p times the top
    token's are dropped; 0 = off).
    """
    vocab = scaled.shape[-1]
    threshold = None
    if any(k < vocab for k in top_k) or any(p < 1.0 for p in top_p):
        sorted_desc = -mx.sort(-scaled, axis=-1)
        threshold = mx.take_along_axis(sorted_desc, mx.array(top_k)[:, None] - 1, axis=-1)
        if any(p < 1.0 for p in top_p):
            probs = mx.softmax(sorted_desc, axis=-1)
            keep = (mx.cumsum(probs, axis=-1) - probs) < mx.array(top_p, dtype=mx.float32)[:, None]
            keep[:, 0] = True
            p_threshold = mx.min(mx.where(keep, sorted_desc, mx.inf), axis=-1, keepdims=True)
            threshold = mx.maximum(threshold, p_threshold)
    if any(p > 0 for p in min_p):
        log_min_p = mx.array([math.log(p) if p > 0 else -math.inf for p in min_p], dtype=mx.float32)[:, None]
        m_threshold = mx.max(scaled, axis=-1, keepdims=True) + log_min_p
        threshold = m_threshold if threshold is None else mx.maximum(threshold, m_threshold)
    if threshold is None:
        return scaled
    return mx.where(scaled >= threshold, scaled, -mx.inf)


def _sample_rows(logits: mx.array, rows: list[RowSampling]) -> mx.array:
    """Sample every row of logits float32 [S, V] (all rows non-greedy); int32 [S]."""
    vocab = logits.shape[-1]
    scaled = logits / mx.array([r.params.temperature for r in rows], dtype=mx.float32)[:, None]
    scaled = truncation_mask(scaled, [r.params.top_k if 0 < r.params.top_k < vocab else vocab for r in rows],
                             [r.params.top_p for r in rows], [r.params.min_p for r in rows])
    keys = mx.array(np.array([r.noise_key() for r in rows], dtype=np.uint32))
    return mx.argmax(scaled + _gumbel_rows(vocab)(keys), axis=-1).astype(mx.int32)


def sample(logits: mx.array, rows: list[RowSampling]) -> mx.array:
    """One token per row. logits: float32 [B, V] after edits and penalties; int32 [B], lazy.

    Does not advance the rows' `generated` counters (`pipeline.process` does).
    """
    greedy = mx.argmax(logits, axis=-1).astype(mx.int32)
    sampled = [i for i, r in enumerate(rows) if not r.greedy]
    if not sampled:
        return greedy
    if len(sampled) == len(rows):
        return _sample_rows(logits, rows)
    idx = mx.array(sampled, dtype=mx.int32)
    greedy[idx] = _sample_rows(logits[idx], [rows[i] for i in sampled])
    return greedy
