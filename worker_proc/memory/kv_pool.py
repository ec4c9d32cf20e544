"""`KVPool`: KV storage addressed by the scheduler's slot ids (the radix cache's memory).

Running requests keep their KV in their own caches (the decode batch's `BatchKVCache`);
when a request finishes, the scheduler has the worker copy the KV of its new tokens into
the pool at the slots the radix cache now owns (`store`), and a later request whose
prompt starts with those tokens gathers them (`gather`) instead of computing them.
Its size in slots is chosen by `worker_proc.memory.kv_sizing`.

Layout: slot ids 1..size are cut into segments of R = `segment_slots` consecutive ids;
per segment and full-attention layer, keys [R + 1, kv_heads, key_dim] and values [R + 1,
kv_heads, value_dim] (`kv_shapes`; the last
segment holds the ids left): row 0 is zeros, never stored into, and id x of segment
(x - 1) // R is its row (x - 1) % R + 1. Slot 0, the padding of a left-padded row, reads
row 0 of a segment the gather touches anyway, so a gather whose slots lie in one segment is
one indexing, padded or not. Segment 0 is allocated at start; each other one when a store
first writes into it. MLX has no
uninitialised allocation (`mx.empty` is `mx.zeros`), so a pool allocated whole is written
whole at start-up: 4.3 GB for the default model, 11-16 s of page faults on a 2-core VM and
all of it resident while idle. The scheduler's allocator reuses freed ids before fresh ones
and takes fresh ones in increasing order (`TokenToKVPoolAllocator`), so the highest id
stored, and with it the memory allocated, follows the most tokens the pool held at once.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from worker_proc.memory.layer_caches import CacheKinds

_SHAPES = "_lazyserve_kv_shapes"
"""The attribute that keeps `kv_shapes`' answer on the model (the probe runs once)."""


def kv_shapes(model) -> list[tuple[int, int, int]]:
    """(kv_heads, key_dim, value_dim) of each full-attention layer of an mlx-lm model
    (`CacheKinds.kv`, in order; [] for a model without any), read from the caches one token
    leaves, so layers of other shapes (Gemma 4's global layers, DeepSeek's MLA keys and
    values) come out as the model keeps them. The probe runs once per model, at load, on
    every ``--tp`` rank alike (it may be a collective call). Raises
    `layer_caches.UnsupportedCache` for a cache type the worker does not serve."""
    known = getattr(model, _SHAPES, None)
    if known is not None:
        return known
    layers = CacheKinds.of(model).kv
    shapes = []
    if layers:
        probe = make_prompt_cache(model)
        model(mx.array([[0]], dtype=mx.int32), cache=probe)
        shapes = [(probe[i].keys.shape[1], probe[i].keys.shape[3], probe[i].values.shape[3]) for i in layers]
    setattr(model, _SHAPES, shapes)
    return shapes


def bytes_per_token(model, dtype: mx.Dtype) -> int:
    """KV bytes one token takes in the pool: the sum over full-attention layers of kv_heads
    x (key_dim + value_dim) x dtype size (window and recurrent layers keep none per token)."""
    return sum(h * (k + v) for h, k, v in kv_shapes(model)) * dtype.size


MAX_SEGMENTS = 16
"""A pool is cut into at most this many segments (a gather or store touching k segments
costs k indexings per layer instead of one)."""

MIN_SEGMENT_SLOTS = 4096
"""Slot ids per segment at least (a pool of at most this many slots is one segment)."""


def segment_slots(size: int, minimum: int | None = None) -> int:
    """Slot ids per segment of a pool of `size` slots (ids 1..size): ``ceil(size /
    MAX_SEGMENTS)``, at least `minimum` (default `MIN_SEGMENT_SLOTS`) and 1."""
    return max(MIN_SEGMENT_SLOTS if minimum is None else minimum, 1, math.ceil(size / MAX_SEGMENTS))


def split_by_segment(
    ids: np.ndarray, segment: int, first_row: int = 1
) -> list[tuple[int, np.ndarray | None, mx.array]]:
    """(segment, positions of `ids` in it or None when all are, their rows in it as int32)
    for each segment of `segment` consecutive slot ids (from id 1) that `ids` (int64 slot
    ids, any shape; the positions index ``ids.ravel()``) touch, in segment order. Id x is row
    ``(x - 1) % segment + first_row`` of segment ``(x - 1) // segment``; id 0 (padding, with
    `first_row` 1) goes to row 0 of the first segment touched (segment 0 when none is)."""
    real = ids > 0
    seg = np.where(real, (ids - 1) // segment, -1)
    rows = np.where(real, (ids - 1) % segment + first_row, 0)
    touched = np.unique(seg[real]).tolist() or [0]
    if len(touched) == 1:
        return [(touched[0], None, mx.array(rows.astype(np.int32)))]
    seg = np.where(real, seg, touched[0]).ravel()
    flat = rows.ravel()
    out = []
    for s in touched:
        pos = np.flatnonzero(seg == s)
        out.append((s, pos, mx.array(flat[pos].astype(np.int32))))
    return out


class KVPool:
    """Per-layer key/value arrays indexed by slot id, allocated by segment as stores reach
    them (see module doc). segments: how many there are, of `segment` slot ids each (the last
    one may hold fewer); keys[layer][s] / values[layer][s]: segment s of that layer, None
    until allocated."""

    def __init__(self, model, size: int, dtype: mx.Dtype) -> None:
        self.shapes = kv_shapes(model)
        """(kv_heads, key_dim, value_dim) per layer."""
        layers = len(self.shapes)
        self.size = size
        self.dtype = dtype
        self.segment = segment_slots(size)
        self.segments = max(1, math.ceil(size / self.segment))
        self.keys: list[list[mx.array | None]] = [[None] * self.segments for _ in range(layers)]
        self.values: list[list[mx.array | None]] = [[None] * self.segments for _ in range(layers)]
        self._allocate(0)
        mx.eval(self.arrays())  # segment 0 now, at start-up, not inside the first request's launch

    def arrays(self) -> list[mx.array]:
        """Every allocated segment array (to evaluate or wait for)."""
        return [a for per_layer in (*self.keys, *self.values) for a in per_layer if a is not None]

    def allocated_slots(self) -> int:
        """Slot ids with storage now (the segments' zero rows not counted)."""
        if not self.keys:
            return 0
        return sum(a.shape[0] - 1 for a in self.keys[0] if a is not None)

    def _allocate(self, s: int) -> None:
        """Zero-filled storage for segment `s` in every layer (lazy; no-op when it has some)."""
        if not self.keys or self.keys[0][s] is not None:
            return
        rows = 1 + min(self.segment, self.size - s * self.segment)
        for keys, values, (heads, k_dim, v_dim) in zip(self.keys, self.values, self.shapes):
            keys[s] = mx.zeros((rows, heads, k_dim), dtype=self.dtype)
            values[s] = mx.zeros((rows, heads, v_dim), dtype=self.dtype)

    def gather(self, slots: list[int]) -> list[tuple[mx.array, mx.array]]:
        """Per layer (keys, values) of `slots`, shaped [1, kv_heads, len(slots), head_dim] (lazy).
        Raises `ValueError` as `gather_rows`."""
        return self.gather_rows([slots], len(slots))

    def gather_rows(self, rows: list[list[int]], width: int) -> list[tuple[mx.array, mx.array]]:
        """Per layer (keys, values) [len(rows), kv_heads, width, head_dim] (lazy): row i holds
        the KV of `rows[i]` right-aligned, after ``width - len(rows[i])`` positions of slot 0
        (zeros), i.e. the left-padded layout of mlx-lm's `BatchKVCache`. One indexing per
        pool array and segment touched for all rows (a per-row gather costs a kernel per row
        and layer, which a GPU's host thread pays for: ~2.5 ms per row of a 64-row prefill on
        an H200); slots in more than one segment are put back in order by one more indexing.
        Raises `ValueError` when a row holds more than `width` slots, or a slot outside
        1..size or in a segment nothing was stored into."""
        if any(len(r) > width for r in rows):
            raise ValueError(f"a row of {max(map(len, rows))} slots does not fit in {width} positions")
        ids = np.array([[0] * (width - len(r)) + list(r) for r in rows], dtype=np.int64).reshape(len(rows), width)
        self._check(ids)
        parts = split_by_segment(ids, self.segment)
        if any(self.keys and self.keys[0][s] is None for s, _, _ in parts):
            raise ValueError(
                f"slots in segments {[s for s, _, _ in parts if self.keys[0][s] is None]} "
                f"(of {self.segment} ids each, from id 1) were never stored"
            )
        order = None
        if len(parts) > 1:  # where each flat position landed in the segment-ordered concatenation
            order = np.empty(ids.size, dtype=np.int32)
            order[np.concatenate([pos for _, pos, _ in parts])] = np.arange(ids.size, dtype=np.int32)
            order = mx.array(order.reshape(ids.shape))

        def take(segments: list[mx.array]) -> mx.array:
            if order is None:
                s, _, local = parts[0]
                return segments[s][local].transpose(0, 2, 1, 3)
            return mx.concatenate([segments[s][local] for s, _, local in parts])[order].transpose(0, 2, 1, 3)

        return [(take(k), take(v)) for k, v in zip(self.keys, self.values)]

    def _check(self, ids: np.ndarray) -> None:
        """Raises `ValueError` when an id of `ids` is outside 0..size."""
        if ids.size and (ids.min() < 0 or ids.max() > self.size):
            raise ValueError(f"slots {ids.min()}..{ids.max()} are not all pool slots (1..{self.size})")

    def store(self, slots: list[int], kv: list[tuple[mx.array, mx.array]]) -> None:
        """Write per-layer (keys, values) shaped [len(slots), kv_heads, head_dim] at `slots`
        (every request's positions at once, e.g. `RunningBatch.rows_kv`): one scatter per
        pool array and segment touched, started with `mx.async_eval` (it does not wait for
        it); a segment not yet allocated is allocated first. Raises `ValueError` for a slot
        outside 1..size.

        It first waits for the previous store to be computed: MLX copies an array whole when
        a scatter into it is built while an earlier write into it is still pending (two
        stores back to back into a 4.2 GB pool: 3.6 s on a 2-core CPU instead of 6 ms;
        `python bench/pool_store.py`). That write is normally done already (it was queued
        behind the launch the scheduler has just finalized)."""
        if not slots:
            return
        ids = np.asarray(slots, dtype=np.int64)
        if ids.min() < 1:
            raise ValueError(f"slot {ids.min()} is not a pool slot (1..{self.size}); slot 0 is padding")
        self._check(ids)
        mx.eval(self.arrays())
        parts = split_by_segment(ids, self.segment)
        for s, _, _ in parts:
            self._allocate(s)
        picks = [(s, None if pos is None else mx.array(pos.astype(np.int32)), local) for s, pos, local in parts]
        for layer, (k, v) in enumerate(kv):
            for s, rows, local in picks:
                self.keys[layer][s][local] = k if rows is None else k[rows]
                self.values[layer][s][local] = v if rows is None else v[rows]
        mx.async_eval(self.arrays())
