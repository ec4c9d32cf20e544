"""`StatePool`: recurrent-state and window snapshots addressed by the scheduler's state slots.

A model with recurrent or sliding-window layers (`layer_caches`) cannot resume a cached
prefix from the KV pool alone: the state of its recurrent layers after the prefix is needed
too, and it cannot be cut back from a longer one; a window layer needs the KV of the last
`window` positions before the prefix's end, which the pool does not keep (it holds the
full-attention layers only, so a window layer costs a running request its window, not its
history). Both are *snapshot* layers (`CacheKinds.snapshot`); a window layer's snapshot is
its last `window` positions' keys and values (`window_cache.window_arrays`), restored by
`load` for the prefix's length. The scheduler has the worker copy a request's state into a slot at
chunk-aligned prompt positions and at the prompt's end (`ForwardBatch.state_save_at`), and,
with ``--enable-mamba-extra-buffer``, at the end of the request (`StoreKV.state_slots`); it
keeps the slot in its radix cache beside that prefix's KV, and has a later request with the
same prefix start from it (`ForwardBatch.state_restores`).

Layout: slot ids 1..size are cut into segments of R = ``segment_slots(size, 1)`` consecutive
ids (at most `kv_pool.MAX_SEGMENTS`); for each snapshot layer, each of its arrays and
each segment, one array ``[R, *row shape]`` (a row's shape as the model keeps it; the last
segment holds the ids left), where id x is row (x - 1) % R of segment (x - 1) // R. Segment 0
is allocated at start, each other one when a save first writes into it, as the KV pool's
(`kv_pool`): the pool may take a tenth of the memory offered, and written whole at start-up
(MLX has no uninitialised allocation) that cost seconds of page faults and stayed resident
while idle. The scheduler's allocator takes fresh ids in increasing order. Its size in slots
is chosen by `size_state_pool`.
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from worker_proc.memory.kv_pool import segment_slots, split_by_segment
from worker_proc.memory.layer_caches import WINDOW, CacheKinds
from worker_proc.memory.window_cache import restore_window, window_arrays

STATE_MEMORY_SHARE = 0.1
"""The share of the memory offered at start-up that snapshots may take at most."""


def state_rows(model, kinds: CacheKinds) -> list[list[mx.array]]:
    """One request's snapshot after one token, per snapshot layer (`kinds.snapshot`): a
    recurrent layer's state arrays, a window layer's [keys, values] of `window` positions
    (`window_arrays`), each array [1, ...] (the shapes and dtypes a snapshot holds)."""
    probe = make_prompt_cache(model)
    model(mx.array([[0]], dtype=mx.int32), cache=probe)
    rows = [_arrays(kinds, layer, probe[layer]) for layer in kinds.snapshot]
    mx.eval(rows)
    return rows


def _arrays(kinds: CacheKinds, layer: int, cache) -> list[mx.array]:
    """The snapshot arrays of cache `layer` (one request's or batched; lazy references)."""
    if kinds.kinds[layer] == WINDOW:
        return window_arrays(cache, kinds.windows[layer])
    return list(cache.cache)


def size_state_pool(kv_tokens: int, interval: int, max_running: int, available_bytes: int, per_slot: int) -> int:
    """State slots to allocate: one per `interval` tokens the KV pool holds (a snapshot
    marks that many cached tokens) plus one per running request (snapshots taken but not yet
    cached), at most `STATE_MEMORY_SHARE` of `available_bytes` at `per_slot` bytes each."""
    wanted = kv_tokens // max(interval, 1) + max_running
    return max(0, min(wanted, int(available_bytes * STATE_MEMORY_SHARE) // max(per_slot, 1)))


class StatePool:
    """Snapshots of recurrent state and windows by slot id, allocated by segment as saves reach them (see
    module doc). rows: `state_rows`' output; size: usable slots (ids 1..size); segments: how
    many there are, of `segment` ids each."""

    def __init__(self, kinds: CacheKinds, rows: list[list[mx.array]], size: int) -> None:
        self.kinds = kinds
        self.layers = kinds.snapshot
        self.size = size
        self.rows = rows
        self.segment = segment_slots(size, 1)
        self.segments = max(1, math.ceil(size / self.segment))
        self.parts: list[list[list[mx.array | None]]] = [[[None] * self.segments for _ in layer] for layer in rows]
        """parts[layer][e][s]: segment s of snapshot array e of layer `layers[layer]`."""
        self._allocate(0)
        mx.eval(self.arrays())  # segment 0 now, at start-up

    @staticmethod
    def bytes_per_slot(rows: list[list[mx.array]]) -> int:
        """Bytes one snapshot takes."""
        return sum(a.nbytes for layer in rows for a in layer)

    def arrays(self) -> list[mx.array]:
        """Every allocated segment array (to evaluate or wait for)."""
        return [a for layer in self.parts for per_array in layer for a in per_array if a is not None]

    def allocated_slots(self) -> int:
        """Slot ids with storage now."""
        return sum(a.shape[0] for a in self.parts[0][0] if a is not None) if self.parts and self.parts[0] else 0

    def _allocate(self, s: int) -> None:
        """Zero-filled storage for segment `s` (lazy; no-op when it has some)."""
        count = min(self.segment, self.size - s * self.segment)
        for layer, row in zip(self.parts, self.rows):
            for per_array, a in zip(layer, row):
                if per_array[s] is None:
                    per_array[s] = mx.zeros((count, *a.shape[1:]), dtype=a.dtype)

    def save(self, slots: list[int], cache: list, rows: list[int]) -> list[mx.array]:
        """Copy the state of batch rows `rows` of per-layer caches `cache` (batched, or one
        request's as a batch of one) into `slots` (one slot per row; lazy); returns the pool
        arrays to evaluate with the launch. Raises `ValueError` for a slot outside
        1..size."""
        return self.save_arrays(slots, self.arrays_of(cache), rows)

    def arrays_of(self, cache: list) -> list[list[mx.array]]:
        """The snapshot arrays of per-layer caches `cache`, per snapshot layer (lazy
        references: the caches' later steps replace them, never change them)."""
        return [_arrays(self.kinds, layer, cache[layer]) for layer in self.layers]

    def store(self, slots: list[int], states: list[list[mx.array]], rows: list[int]) -> None:
        """`save_arrays` outside a launch (a request's end snapshot), started with
        `mx.async_eval` after the pool's previous writes are computed (as `KVPool.store`:
        a write built on a pending one copies the whole pool)."""
        mx.eval(self.arrays())
        mx.async_eval(self.save_arrays(slots, states, rows))

    def save_arrays(self, slots: list[int], states: list[list[mx.array]], rows: list[int]) -> list[mx.array]:
        """`save` from `arrays_of`'s output: one scatter per state array and segment touched;
        a segment not yet allocated is allocated first."""
        for slot in slots:
            self.check(slot)
        if not slots:
            return self.arrays()
        src = mx.array(rows, dtype=mx.int32)
        for seg, pos, local in split_by_segment(np.asarray(slots, dtype=np.int64), self.segment, first_row=0):
            self._allocate(seg)
            picked = src if pos is None else src[mx.array(pos.astype(np.int32))]
            for layer, state in zip(self.parts, states):
                for per_array, a in zip(layer, state):
                    per_array[seg][local] = a[picked]
        return self.arrays()

    def snapshot(self, slot: int) -> list[list[mx.array]]:
        """The state saved in `slot`, per snapshot layer and array, each [*row shape]
        (lazy). Raises `ValueError` for a slot outside 1..size or one never saved into."""
        self.check(slot)
        seg, row = divmod(slot - 1, self.segment)
        if self.parts[0][0][seg] is None:
            raise ValueError(f"state slot {slot} (segment {seg} of {self.segment} ids) was never saved into")
        return [[per_array[seg][row] for per_array in layer] for layer in self.parts]

    def load(self, slot: int, cache: list, length: int) -> None:
        """Set a fresh per-request cache's snapshot layers to the snapshot in `slot`, taken
        after `length` positions (lazy). Raises `ValueError` as `snapshot`."""
        for state, layer in zip(self.snapshot(slot), self.layers):
            if self.kinds.kinds[layer] == WINDOW:
                restore_window(cache[layer], *state, length)
            else:
                cache[layer].cache = [a[None] for a in state]

    def check(self, slot: int) -> None:
        """Raise `ValueError` unless `slot` is one of 1..size."""
        if not 1 <= slot <= self.size:
            raise ValueError(f"state slot {slot} is not one of 1..{self.size}")
