"""`StatePool`: recurrent-state snapshots addressed by the scheduler's state slots.

A model with recurrent layers (`layer_caches`) cannot resume a cached prefix from KV alone:
the state of its recurrent layers after the prefix is needed too, and it cannot be cut back
from a longer one. The scheduler has the worker copy a request's state into a slot at
chunk-aligned prompt positions and at the prompt's end (`ForwardBatch.state_save_at`), and,
with ``--enable-mamba-extra-buffer``, at the end of the request (`StoreKV.state_slots`); it
keeps the slot in its radix cache beside that prefix's KV, and has a later request with the
same prefix start from it (`ForwardBatch.state_restores`).

Layout: for each recurrent layer and each of its state arrays, one array
``[slots + 1, *row shape]`` (a row's shape as the model keeps it; slot 0 unused). Its size in
slots is chosen by `size_state_pool`.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from worker_proc.layer_caches import CacheKinds

STATE_MEMORY_SHARE = 0.1
"""The share of the memory offered at start-up that snapshots may take at most."""


def state_rows(model, kinds: CacheKinds) -> list[list[mx.array]]:
    """One request's recurrent state after one token, per recurrent layer (`kinds.state`),
    each array [1, ...] (the shapes and dtypes a snapshot holds)."""
    probe = make_prompt_cache(model)
    model(mx.array([[0]], dtype=mx.int32), cache=probe)
    rows = [[a for a in probe[layer].cache] for layer in kinds.state]
    mx.eval(rows)
    return rows


def size_state_pool(kv_tokens: int, interval: int, max_running: int, available_bytes: int, per_slot: int) -> int:
    """State slots to allocate: one per `interval` tokens the KV pool holds (a snapshot
    marks that many cached tokens) plus one per running request (snapshots taken but not yet
    cached), at most `STATE_MEMORY_SHARE` of `available_bytes` at `per_slot` bytes each."""
    wanted = kv_tokens // max(interval, 1) + max_running
    return max(0, min(wanted, int(available_bytes * STATE_MEMORY_SHARE) // max(per_slot, 1)))


class StatePool:
    """Snapshots of recurrent state by slot id (see module doc). rows: `state_rows`' output;
    size: usable slots (ids 1..size)."""

    def __init__(self, kinds: CacheKinds, rows: list[list[mx.array]], size: int) -> None:
        self.layers = kinds.state
        self.size = size
        self.arrays = [[mx.zeros((size + 1, *a.shape[1:]), dtype=a.dtype) for a in layer] for layer in rows]
        mx.eval(self.arrays)  # allocate now, at start-up

    @staticmethod
    def bytes_per_slot(rows: list[list[mx.array]]) -> int:
        """Bytes one snapshot takes."""
        return sum(a.nbytes for layer in rows for a in layer)

    def save(self, slots: list[int], cache: list, rows: list[int]) -> list[mx.array]:
        """Copy the state of batch rows `rows` of per-layer caches `cache` (batched, or one
        request's as a batch of one) into `slots` (one slot per row; lazy); returns the pool
        arrays to evaluate with the launch. Raises `ValueError` for a slot outside
        1..size."""
        return self.save_arrays(slots, self.arrays_of(cache), rows)

    def arrays_of(self, cache: list) -> list[list[mx.array]]:
        """The state arrays of per-layer caches `cache`, per recurrent layer (references:
        the caches' later steps replace them, never change them)."""
        return [list(cache[layer].cache) for layer in self.layers]

    def store(self, slots: list[int], states: list[list[mx.array]], rows: list[int]) -> None:
        """`save_arrays` outside a launch (a request's end snapshot), started with
        `mx.async_eval` after the pool's previous writes are computed (as `KVPool.store`:
        a write built on a pending one copies the whole pool)."""
        mx.eval(self.arrays)
        mx.async_eval(self.save_arrays(slots, states, rows))

    def save_arrays(self, slots: list[int], states: list[list[mx.array]], rows: list[int]) -> list[mx.array]:
        """`save` from `arrays_of`'s output."""
        for slot in slots:
            self.check(slot)
        src, dst = mx.array(rows, dtype=mx.int32), mx.array(slots, dtype=mx.int32)
        for arrays, layer in zip(self.arrays, states):
            for e, a in enumerate(layer):
                arrays[e][dst] = a[src]
        return [a for arrays in self.arrays for a in arrays]

    def load(self, slot: int, cache: list) -> None:
        """Set a fresh per-request cache's recurrent layers to the state in `slot` (lazy).
        Raises `ValueError` for a slot outside 1..size."""
        self.check(slot)
        for arrays, layer in zip(self.arrays, self.layers):
            cache[layer].cache = [a[slot][None] for a in arrays]

    def check(self, slot: int) -> None:
        """Raise `ValueError` unless `slot` is one of 1..size."""
        if not 1 <= slot <= self.size:
            raise ValueError(f"state slot {slot} is not one of 1..{self.size}")
