"""Shape warm-up on a GPU: prepare the kernels of the shapes serving will meet, before ready.

MLX's CUDA backend prepares its kernels per shape the first time it meets one: about 100 ms
per new prefill shape and 20-50 ms per new decode batch size on an H200
(`python bench/shape_cost.py`), paid inside a request's time to first token.
Prefill shapes are bucketed (`shapes.shape_bucket`), so there are few of them:
this runs a prefill of every bucketed row count up to `max_rows`, for the new-token widths
`WIDTHS` and the cached widths `CACHED_WIDTHS` (no prefix, and a short shared one such as a
chat template's), and a captured decode step (`DecodeGraph`) of every batch size the graph
covers. On MLX's CPU backend, which prepares nothing per shape, it does nothing.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from protocol.enums import ForwardMode
from worker_proc.memory.kv_pool import kv_shapes
from worker_proc.memory.layer_caches import is_full
from worker_proc.model.batched_prefill import WIDTH_FLOOR, buckets_on, prefill_rows
from worker_proc.model.decode_graph import DecodeGraph
from worker_proc.model.loader import LoadedModel
from worker_proc.shapes import shape_bucket

WIDTHS = (WIDTH_FLOOR, 32, 64)
"""New-token widths (tokens) warmed for every row bucket: short chat prompts."""
CACHED_WIDTHS = (0, 32, 64)
"""Cached widths (tokens) warmed: none, and a short shared prefix (a chat template's head;
a short prompt sent again: 64)."""


def row_buckets(max_rows: int) -> list[int]:
    """The distinct `shape_bucket` row counts of 1..max_rows, ascending."""
    return sorted({shape_bucket(n, 1) for n in range(1, max_rows + 1)})


def _prefix(loaded: LoadedModel, width: int) -> list:
    """The model's per-layer caches, the full-attention layers holding `width` positions of
    zeros (a stand-in cached prefix; window and recurrent layers stay empty)."""
    out = make_prompt_cache(loaded.model)
    shapes = iter(kv_shapes(loaded.model))
    for c in out:
        if width and is_full(c):
            heads, k_dim, v_dim = next(shapes)
            c.update_and_fetch(
                mx.zeros((1, heads, width, k_dim), dtype=loaded.dtype),
                mx.zeros((1, heads, width, v_dim), dtype=loaded.dtype),
            )
    return out


def warm_shapes(loaded: LoadedModel, graph: DecodeGraph | None, max_rows: int) -> int:
    """Run the prefill and decode shapes described in the module doc when `buckets_on()`;
    returns how many model calls it made (0 on the CPU)."""
    if not buckets_on():
        return 0
    calls = 0
    for rows in row_buckets(max_rows):
        for cached in CACHED_WIDTHS:
            for width in WIDTHS:
                tokens = [[1] * width] * rows
                logits, _ = prefill_rows(loaded.model, tokens, [_prefix(loaded, cached) for _ in range(rows)])
                mx.eval(logits)
                calls += 1
    if graph is not None:
        for rows in range(1, graph.max_batch + 1):
            _, cache = prefill_rows(loaded.model, [[1] * WIDTH_FLOOR] * rows, [_prefix(loaded, 0) for _ in range(rows)])
            mx.eval(graph.run(ForwardMode.DECODE, mx.zeros((rows,), dtype=mx.int32), cache))
            calls += 1
    mx.clear_cache()
    return calls
