"""Sliding-window attention layers in the worker (gpt-oss, Gemma 3 and 4, Ministral 3): a
query attends to the last `window` positions only.

One request's cache (a prefill) is mlx-lm's `RotatingKVCache`, which holds the last
``window - 1`` positions plus the chunk being computed. The running batch keeps a
`WindowBatchKVCache`: a left-padded `BatchKVCache` whose positions before the last `window`
are cut off once `WINDOW_SLACK` more have piled up (`trim_window`), so a request holds at most
``window + WINDOW_SLACK`` positions (plus mlx-lm's 256-position growth step) however long it
runs; the model's own window mask (``create_attention_mask(..., window_size)``) keeps every
query inside its window. No ring buffer is batched. A cached prefix restores these layers
from a snapshot of the last `window` positions (`window_arrays`, `restore_window`), taken
where recurrent state is (`state_pool`).
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, RotatingKVCache

WINDOW_SLACK = 256
"""Positions a running batch's window layers carry past their window before they are cut
back to it (`trim_window`: one copy of `window` positions per `WINDOW_SLACK` decode steps)."""


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
