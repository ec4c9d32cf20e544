"""Logit edit rows: logit_bias, grammar masks and min_tokens as one additive row per request.

A grammar mask comes from the scheduler as xgrammar's packed bitmask (int32 words,
little-endian; bit j % 32 of word j // 32 set = token j allowed), unpacked here in the graph.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from protocol.token_mask import mask_words
from worker_proc.logits.row import RowSampling

_BITS = mx.arange(32, dtype=mx.int32)


def unpack_bitmasks(masks: list[bytes], vocab: int) -> mx.array:
    """bool [G, vocab]: True where token j is allowed by mask g. Raises `ValueError` when a
    mask is shorter than ceil(vocab / 32) words."""
    words = mask_words(vocab)
    if any(len(m) < 4 * words for m in masks):
        raise ValueError(f"a grammar mask has fewer than {words} int32 words for a vocabulary of {vocab}")
    packed = mx.array(np.stack([np.frombuffer(m, dtype="<i4", count=words) for m in masks]))
    bits = mx.right_shift(packed[:, :, None], _BITS) & 1
    return bits.reshape(len(masks), words * 32)[:, :vocab].astype(mx.bool_)


def edit_rows(
    rows: list[RowSampling], vocab: int, grammar: dict[int, bytes] | None = None
) -> tuple[mx.array, mx.array] | None:
    """The additive edits of this step: (row indices int32 [E], float32 [E, vocab]), or None
    when no row has one. grammar: batch row -> its packed mask for this step."""
    grammar = grammar or {}  # a grammar's mask wins over min_tokens: at its end it allows EOS alone
    idx = [i for i, r in enumerate(rows) if r.bias is not None or r.min_tokens_active or i in grammar]
    if not idx:
        return None
    zero = mx.zeros((vocab,), dtype=mx.float32)
    edit = mx.stack([rows[i].bias if rows[i].bias is not None else zero for i in idx])
    banned = [
        (j, t)
        for j, i in enumerate(idx)
        if rows[i].min_tokens_active and i not in grammar
        for t in rows[i].params.min_tokens_ids
        if 0 <= t < vocab
    ]
    if banned:
        edit[mx.array([j for j, _ in banned]), mx.array([t for _, t in banned])] = -mx.inf
    g_rows = [j for j, i in enumerate(idx) if i in grammar]
    if g_rows:
        allowed = unpack_bitmasks([grammar[idx[j]] for j in g_rows], vocab)
        sel = mx.array(g_rows)
        edit[sel] = mx.where(allowed, edit[sel], -mx.inf)
    return mx.array(idx, dtype=mx.int32), edit


def apply_edits(logits: mx.array, rows: list[RowSampling], grammar: dict[int, bytes] | None = None) -> mx.array:
    """logits float32 [B, V] plus each row's edit (unchanged when no row has one)."""
    edits = edit_rows(rows, logits.shape[-1], grammar)
    if edits is None:
        return logits
    idx, edit = edits
    return logits.at[idx].add(edit)
