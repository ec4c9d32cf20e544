"""Batched sampling inside the MLX graph: greedy, temperature, top-k, top-p, logit bias, seeds.

Every row has its own parameters. Nothing here blocks: the returned token array is lazy.
Sampling a row draws Gumbel noise from a key derived from (seed, step), so a request with
a seed gives the same tokens whatever batch it runs in.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import mlx.core as mx

from protocol.messages import SamplingParams

_SEED_MOD = 2**62
GREEDY_BELOW = 1e-5
"""Temperatures below this are greedy (as vLLM): dividing logits by them overflows float32."""


@dataclass
class RowSampling:
    """One request's sampling state: its params, its seed, and how many tokens it drew."""

    params: SamplingParams
    seed: int
    step: int = 0

    @classmethod
    def start(cls, params: SamplingParams) -> "RowSampling":
        """State for a new request; a missing seed is drawn from the OS."""
        seed = params.seed if params.seed is not None else random.SystemRandom().randrange(_SEED_MOD)
        return cls(params, seed % _SEED_MOD)

    @property
    def greedy(self) -> bool:
        """True when this row takes the argmax (temperature below `GREEDY_BELOW`)."""
        return self.params.temperature < GREEDY_BELOW


def _bias(rows: list[RowSampling], vocab: int) -> mx.array | None:
    """Dense [B, V] float32 logit bias, or None when no row has one."""
    if not any(r.params.logit_bias for r in rows):
        return None
    rows_idx, cols, vals = [], [], []
    for i, r in enumerate(rows):
        for tok, b in r.params.logit_bias.items():
            rows_idx.append(i)
            cols.append(tok)
            vals.append(max(-100.0, min(100.0, b)))
    bias = mx.zeros((len(rows), vocab), dtype=mx.float32)
    bias[mx.array(rows_idx), mx.array(cols)] = mx.array(vals, dtype=mx.float32)
    return bias


def _top_k_top_p_mask(scaled: mx.array, rows: list[RowSampling]) -> mx.array:
    """Set logits outside each row's top-k and top-p nucleus to -inf. scaled: [B, V] float32."""
    vocab = scaled.shape[-1]
    ks = [r.params.top_k if 0 < r.params.top_k < vocab else vocab for r in rows]
    ps = [r.params.top_p for r in rows]
    sorted_desc = -mx.sort(-scaled, axis=-1)
    kth = mx.take_along_axis(sorted_desc, mx.array(ks)[:, None] - 1, axis=-1)
    if all(p >= 1.0 for p in ps):
        return mx.where(scaled >= kth, scaled, -mx.inf)
    probs = mx.softmax(sorted_desc, axis=-1)
    mass_before = mx.cumsum(probs, axis=-1) - probs
    keep = mass_before < mx.array(ps, dtype=mx.float32)[:, None]
    keep[:, 0] = True  # the most likely token always stays, however small top_p is
    p_threshold = mx.min(mx.where(keep, sorted_desc, mx.inf), axis=-1, keepdims=True)
    return mx.where(scaled >= mx.maximum(kth, p_threshold), scaled, -mx.inf)


def sample(logits: mx.array, rows: list[RowSampling]) -> mx.array:
    """Sample one token per row. logits: [B, V] (any float dtype); returns int32 [B], lazy.

    Advances each non-greedy row's step counter (so the next call draws fresh noise).
    """
    logits = logits.astype(mx.float32)
    bias = _bias(rows, logits.shape[-1])
    if bias is not None:
        logits = logits + bias
    if all(r.greedy for r in rows):
        return mx.argmax(logits, axis=-1).astype(mx.int32)
    temps = mx.array([r.params.temperature if not r.greedy else 1.0 for r in rows], dtype=mx.float32)
    scaled = logits / temps[:, None]
    if any(0 < r.params.top_k < logits.shape[-1] or r.params.top_p < 1.0 for r in rows if not r.greedy):
        scaled = _top_k_top_p_mask(scaled, rows)
    noise = []
    for r in rows:
        if r.greedy:
            noise.append(mx.zeros((logits.shape[-1],), dtype=mx.float32))
        else:
            key = mx.random.key((r.seed * 1_000_003 + r.step) % _SEED_MOD)
            noise.append(mx.random.gumbel(shape=(logits.shape[-1],), key=key))
            r.step += 1
    return mx.argmax(scaled + mx.stack(noise), axis=-1).astype(mx.int32)
