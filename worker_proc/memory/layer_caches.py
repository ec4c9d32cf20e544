"""The kinds of per-layer caches a model makes, and the operations the worker needs on each.

mlx-lm builds a model's caches with ``model.make_cache()`` (or one `KVCache` per layer
when the model has no such method). Three kinds are served:

- attention (`KVCache`): keys and values per position, batched as a left-padded
  `BatchKVCache`, gathered from and stored to the KV pool by slot;
- sliding-window attention (`RotatingKVCache` without kept tokens: gpt-oss, Gemma 3 and 4,
  Ministral 3): a query attends to the last `window` positions only; a running request
  holds its window, not its history (`window_cache`);
- recurrent state (`ArraysCache`: Mamba / Mamba-2 SSM and conv state, LFM2 short-conv
  state, gated DeltaNet): a fixed-size state per request, batched row by row
  (`ArraysCache.merge`), that cannot be cut back to a prefix the way KV can.

Window and recurrent layers are the *snapshot* layers: what a cached prefix needs beside
the KV pool's positions. Hybrid models (LFM2, Nemotron-H, Granite 4 hybrids, Qwen3-Next)
mix attention and recurrent layers; pure recurrent models (Mamba-2) have no attention layer
at all. Any other cache type (a window with kept tokens, chunked or quantized KV, nested
cache lists) is refused at start-up by `CacheKinds.of`, naming the architecture and the
type.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, BatchKVCache, KVCache, RotatingKVCache, make_prompt_cache

from worker_proc.memory.window_cache import is_window, merge_window

KV, WINDOW, STATE = "kv", "window", "state"


class UnsupportedCache(ValueError):
    """The model makes a cache type the worker does not serve (see the module docstring)."""


@dataclass(frozen=True)
class CacheKinds:
    """The kind of each entry of the model's cache list (`KV`, `WINDOW` or `STATE`), in
    order, and the window (positions) of each `WINDOW` entry (0 for the others); `kv`,
    `window` and `state` are the indexes of each kind."""

    kinds: tuple[str, ...]
    windows: tuple[int, ...] = ()

    @classmethod
    def of(cls, model) -> CacheKinds:
        """Classify `model`'s caches. Raises `UnsupportedCache` naming the architecture
        (``model_type``) and the first cache type that is none of the kinds."""
        kinds, windows = [], []
        for i, c in enumerate(make_prompt_cache(model)):
            if type(c) is KVCache:
                kinds.append(KV)
            elif type(c) is RotatingKVCache and c.keep == 0:
                kinds.append(WINDOW)
            elif type(c) is ArraysCache:
                kinds.append(STATE)
            else:
                arch = getattr(getattr(model, "args", None), "model_type", type(model).__module__)
                kept = f" keeping its first {c.keep} tokens" if isinstance(c, RotatingKVCache) else ""
                raise UnsupportedCache(
                    f"architecture {arch!r}: cache {i} is a {type(c).__name__}{kept}, which this server does not "
                    f"serve (it serves attention KVCache, sliding-window RotatingKVCache without kept tokens and "
                    f"recurrent-state ArraysCache layers)"
                )
            windows.append(c.max_size if kinds[-1] == WINDOW else 0)
        return cls(tuple(kinds), tuple(windows))

    @property
    def kv(self) -> list[int]:
        """Indexes of the full-attention caches (the KV pool's layers)."""
        return [i for i, k in enumerate(self.kinds) if k == KV]

    @property
    def window(self) -> list[int]:
        """Indexes of the sliding-window attention caches."""
        return [i for i, k in enumerate(self.kinds) if k == WINDOW]

    @property
    def state(self) -> list[int]:
        """Indexes of the recurrent-state caches."""
        return [i for i, k in enumerate(self.kinds) if k == STATE]

    @property
    def snapshot(self) -> list[int]:
        """Indexes of the caches a cached prefix restores from a snapshot (window and
        recurrent-state layers), ascending."""
        return [i for i, k in enumerate(self.kinds) if k != KV]


def is_full(cache) -> bool:
    """Whether a per-request or batched cache is a full-attention layer's (the KV pool's)."""
    return not is_state(cache) and not is_window(cache)


def is_state(cache) -> bool:
    """Whether a per-request or batched cache holds recurrent state (not KV)."""
    return isinstance(cache, ArraysCache)


def write_state_rows(cache: ArraysCache, rows: list[int], src: ArraysCache) -> None:
    """Overwrite rows `rows` of batched `cache` with the rows of `src`, in order (len(rows)
    == src's batch size). An array `cache` does not hold yet starts as zeros."""
    idx = mx.array(rows, dtype=mx.int32)
    for e, theirs in enumerate(src.cache):
        if theirs is None:
            continue
        mine = cache.cache[e]
        if mine is None:
            mine = mx.zeros((cache.batch_size, *theirs.shape[1:]), dtype=theirs.dtype)
        mine = mx.array(mine)  # a new array: a pending launch may hold the old one
        mine[idx] = theirs
        cache.cache[e] = mine


def merge_state(caches: list[ArraysCache], lengths: list[int] | None = None) -> ArraysCache:
    """Per-request state caches as one batched `ArraysCache` (a request with no state yet
    gets zeros, the recurrent layers' initial state). lengths: the tokens each row will
    process in the next right-padded call (pads after them leave the state alone), or None
    for calls without padding."""
    batch = ArraysCache.merge(caches)
    batch.left_padding = None
    if lengths is not None:
        batch.prepare(lengths=lengths)
    return batch


def batch_of(cache: list) -> list:
    """One request's per-layer caches as a batch of one row (`BatchKVCache`,
    `WindowBatchKVCache`, `ArraysCache`)."""
    return [
        merge_state([c]) if is_state(c) else merge_window([c], c.max_size) if is_window(c) else BatchKVCache.merge([c])
        for c in cache
    ]


def cache_arrays(cache: list) -> list[mx.array]:
    """Every array a per-request cache list holds (KV keys and values, state arrays), to
    evaluate with the launch that fills them."""
    out: list[mx.array] = []
    for c in cache:
        if is_state(c):
            out += [a for a in c.cache if a is not None]
        elif c.keys is not None:
            out += [c.keys, c.values]
    return out


def batch_width(cache: list) -> int | None:
    """The write index of a batched cache list's full-attention layers (positions each
    row's KV is right-aligned at), or None for a model without such layers."""
    return next((c._idx for c in cache if isinstance(c, BatchKVCache) and not is_window(c)), None)
