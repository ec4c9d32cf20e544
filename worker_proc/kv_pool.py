"""`KVPool`: KV storage addressed by the scheduler's slot ids (the radix cache's memory).

Running requests keep their KV in their own caches (the decode batch's `BatchKVCache`);
when a request finishes, the scheduler has the worker copy the KV of its new tokens into
the pool at the slots the radix cache now owns (`store`), and a later request whose
prompt starts with those tokens gathers them (`gather`) instead of computing them.
Layout per layer: keys and values [slots + 1, kv_heads, head_dim]; slot 0 is padding.
Its size in slots is chosen by `worker_proc.kv_sizing`.
"""

from __future__ import annotations

import mlx.core as mx

from worker_proc.layer_caches import CacheKinds


def kv_shape(model) -> tuple[int, int, int]:
    """(attention layers, kv_heads, head_dim) of an mlx-lm model; (0, 0, 0) for a model
    without attention layers (recurrent state only). Raises `ValueError` when its arguments
    do not say, and `layer_caches.UnsupportedCache` for a cache type it does not serve."""
    layers = len(CacheKinds.of(model).kv)
    if not layers:
        return 0, 0, 0
    args = model.args
    heads = getattr(args, "num_attention_heads", None)
    kv_heads = getattr(args, "num_key_value_heads", None) or heads
    head_dim = getattr(args, "head_dim", None) or (args.hidden_size // heads if heads else None)
    if not (kv_heads and head_dim):
        raise ValueError(f"cannot tell the KV shape of model type {getattr(args, 'model_type', '?')}")
    return layers, int(kv_heads), int(head_dim)


def bytes_per_token(model, dtype: mx.Dtype) -> int:
    """KV bytes one token takes in the pool: layers x 2 x kv_heads x head_dim x dtype size."""
    layers, kv_heads, head_dim = kv_shape(model)
    return layers * 2 * kv_heads * head_dim * dtype.size


class KVPool:
    """Per-layer key/value arrays indexed by slot id (see module doc)."""

    def __init__(self, model, size: int, dtype: mx.Dtype) -> None:
        layers, kv_heads, head_dim = kv_shape(model)
        self.size = size
        self.keys = [mx.zeros((size + 1, kv_heads, head_dim), dtype=dtype) for _ in range(layers)]
        self.values = [mx.zeros((size + 1, kv_heads, head_dim), dtype=dtype) for _ in range(layers)]
        mx.eval(self.keys, self.values)  # allocate now, at start-up, not inside the first request's launch

    def gather(self, slots: list[int]) -> list[tuple[mx.array, mx.array]]:
        """Per layer (keys, values) of `slots`, shaped [1, kv_heads, len(slots), head_dim] (lazy)."""
        return self.gather_rows([slots], len(slots))

    def gather_rows(self, rows: list[list[int]], width: int) -> list[tuple[mx.array, mx.array]]:
        """Per layer (keys, values) [len(rows), kv_heads, width, head_dim] (lazy): row i holds
        the KV of `rows[i]` right-aligned, after ``width - len(rows[i])`` positions of slot 0
        (zeros), i.e. the left-padded layout of mlx-lm's `BatchKVCache`. One indexing per
        pool array for all rows (a per-row gather costs a kernel per row and layer, which a
        GPU's host thread pays for: ~2.5 ms per row of a 64-row prefill on an H200).
        Raises `ValueError` when a row holds more than `width` slots."""
        if any(len(r) > width for r in rows):
            raise ValueError(f"a row of {max(map(len, rows))} slots does not fit in {width} positions")
        idx = mx.array([[0] * (width - len(r)) + list(r) for r in rows], dtype=mx.int32)
        return [(k[idx].transpose(0, 2, 1, 3), v[idx].transpose(0, 2, 1, 3)) for k, v in zip(self.keys, self.values)]

    def store(self, slots: list[int], kv: list[tuple[mx.array, mx.array]]) -> None:
        """Write per-layer (keys, values) shaped [len(slots), kv_heads, head_dim] at `slots`
        (every request's positions at once, e.g. `RunningBatch.rows_kv`): one scatter per
        pool array, started with `mx.async_eval` (it does not wait for it).

        It first waits for the previous store to be computed: MLX copies an array whole when
        a scatter into it is built while an earlier write into it is still pending (two
        stores back to back into a 4.2 GB pool: 3.6 s on a 2-core CPU instead of 6 ms;
        `python bench/pool_store.py`). That write is normally done already (it was queued
        behind the launch the scheduler has just finalized)."""
        if not slots:
            return
        mx.eval(self.keys, self.values)
        idx = mx.array(slots, dtype=mx.int32)
        for layer, (k, v) in enumerate(kv):
            self.keys[layer][idx] = k
            self.values[layer][idx] = v
        mx.async_eval(self.keys, self.values)
