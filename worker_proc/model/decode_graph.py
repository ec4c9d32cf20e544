"""Compiled decode steps: the MLX analogue of CUDA-graph capture (issue 13).

An uncompiled decode step rebuilds the model's graph in Python every step and hands MLX
every primitive one by one. `DecodeGraph` traces the decode forward once per (batch size,
KV capacity) with `mx.compile` and replays the trace, fused, for every later step of
those shapes. A trace is only valid for the metadata layout it was captured with:

- the running batch's left-padded `BatchKVCache` (one row per request, each row's KV
  right-aligned at the write index), one new token per row, RoPE at each row's offset;
- the KV buffers at a fixed capacity (the smallest multiple of the capacity step,
  `default_capacity_step`, with room for the next position), written at an index given as
  an array, with a mask over the whole capacity (left padding and the positions past the
  write index masked), so the same trace serves every position up to it.

Sliding-window layers (`layer_caches.WindowBatchKVCache`) are captured the same way with
their own write index and left padding (they are cut back to their window while the full
layers grow) and the window in their mask; every layer shares the rows' RoPE offsets.

So the capture handles exactly `CAPTURED_MODES`: DECODE, and IDLE (nothing to run: an
empty graph). Any other mode (EXTEND and MIXED carry several tokens per row and no
running-batch layout) raises `ValueError` naming the mode when asked for, instead of
replaying a graph captured for another layout; the runner runs those modes uncompiled.
Architectures outside `CAPTURED_FAMILIES` are not captured either (`supports`).
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import BatchKVCache

from protocol.enums import ForwardMode, describe_modes, mode_name
from worker_proc.memory.layer_caches import KV, STATE, WINDOW, CacheKinds

CAPTURED_MODES: frozenset[ForwardMode] = frozenset({ForwardMode.DECODE, ForwardMode.IDLE})
GPU_CAPACITY_STEP = 64
"""KV capacity granularity (positions) of a captured step on a GPU: one trace per batch size
serves this many positions, and attention reads up to this many masked positions more, which
is not free there (Llama-3.2-1B shape, batch 64, H200: 6.3 ms a step at capacity 256, 9.1 at
512, 15.7 at 1024). Over 600 tokens a grid of 64 measured 9.2-10.0 ms a step against 11.7 for
256 (Llama-1B, batch 64) and 11.1-13.1 against 15.9-16.3 (SmolLM2, batch 16), and a new
capacity's trace cost under 30-46 ms (`docs/PERFORMANCE.md`, "Where decode at 16/64 loses")."""
CPU_CAPACITY_STEP = 256
"""The same on MLX's CPU backend, where a new trace also compiles its fused kernels with the
system compiler: fewer, larger capacities (a grid of 1024 measured slower than 256 on H200s;
`python bench/decode_graph.py --capacity-step N`)."""


def default_capacity_step() -> int:
    """`GPU_CAPACITY_STEP` on a GPU, `CPU_CAPACITY_STEP` on the CPU (positions)."""
    return CPU_CAPACITY_STEP if mx.default_device() == mx.cpu else GPU_CAPACITY_STEP


CPU_GRAPH_MAX_BS = 4
"""Largest decode batch captured by default on MLX's CPU backend. There the captured step
was 1.04-1.16x the uncompiled one at batch 1, 1.06x at 4 and 0.88-0.91x at 16 (SmolLM2-135M,
`python bench/decode_graph.py --batch 1,4,16`), so larger batches run uncompiled."""


def default_graph_max_bs(max_running_requests: int) -> int:
    """`--decode-graph-max-bs` when not given: every batch on a GPU, `CPU_GRAPH_MAX_BS` on
    the CPU (batch sizes)."""
    return min(CPU_GRAPH_MAX_BS, max_running_requests) if mx.default_device() == mx.cpu else max_running_requests


CAPTURED_FAMILIES = frozenset(
    {
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "mixtral",
        "glm4_moe",
        "deepseek_v3",
        "gpt_oss",
        "gemma3_text",
        "gemma4_text",
        "ministral3",
        "qwen3_next",
        "qwen3_5",
        "qwen3_5_moe",
        "kimi_linear",
        "lfm2",
        "nemotron_h",
        "granitemoehybrid",
        "mamba2",
    }
)
"""Families whose attention reads the cache through `update_and_fetch`, `make_mask` and
`offset` only, by mlx-lm's code: what a captured step replaces (`_StepCache`). Each is
tested captured == uncompiled (the MoE and sliding-window ones on tiny configs,
tests/unit/test_decode_graph.py and tests/models/test_window_models.py)."""


def supports(model: nn.Module) -> bool:
    """Whether `model`'s decode step can be captured: a `CAPTURED_FAMILIES` model (the step
    is the model's whole call, head and logit soft-capping included)."""
    return getattr(getattr(model, "args", None), "model_type", None) in CAPTURED_FAMILIES


def check_mode(mode: int) -> None:
    """Raise `ValueError` naming `mode` unless it is one of `CAPTURED_MODES`."""
    if mode not in CAPTURED_MODES:
        raise ValueError(
            f"cannot capture forward mode {mode_name(mode)}: a decode graph captures only "
            f"{describe_modes(CAPTURED_MODES)}; run it uncompiled"
        )


class _StepCache:
    """What mlx-lm's attention reads from a cache, over fixed-capacity buffers.

    keys/values: [B, kv_heads, capacity, head_dim]; offset: int [B] (each row's RoPE
    position); left_padding: int [B]; index: int32 [1], the write position; at: bool
    [capacity, 1], true at `index` only (one array every layer of its kind shares), or None
    to write with `mx.slice_update` (see `update_and_fetch`).
    """

    def __init__(
        self,
        keys: mx.array,
        values: mx.array,
        offset: mx.array,
        left_padding: mx.array,
        index: mx.array,
        at: mx.array | None,
    ) -> None:
        self.keys, self.values = keys, values
        self.offset, self.left_padding, self.index, self.at = offset, left_padding, index, at

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Write one position per row at `index`; return the whole buffers.

        On a GPU a select over the buffer (`mx.where` with `at`), not `mx.slice_update` at the
        array index: inside a compiled function MLX's CUDA backend runs that as a copy of the
        whole buffer through a dynamic-offset kernel, 3.4x the select's device time
        (Llama-3.2-1B shape, 64 rows, capacity 256, H200: 1.6 ms against 0.44 ms a step for the
        32 buffers; `python bench/step_kernels.py`), and an indexed assignment (a scatter) adds
        about 130 small index kernels a step, which a launch-bound step pays for on the host.
        On the CPU the select measured up to 10% slower at 4 rows (`python bench/decode_graph.py
        --batch 1,4`), so `at` is None there and the slice update stays."""
        if self.at is None:
            self.keys = mx.slice_update(self.keys, keys, self.index, axes=(2,))
            self.values = mx.slice_update(self.values, values, self.index, axes=(2,))
        else:
            self.keys = mx.where(self.at, keys, self.keys)
            self.values = mx.where(self.at, values, self.values)
        return self.keys, self.values

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> mx.array:
        """bool [B, 1, 1, capacity]: a row sees its positions from its left padding up to
        `index`, and with `window_size` only the last `window_size` of them (mlx-lm's
        `create_causal_mask` for one query). Raises `ValueError` for several query
        positions (not captured)."""
        if n != 1:
            raise ValueError("a decode graph captures one position per row")
        pos = mx.arange(self.keys.shape[2])[None]
        seen = (pos >= self.left_padding[:, None]) & (pos <= self.index)
        if window_size is not None:
            seen = seen & (pos > self.index - window_size)
        return seen[:, None, None, :]


class _StepState:
    """What mlx-lm's recurrent layers read from an `ArraysCache` in a decode step: its
    arrays by index (`cache`), and no left padding or lengths (a running batch's recurrent
    caches have neither: one new token per row, no pads)."""

    def __init__(self, arrays: list[mx.array]) -> None:
        self.cache = arrays
        self.left_padding = self.lengths = None

    def __getitem__(self, i: int) -> mx.array:
        return self.cache[i]

    def __setitem__(self, i: int, value: mx.array) -> None:
        self.cache[i] = value

    def advance(self, n: int) -> None:
        """Nothing to advance without padding or lengths."""

    def make_mask(self, n: int) -> None:
        """No mask: no row of a decode step is padding."""
        return None


class DecodeGraph:
    """Captured decode steps of one model; traces are cached by MLX per input shapes.

    `max_batch`: batches larger than this run uncompiled (bounds the traces kept);
    `step`: KV capacity granularity in positions (default `default_capacity_step()`).
    """

    def __init__(self, model: nn.Module, max_batch: int, step: int | None = None) -> None:
        if not supports(model):
            raise ValueError(f"model type {getattr(model.args, 'model_type', '?')} cannot be captured")
        self.model = model
        self.max_batch = max_batch
        self.capacity_step = step or default_capacity_step()
        self.select_write = mx.default_device() != mx.cpu
        """Whether the KV is written by a select (`_StepCache.update_and_fetch`)."""
        self.kinds = CacheKinds.of(model).kinds
        """Per cache entry: `KV`, `WINDOW` (its own index and padding) or `STATE`."""
        self.arity: list[int] = []
        """Per cache entry: the arrays the step takes and returns for it (2 for attention,
        a recurrent layer's state arrays), set by the first `run`."""
        self.replays = 0
        """Captured steps run (a test and the step profile read it)."""
        self._step = mx.compile(self._forward)

    def _forward(
        self, tokens: mx.array, offset: mx.array, layout: mx.array, index: mx.array, *arrays: mx.array
    ) -> tuple[mx.array, ...]:
        """layout: int [2, B] the left padding of the full layers, then of the window
        layers; index: int32 [2] their write positions (a kind the model lacks: unused);
        arrays: each cache entry's, in order (`arity`)."""
        starts = [sum(self.arity[:i]) for i in range(len(self.kinds))]
        kinds = {}
        for g, kind in enumerate((KV, WINDOW)):
            first = next((arrays[s] for s, k in zip(starts, self.kinds) if k == kind), None)
            at = (mx.arange(first.shape[2]) == index[g])[:, None] if self.select_write and first is not None else None
            kinds[kind] = (layout[g], index[g : g + 1], at)
        caches = [
            _StepState(list(arrays[s : s + n]))
            if kind == STATE
            else _StepCache(arrays[s], arrays[s + 1], offset, *kinds[kind])
            for s, n, kind in zip(starts, self.arity, self.kinds)
        ]
        logits = self.model(tokens[:, None], cache=caches)[:, -1, :]
        return (logits, *[a for c in caches for a in (c.cache if isinstance(c, _StepState) else (c.keys, c.values))])

    def covers(self, batch_size: int) -> bool:
        """Whether a decode of `batch_size` rows runs captured."""
        return 0 < batch_size <= self.max_batch

    def run(self, mode: int, tokens: mx.array | None, cache: list) -> mx.array | None:
        """One captured step. tokens: int32 [B] (may be lazy); cache: the running batch's
        per-layer caches (`BatchKVCache`, `WindowBatchKVCache`, `ArraysCache`), advanced by
        one position in place (attention buffers resized first to the smallest multiple of
        `capacity_step` with room at the write index). Returns logits [B, V] (lazy), or None
        for IDLE.
        Every layer's cache gets the same new offset array, which the next step reads: one
        ``offset + 1`` per layer would leave the layers above the first a lazy chain that no
        step evaluates, one node longer every step for as long as the batch runs. Likewise
        every layer's cache shares the first left padding of its kind (full or window), which
        this step reads: a request joining into a free row writes each layer's
        (`RunningBatch`), and the copies above the first layer would grow one lazy node per
        join.

        Raises `ValueError` for a mode outside `CAPTURED_MODES`, or a recurrent cache
        missing a state array.
        """
        check_mode(mode)
        if mode == ForwardMode.IDLE:
            return None
        first = {k: next((c for c, kind in zip(cache, self.kinds) if kind == k), None) for k in (KV, WINDOW)}
        attention = first[KV] or first[WINDOW]
        arrays = []
        for c, kind in zip(cache, self.kinds):
            if kind == STATE:
                if any(a is None for a in c.cache):
                    raise ValueError("a decode graph needs every recurrent state array; this batch lacks one")
                arrays += c.cache
            else:
                _fit(c, first[kind]._idx, self.capacity_step)
                arrays += [c.keys, c.values]
        self.arity = [len(c.cache) if kind == STATE else 2 for c, kind in zip(cache, self.kinds)]
        rows = tokens.shape[0]
        groups = [first[KV] or attention, first[WINDOW] or attention]
        out = self._step(
            tokens,
            attention.offset if attention else mx.zeros((rows,), dtype=mx.int32),
            mx.stack([g.left_padding for g in groups]) if attention else mx.zeros((2, rows), dtype=mx.int32),
            mx.array([g._idx for g in groups] if attention else [0, 0], dtype=mx.int32),
            *arrays,
        )
        offset = attention.offset + 1 if attention else None  # every layer's: one array the next step reads
        padding = {KV: groups[0], WINDOW: groups[1]}  # each kind's: the one array this step read
        at = 1
        for c, kind, n in zip(cache, self.kinds, self.arity):
            if kind == STATE:
                c.cache = list(out[at : at + n])
            else:
                c.keys, c.values = out[at], out[at + 1]
                c.offset, c.left_padding = offset, padding[kind].left_padding
                c._idx += 1
            at += n
        self.replays += 1
        return out[0]


def _fit(c: BatchKVCache, index: int, step: int) -> None:
    """Give `c` a buffer of the smallest multiple of `step` positions with room at `index`
    (a copy when it has another size). The step's attention reads the whole buffer: a
    prefill's cache comes with mlx-lm's 256 positions, which kept a step from a 43-token
    prompt reading 256 positions (4.3x the time of the attention's products at 64 rows of
    Llama-3.2-1B on an H200, `python bench/step_kernels.py`) until its position crossed 256."""
    size = (index // step + 1) * step
    if c.keys.shape[2] == size:
        return
    pad = [(0, 0), (0, 0), (0, size - index), (0, 0)]
    c.keys = mx.pad(c.keys[..., :index, :], pad)
    c.values = mx.pad(c.values[..., :index, :], pad)
