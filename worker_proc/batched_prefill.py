"""Batched prefill: the final chunks of several new requests in one model call (issue 13).

Each row brings its own per-request caches (empty, a cached prefix gathered from the pool,
or its earlier chunks) and the tokens still to prefill. The caches are merged into one
left-padded `BatchKVCache` (each row's KV right-aligned), and the new tokens go in
right-padded (``[tokens..., pad...]``): the causal mask with the merged left padding keeps
every real query off every pad (pads only come after it), and RoPE takes each row's own
offset, its cached length. After the call the right padding is rolled round to the left
(`BatchKVCache.finalize`), which leaves the left-padded layout the decode batch uses. The
same scheme as mlx-lm's `BatchGenerator` prompt processing.

Rows are grouped by length first (`plan_groups`) so that padding stays a bounded share of
the tokens a group computes.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import BatchKVCache

from worker_proc.forward import has_plain_head, head, prefill_step

PAD_WASTE = 0.25
"""Padding a group may add, as a share of its real tokens (plus `PAD_SLACK`)."""
PAD_SLACK = 64
"""Padding tokens a group may add whatever its size (short prompts batch freely)."""
MIN_ROW_STEP = 64
"""Fewest tokens per row in one model call of a batched prefill."""


def plan_groups(lengths: list[int], waste: float = PAD_WASTE, slack: int = PAD_SLACK) -> list[list[int]]:
    """Indices into `lengths` (tokens to prefill per row), grouped for batched calls.

    Rows are taken shortest first; a row joins the current group while the group's padded
    size (rows x its longest row) stays within ``(1 + waste) x real tokens + slack``, else
    it starts a new group. Every index appears in exactly one group; a group lists its
    indices in ascending order (so one group keeps the rows in their given order).
    """
    groups: list[list[int]] = []
    current: list[int] = []
    real = 0
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        n = lengths[i]
        if current and (len(current) + 1) * n > (1 + waste) * (real + n) + slack:
            groups.append(sorted(current))
            current, real = [], 0
        current.append(i)
        real += n
    if current:
        groups.append(sorted(current))
    return groups


def prefill_rows(model: nn.Module, tokens: list[list[int]], caches: list[list]) -> tuple[mx.array, list[BatchKVCache]]:
    """Prefill B rows together (lazy).

    tokens[i]: row i's tokens after what caches[i] holds (at least one); caches[i]: row i's
    per-layer mlx-lm `KVCache`s (possibly empty). Returns (logits [B, V] of each row's last
    token; per-layer `BatchKVCache` holding the rows in order, left-padded, of width
    max(cached + new)). The per-row caches are read, not changed. Each model call takes at
    most ``max(MIN_ROW_STEP, prefill_step() // B)`` positions of every row.

    Raises `ValueError` for an empty row or mismatched lengths.
    """
    if len(tokens) != len(caches) or not tokens or any(not t for t in tokens):
        raise ValueError("prefill_rows needs one non-empty token list per cache")
    lens = [len(t) for t in tokens]
    width = max(lens)
    batch = [BatchKVCache.merge([c[layer] for c in caches]) for layer in range(len(caches[0]))]
    for c in batch:
        c.prepare(right_padding=[width - n for n in lens])
    padded = mx.array([t + [0] * (width - len(t)) for t in tokens], dtype=mx.int32)
    last = mx.array([n - 1 for n in lens], dtype=mx.int32)
    plain = has_plain_head(model)
    step = max(MIN_ROW_STEP, prefill_step() // len(tokens))
    picked = None
    for start in range(0, width, step):
        chunk = padded[:, start : start + step]
        out = model.model(chunk, cache=batch) if plain else model(chunk, cache=batch)
        at = mx.clip(last - start, 0, chunk.shape[1] - 1)
        here = mx.take_along_axis(out, at[:, None, None], axis=1)[:, 0]
        if picked is None:
            picked = here
        else:
            inside = (last >= start) & (last < start + chunk.shape[1])
            picked = mx.where(inside[:, None], here, picked)
    for c in batch:
        c.finalize()
    return (head(model, picked) if plain else picked), batch
