"""The kinds of per-layer caches a model makes, and the operations the worker needs on each.

mlx-lm builds a model's caches with ``model.make_cache()`` (or one `KVCache` per layer
when the model has no such method). Three kinds are served:

- attention (`KVCache`): keys and values per position, batched as a left-padded
  `BatchKVCache`, gathered from and stored to the KV pool by slot;
- sliding-window attention (`RotatingKVCache` without kept tokens: gpt-oss, Gemma 3,
  Ministral 3): a query attends to the last `window` positions only. One request's cache
  (a prefill) is mlx-lm's `RotatingKVCache`; the running batch keeps a `WindowBatchKVCache`:
  a left-padded `BatchKVCache` whose positions before the last `window` are cut off once
  `WINDOW_SLACK` of them have piled up (`trim_window`), so a request holds at most
  ``window + WINDOW_SLACK`` positions (plus mlx-lm's 256-position growth step) however long
  it runs, and the model's own window mask (``create_attention_mask(..., window_size)``)
  keeps every query inside its window. A cached prefix restores these layers from a
  snapshot of the last `window` positions (`window_arrays`), taken where recurrent state is;
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

KV, WINDOW, STATE = "kv", "window", "state"

WINDOW_SLACK = 256
"""Positions a running batch's window layers carry past their window before they are cut
back to it (`trim_window`: one copy of `window` positions per `WINDOW_SLACK` decode steps)."""


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


class WindowBatchKVCache(BatchKVCache):
    """A running batch's sliding-window layer: mlx-lm's left-padded `BatchKVCache` (each
    row's positions right-aligned at the write index ``_idx``; ``offset`` each row's RoPE
    position) whose positions before the last `window` are cut off (`trim_window`), so a
    row's left padding may be negative (its first positions are gone). The model's window
    mask reads ``_idx`` and ``left_padding`` only, both in buffer columns, so it stays exact
    after a cut."""

    def __init__(self, window: int, left_padding: list[int]) -> None:
        super().__init__(left_padding)
        self.window = window


def window_width(caches: list) -> int:
    """The most positions one request's window cache among `caches` holds (0 for none)."""
    return max((min(c.offset, c.keys.shape[2]) for c in caches if is_window(c) and c.keys is not None), default=0)


def trim_window(c: WindowBatchKVCache, slack: int = WINDOW_SLACK) -> None:
    """Cut `c` back to its last ``c.window`` columns once it holds more than ``window +
    slack`` (a copy of those columns, so the old buffer is freed; no-op otherwise). Every
    row keeps the positions its next query attends to: the window mask of a query at the
    write index reaches ``window - 1`` columns back."""
    cut = c._idx - c.window
    if c.keys is None or cut <= slack:
        return
    c.keys = mx.contiguous(c.keys[..., cut : c._idx, :])
    c.values = mx.contiguous(c.values[..., cut : c._idx, :])
    c.left_padding = c.left_padding - cut
    c._idx = c.window


def is_window(cache) -> bool:
    """Whether a per-request or batched cache is a sliding-window layer's."""
    return isinstance(cache, (RotatingKVCache, WindowBatchKVCache))


def is_full(cache) -> bool:
    """Whether a per-request or batched cache is a full-attention layer's (the KV pool's)."""
    return not is_state(cache) and not is_window(cache)


def window_positions(c: RotatingKVCache) -> tuple[mx.array, mx.array]:
    """One request's window cache as (keys, values) [1, kv_heads, n, head_dim] in position
    order: its last n positions, n = ``min(offset, columns held)`` (lazy)."""
    if c.keys is None:
        raise ValueError("an empty window cache has no positions")
    n = min(c.offset, c.keys.shape[2])
    return c._temporal_order(c.keys)[..., -n:, :], c._temporal_order(c.values)[..., -n:, :]


def window_arrays(c, window: int) -> list[mx.array]:
    """[keys, values] of the last `window` positions of every row of a window cache (one
    request's `RotatingKVCache` or a batched `WindowBatchKVCache`), each [rows, kv_heads,
    window, head_dim], right-aligned (lazy): the snapshot a cached prefix restores from.
    Columns before a row's first position hold whatever the buffer held (zeros, another
    row's old positions); `restore_window` reads only the row's own."""
    if isinstance(c, RotatingKVCache):
        keys, values = window_positions(c)
    else:
        keys, values = c.keys[..., : c._idx, :], c.values[..., : c._idx, :]
    n = keys.shape[2]
    if n >= window:
        return [keys[..., n - window :, :], values[..., n - window :, :]]
    pad = [(0, 0), (0, 0), (window - n, 0), (0, 0)]
    return [mx.pad(keys, pad), mx.pad(values, pad)]


def restore_window(c: RotatingKVCache, keys: mx.array, values: mx.array, length: int) -> None:
    """Set a fresh request's window cache to a snapshot after `length` positions: keys /
    values [kv_heads, window, head_dim] as `window_arrays` left them; only the last
    ``min(length, window)`` columns are the request's and are taken."""
    n = min(length, keys.shape[1])
    c.keys, c.values = keys[None, :, keys.shape[1] - n :, :], values[None, :, values.shape[1] - n :, :]
    c.offset, c._idx = length, n


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


def merge_window(caches: list[RotatingKVCache], window: int, width: int | None = None) -> WindowBatchKVCache:
    """Per-request window caches as one batched window layer of `width` columns (default and
    at least: the most positions a row holds): each row's positions (`window_positions`)
    right-aligned, RoPE offsets their own; a row with none is all padding."""
    held = [window_positions(c) if c.keys is not None else None for c in caches]
    width = max([kv[0].shape[2] for kv in held if kv is not None] + [width or 0])
    out = WindowBatchKVCache(window, [width - (kv[0].shape[2] if kv else 0) for kv in held])
    if width:
        first = next(kv for kv in held if kv is not None)
        shape = (len(caches), first[0].shape[1], width, first[0].shape[3])
        out.keys, out.values = mx.zeros(shape, first[0].dtype), mx.zeros(shape, first[1].dtype)
        for i, kv in enumerate(held):
            if kv is not None:
                out.keys[i : i + 1, :, width - kv[0].shape[2] :] = kv[0]
                out.values[i : i + 1, :, width - kv[1].shape[2] :] = kv[1]
        out._idx = width
    out.offset = mx.array([c.offset for c in caches])
    return out


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
