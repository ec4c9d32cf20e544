"""The kinds of per-layer caches a model makes, and the operations the worker needs on each.

mlx-lm builds a model's caches with ``model.make_cache()`` (or one `KVCache` per layer
when the model has no such method). Two kinds are served:

- attention (`KVCache`): keys and values per position, batched as a left-padded
  `BatchKVCache`, gathered from and stored to the KV pool by slot;
- recurrent state (`ArraysCache`: Mamba / Mamba-2 SSM and conv state, LFM2 short-conv
  state, gated DeltaNet): a fixed-size state per request, batched row by row
  (`ArraysCache.merge`), that cannot be cut back to a prefix the way KV can.

Hybrid models (LFM2, Nemotron-H, Granite 4 hybrids, Qwen3-Next) mix the two; pure
recurrent models (Mamba-2) have no attention layer at all. Any other cache type (sliding
windows, chunked or quantized KV, nested cache lists) is refused at start-up by
`CacheKinds.of`, naming the architecture and the type.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, BatchKVCache, KVCache, make_prompt_cache

KV, STATE = "kv", "state"


class UnsupportedCache(ValueError):
    """The model makes a cache type the worker does not serve (see the module docstring)."""


@dataclass(frozen=True)
class CacheKinds:
    """The kind of each entry of the model's cache list (`KV` or `STATE`), in order; `kv`
    and `state` are the indexes of each kind."""

    kinds: tuple[str, ...]

    @classmethod
    def of(cls, model) -> CacheKinds:
        """Classify `model`'s caches. Raises `UnsupportedCache` naming the architecture
        (``model_type``) and the first cache type that is neither kind."""
        kinds = []
        for i, c in enumerate(make_prompt_cache(model)):
            if type(c) is KVCache:
                kinds.append(KV)
            elif type(c) is ArraysCache:
                kinds.append(STATE)
            else:
                arch = getattr(getattr(model, "args", None), "model_type", type(model).__module__)
                raise UnsupportedCache(
                    f"architecture {arch!r}: cache {i} is a {type(c).__name__}, which this server does not serve "
                    f"(it serves attention KVCache and recurrent-state ArraysCache layers)"
                )
        return cls(tuple(kinds))

    @property
    def kv(self) -> list[int]:
        """Indexes of the attention caches."""
        return [i for i, k in enumerate(self.kinds) if k == KV]

    @property
    def state(self) -> list[int]:
        """Indexes of the recurrent-state caches."""
        return [i for i, k in enumerate(self.kinds) if k == STATE]


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
    """One request's per-layer caches as a batch of one row (`BatchKVCache` / `ArraysCache`)."""
    return [merge_state([c]) if is_state(c) else BatchKVCache.merge([c]) for c in cache]


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
    """The write index of a batched cache list's attention layers (positions each row's KV
    is right-aligned at), or None for a model without attention layers."""
    return next((c._idx for c in cache if isinstance(c, BatchKVCache)), None)
