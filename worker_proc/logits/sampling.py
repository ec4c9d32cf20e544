"""Sampling one token per row from processed logits: greedy, temperature, top-k, top-p, min-p.

Noise is Gumbel from a counter-based hash of (the row's key, token id): the row's key comes
from (seed, tokens generated), so a seeded row's tokens depend only on its seed, its
position and its logits, whatever batch it runs in; and the noise of any token can be
computed alone, so rows that truncate draw it only for their candidates. Greedy rows take
the argmax and draw nothing.

Truncating rows (top-k, top-p or min-p) work on candidates: the `CANDIDATES` most likely
tokens (or the batch's largest top-k when every row has a smaller one), found with a
partial sort (a full sort of 49,152 logits for 16 rows takes 72 ms on 2 CPU cores, the
partition 9 ms). Top-p mass is measured against the whole vocabulary, so the result is
exact unless a row's top-p nucleus or min-p set holds more than `CANDIDATES` tokens, which
is then cut to them (and a top-k above it acts as `CANDIDATES`).
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from worker_proc.logits.row import RowSampling

CANDIDATES = 1024
"""Tokens a truncating row samples among, at most (see the module doc)."""

_M1, _M2, _GOLDEN = 0x7FEB352D, 0x846CA68B, 0x9E3779B9


def _mix(x: mx.array) -> mx.array:
    """A 32-bit integer hash (the "lowbias32" xor-shift-multiply mixer); uint32 in, out."""
    x = x ^ (x >> 16)
    x = x * _M1
    x = x ^ (x >> 15)
    x = x * _M2
    return x ^ (x >> 16)


def gumbel_at(keys: mx.array, ids: mx.array) -> mx.array:
    """Gumbel(0, 1) noise float32 of token `ids` under each row's key.

    keys: uint32 [S, 2] (high, low words); ids: int32 [S, K] or [K] (broadcast to every row).
    Noise(row, j) is a pure function of (key, j): the same for a token whichever set of
    ids it is drawn with; finite everywhere (see `uniform`).
    """
    j = ids.astype(mx.uint32)
    return -mx.log(-mx.log(uniform(_mix(_mix(j * _GOLDEN + keys[:, 1:2]) ^ keys[:, 0:1]))))


def uniform(h: mx.array) -> mx.array:
    """uint32 hashes -> float32 uniforms strictly inside (0, 1), from their top 23 bits
    ((2**23 - 0.5) / 2**23 is exact in float32; with 24 bits the largest rounds to 1.0 and
    its Gumbel noise is +inf)."""
    return ((h >> 9).astype(mx.float32) + 0.5) * (1.0 / (1 << 23))


def truncation_mask(
    scaled: mx.array, top_k: list[int], top_p: list[float], min_p: list[float], log_norm: mx.array | None = None
) -> mx.array:
    """Logits outside each row's top-k set, top-p nucleus and min-p set set to -inf.

    scaled: float32 [B, N] (after temperature; N: the vocabulary or candidates); top_k[i] in
    1..N (N = off); top_p[i] in (0, 1] (the smallest set of most likely tokens whose mass
    reaches top_p; the top token always stays); min_p[i] in [0, 1] (tokens with probability
    below min_p times the top token's are dropped; 0 = off). log_norm: float32 [B, 1], the
    log of each row's normalizer when `scaled` holds only candidates (None: `scaled` is the
    whole row).
    """
    n = scaled.shape[-1]
    threshold = None
    if any(k < n for k in top_k) or any(p < 1.0 for p in top_p):
        sorted_desc = -mx.sort(-scaled, axis=-1)
        threshold = mx.take_along_axis(sorted_desc, mx.array(top_k)[:, None] - 1, axis=-1)
        if any(p < 1.0 for p in top_p):
            probs = mx.softmax(sorted_desc, axis=-1) if log_norm is None else mx.exp(sorted_desc - log_norm)
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


def _truncates(r: RowSampling, vocab: int) -> bool:
    return 0 < r.params.top_k < vocab or r.params.top_p < 1.0 or r.params.min_p > 0


def _keys(rows: list[RowSampling]) -> mx.array:
    return mx.array(np.array([r.noise_key() for r in rows], dtype=np.uint32))


def _sample_full(logits: mx.array, rows: list[RowSampling]) -> mx.array:
    """Rows without truncation: temperature and noise over the whole vocabulary; int32 [S]."""
    scaled = logits / mx.array([r.params.temperature for r in rows], dtype=mx.float32)[:, None]
    noise = gumbel_at(_keys(rows), mx.arange(logits.shape[-1], dtype=mx.int32))
    return mx.argmax(scaled + noise, axis=-1).astype(mx.int32)


def _sample_candidates(logits: mx.array, rows: list[RowSampling]) -> mx.array:
    """Truncating rows: top-k, top-p and min-p among the candidates; int32 [S]."""
    vocab = logits.shape[-1]
    ks = [min(r.params.top_k if 0 < r.params.top_k < vocab else vocab, CANDIDATES) for r in rows]
    exact_k = all(0 < r.params.top_k <= CANDIDATES and r.params.top_k < vocab for r in rows)
    n = min(vocab, max(ks) if exact_k else CANDIDATES)
    scaled = logits / mx.array([r.params.temperature for r in rows], dtype=mx.float32)[:, None]
    ids = (
        mx.argpartition(-scaled, kth=n - 1, axis=-1)[:, :n]
        if n < vocab
        else mx.broadcast_to(mx.arange(vocab, dtype=mx.int32), scaled.shape)
    )
    cand = mx.take_along_axis(scaled, ids, axis=-1)
    log_norm = mx.logsumexp(scaled, axis=-1, keepdims=True) if n < vocab else None
    cand = truncation_mask(
        cand, [min(k, n) for k in ks], [r.params.top_p for r in rows], [r.params.min_p for r in rows], log_norm
    )
    pick = mx.argmax(cand + gumbel_at(_keys(rows), ids), axis=-1)
    return mx.take_along_axis(ids, pick[:, None], axis=-1)[:, 0].astype(mx.int32)


def sample(logits: mx.array, rows: list[RowSampling]) -> mx.array:
    """One token per row. logits: float32 [B, V] after edits and penalties; int32 [B], lazy.

    Does not advance the rows' `generated` counters (`pipeline.process` does).
    """
    vocab = logits.shape[-1]
    out = mx.argmax(logits, axis=-1).astype(mx.int32)
    groups = (
        ([i for i, r in enumerate(rows) if not r.greedy and not _truncates(r, vocab)], _sample_full),
        ([i for i, r in enumerate(rows) if not r.greedy and _truncates(r, vocab)], _sample_candidates),
    )
    for idx, fn in groups:
        if len(idx) == len(rows):
            return fn(logits, rows)
        if idx:
            sel = mx.array(idx, dtype=mx.int32)
            out[sel] = fn(logits[sel], [rows[i] for i in idx])
    return out
