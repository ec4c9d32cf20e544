"""Batched prefill: the final chunks of several new requests in one model call (issue 13).

Each row brings its own per-request caches (empty, a cached prefix gathered from the pool,
or its earlier chunks) and the tokens still to prefill. The caches are merged into one
left-padded `BatchKVCache` (each row's KV right-aligned), and the new tokens go in
right-padded (``[tokens..., pad...]``): the causal mask with the merged left padding keeps
every real query off every pad (pads only come after it), and RoPE takes each row's own
offset, its cached length. After the call the right padding is rolled round to the left
(`BatchKVCache.finalize`), which leaves the left-padded layout the decode batch uses. The
same scheme as mlx-lm's `BatchGenerator` prompt processing.

Sliding-window layers are merged the same way (`window_cache.merge_window`: each row's
last positions, RoPE at its own offset) and cut back to their window after the call; the
model's window mask keeps each query inside it. Recurrent-state layers (`layer_caches`) are
merged row by row and told each row's real
length (``ArraysCache.prepare(lengths=...)``): mlx-lm's SSM and short-conv layers then mask
the pads and keep each row's state at its last real token, so the same right-padded call
serves hybrid models.

Rows are grouped by length first (`plan_groups`) so that padding stays a bounded share of
the tokens a group computes.

Not every architecture honours that length: mlx-lm 0.32's Nemotron-H mixer does not pass it
to its SSM scan, whose state then decays through the pads to zero for every row shorter
than the call. `pads_exactly` finds out at load time by prefilling two unequal rows
together and apart; a model that fails it is prefilled without padding (rows of equal
length together, no width buckets).

On a GPU every new shape of a prefill call costs far more than the call itself: MLX's
CUDA backend prepares its kernels per shape (about 100 ms per new (rows, width) pair on an
H200, against 12 ms for a 16 x 43 prefill of SmolLM2's shape once prepared). There the
rows, the new tokens' width and the cached width are padded up to `shape_bucket` sizes,
so a server meets a few dozen shapes (which the warm-up prepares) instead of one per launch.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

from worker_proc.memory.kv_pool import KVPool
from worker_proc.memory.layer_caches import is_full, is_state, merge_state
from worker_proc.memory.window_cache import is_window, merge_window, trim_window, window_width
from worker_proc.model.forward import has_plain_head, head, inner_model, prefill_step
from worker_proc.shapes import shape_bucket

PAD_WASTE = 0.25
"""Padding a group may add, as a share of its real tokens (plus `PAD_SLACK`)."""
PAD_SLACK = 64
"""Padding tokens a group may add whatever its size (short prompts batch freely)."""
MIN_ROW_STEP = 64
"""Fewest tokens per row in one model call of a batched prefill."""


WIDTH_FLOOR = 16
"""Smallest padded width (tokens) of a bucketed prefill."""


def buckets_on() -> bool:
    """Whether prefill shapes are bucketed by default: on a GPU, not on MLX's CPU backend
    (which prepares nothing per shape, so padding would only cost compute)."""
    return mx.default_device() != mx.cpu


PROBE_ROWS = ([5, 6, 7], [8, 9, 10, 11, 12, 13])
"""Token ids of the two unequal rows `pads_exactly` prefills."""
PROBE_TOLERANCE = 1e-3
"""Largest difference `pads_exactly` allows, relative to the largest magnitude compared
(batched float arithmetic differs from one row's by ~1e-5 of it; a state decayed to zero
differs by all of it)."""


def pads_exactly(model: nn.Module, state_layers: list[int]) -> bool:
    """Whether a right-padded batched prefill leaves each row's recurrent state (the caches
    at `state_layers`) and last-token logits as prefilling that row alone does; True for
    a model without recurrent layers (attention masks the pads). Runs three small prefills
    (`PROBE_ROWS`) and blocks on them."""
    if not state_layers:
        return True
    logits, batch = prefill_rows(model, list(PROBE_ROWS), [make_prompt_cache(model) for _ in PROBE_ROWS], buckets=False)
    for j, row in enumerate(PROBE_ROWS):
        alone_logits, alone = prefill_rows(model, [row], [make_prompt_cache(model)], buckets=False)
        pairs = [(logits[j], alone_logits[0])] + [
            (a[j], b[0]) for layer in state_layers for a, b in zip(batch[layer].cache, alone[layer].cache)
        ]
        for x, y in pairs:
            scale = max(mx.abs(y).max().item(), 1e-6)
            if mx.abs(x.astype(mx.float32) - y.astype(mx.float32)).max().item() > PROBE_TOLERANCE * scale:
                return False
    return True


def plan_groups(
    lengths: list[int], waste: float = PAD_WASTE, slack: int = PAD_SLACK, ragged: bool = True
) -> list[list[int]]:
    """Indices into `lengths` (tokens to prefill per row), grouped for batched calls.

    Rows are taken shortest first; a row joins the current group while the group's padded
    size (rows x its longest row) stays within ``(1 + waste) x real tokens + slack``, else
    it starts a new group; without `ragged` (a model that fails `pads_exactly`), only while
    its length equals the group's. Every index appears in exactly one group; a group lists
    its indices in ascending order (so one group keeps the rows in their given order).
    """
    groups: list[list[int]] = []
    current: list[int] = []
    real = 0
    for i in sorted(range(len(lengths)), key=lengths.__getitem__):
        n = lengths[i]
        if current and (
            (len(current) + 1) * n > (1 + waste) * (real + n) + slack or not ragged and n != lengths[current[0]]
        ):
            groups.append(sorted(current))
            current, real = [], 0
        current.append(i)
        real += n
    if current:
        groups.append(sorted(current))
    return groups


def merge_caches(
    caches: list, width: int, base: tuple[mx.array, mx.array] | None = None, pooled: list[int] | None = None
) -> BatchKVCache:
    """One layer's per-row caches as a `BatchKVCache` of `width` positions (at least the
    longest row), each row's KV right-aligned (keys/values [rows, kv_heads, width, head_dim]).
    Rows with no KV are all padding. base: (keys, values) of that layout already holding the
    rows whose KV comes from the pool (`KVPool.gather_rows`), `pooled[i]` positions of row i
    (0 for the others, whose own caches are copied in; a pooled row's own cache is empty)."""
    pooled = pooled or [0] * len(caches)
    lengths = [p or (c.offset if c.keys is not None else 0) for c, p in zip(caches, pooled)]
    batch = BatchKVCache([width - n for n in lengths])
    own = [i for i, (c, p) in enumerate(zip(caches, pooled)) if not p and c.keys is not None and lengths[i]]
    if width == 0 or (base is None and not own):
        return batch
    if base is not None:
        keys, values = base
    else:
        first = caches[own[0]]
        _, heads, _, k_dim = first.keys.shape
        keys = mx.zeros((len(caches), heads, width, k_dim), dtype=first.keys.dtype)
        values = mx.zeros((len(caches), heads, width, first.values.shape[3]), dtype=first.values.dtype)
    for i in own:
        c, n = caches[i], lengths[i]
        keys[i : i + 1, :, width - n :] = c.keys[..., :n, :]
        values[i : i + 1, :, width - n :] = c.values[..., :n, :]
    batch.keys, batch.values, batch._idx = keys, values, width
    batch.offset = batch.offset + width
    return batch


def prefill_rows(
    model: nn.Module,
    tokens: list[list[int]],
    caches: list[list],
    buckets: bool | None = None,
    ragged: bool = True,
    pool: KVPool | None = None,
    prefix: list[list[int]] | None = None,
) -> tuple[mx.array, list]:
    """Prefill B rows together (lazy).

    tokens[i]: row i's tokens after what caches[i] holds (at least one); caches[i]: row i's
    per-layer mlx-lm caches (`KVCache`, `ArraysCache`; possibly empty). prefix[i]: the pool
    slots (of `pool`) holding row i's cached prefix when its KV caches are still empty (its
    recurrent state, if any, already in caches[i]); every such row's KV is gathered in one
    indexing per layer (`KVPool.gather_rows`). Returns (logits [B, V] of each row's last token; per layer a
    `BatchKVCache` holding the rows in order, left-padded, a `WindowBatchKVCache` likewise cut
    back to its window, or a batched `ArraysCache`). The
    per-row caches are read, not changed. Each model call takes at most
    ``max(MIN_ROW_STEP, prefill_step() // rows)`` positions of every row. With `buckets`
    (default `buckets_on()`), the call runs on `shape_bucket` rows (padding rows of one
    token, dropped after), new-token width (only when `ragged`: see `pads_exactly`) and
    cached width.

    Raises `ValueError` for an empty row, mismatched lengths, rows of unequal length
    without `ragged`, or a prefix without a pool.
    """
    if len(tokens) != len(caches) or not tokens or any(not t for t in tokens):
        raise ValueError("prefill_rows needs one non-empty token list per cache")
    prefix = prefix if prefix and any(prefix) else None
    if prefix is not None and (pool is None or len(prefix) != len(tokens)):
        raise ValueError("prefill_rows needs a pool and one slot list per row for a pooled prefix")
    if not ragged and len({len(t) for t in tokens}) > 1:
        raise ValueError("this model's rows must be prefilled without padding: give rows of one length")
    real = len(tokens)
    width = max(len(t) for t in tokens)
    pooled = [len(p) for p in prefix] if prefix else [0] * real
    held = max([c.offset for row in caches for c in row if is_full(c) and c.keys is not None] + pooled, default=0)
    windowed = max((window_width(row) for row in caches), default=0)
    if buckets_on() if buckets is None else buckets:
        extra = shape_bucket(real, 1) - real
        tokens = tokens + [[0]] * extra
        caches = caches + [make_prompt_cache(model) for _ in range(extra)]
        pooled = pooled + [0] * extra
        width = shape_bucket(width, WIDTH_FLOOR) if ragged else width
        held = shape_bucket(held, WIDTH_FLOOR) if held else 0
        windowed = shape_bucket(windowed, WIDTH_FLOOR) if windowed else 0
    lens = [len(t) for t in tokens]
    bases = iter(pool.gather_rows(prefix + [[]] * (len(tokens) - real), held) if prefix else [])
    batch = []
    for layer in range(len(caches[0])):
        rows = [c[layer] for c in caches]
        if is_state(rows[0]):
            batch.append(merge_state(rows, lens))
        elif is_window(rows[0]):
            batch.append(merge_window(rows, rows[0].max_size, windowed))
            batch[-1].prepare(right_padding=[width - n for n in lens])
        else:
            batch.append(merge_caches(rows, held, next(bases, None), pooled))
            batch[-1].prepare(right_padding=[width - n for n in lens])
    padded = mx.array([t + [0] * (width - len(t)) for t in tokens], dtype=mx.int32)
    last = mx.array([n - 1 for n in lens], dtype=mx.int32)
    plain = has_plain_head(model)
    step = max(MIN_ROW_STEP, prefill_step() // len(tokens))
    picked = None
    for start in range(0, width, step):
        chunk = padded[:, start : start + step]
        out = inner_model(model)(chunk, cache=batch) if plain else model(chunk, cache=batch)
        at = mx.clip(last - start, 0, chunk.shape[1] - 1)
        here = mx.take_along_axis(out, at[:, None, None], axis=1)[:, 0]
        if picked is None:
            picked = here
        else:
            inside = (last >= start) & (last < start + chunk.shape[1])
            picked = mx.where(inside[:, None], here, picked)
    for c in batch:
        c.finalize()
        if is_window(c):
            trim_window(c, 0)
        if len(tokens) > real:
            c.filter(mx.arange(real))
    picked = picked[:real] if len(tokens) > real else picked
    return (head(model, picked) if plain else picked), batch
