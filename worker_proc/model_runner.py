"""The worker's batch state and its lazy launches (DESIGN.md §1, §4, §5).

`ModelRunner` keeps one running decode batch: per-layer `BatchKVCache`s (left-padded, one
row per request), the last sampled tokens as a lazy int32 [B] array, and each row's
sampling state. A launch builds the forward pass lazily, starts it with `mx.async_eval`
and stores a `Pending`; only `finalize` blocks, and only on that launch's tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

from protocol.enums import WORKER_FORWARD_MODES, ForwardMode, describe_modes
from protocol.messages import ForwardBatch
from worker_proc.forward import decode_logits, prefill_last_logits
from worker_proc.model_loader import LoadedModel
from worker_proc.sampler import RowSampling, sample

CLEAR_CACHE_EVERY = 256
"""Finalized launches between `mx.clear_cache()` calls."""


@dataclass
class Pending:
    """A launched, not yet finalized forward pass: its mode, rows and lazy tokens [B]."""

    mode: ForwardMode
    rids: list[str]
    tokens: mx.array | None
    error: str = ""


@dataclass
class RunningBatch:
    """The requests that decode together, in row order."""

    rids: list[str] = field(default_factory=list)
    cache: list[BatchKVCache] | None = None
    last_tokens: mx.array | None = None
    rows: list[RowSampling] = field(default_factory=list)

    def append(self, rids: list[str], cache: list[BatchKVCache], tokens: mx.array, rows: list[RowSampling]) -> None:
        """Add prefilled requests as new rows at the end."""
        if not self.rids:
            self.rids, self.cache, self.last_tokens, self.rows = list(rids), cache, tokens, list(rows)
            return
        for mine, theirs in zip(self.cache, cache):
            mine.extend(theirs)
        self.rids += rids
        self.last_tokens = mx.concatenate([self.last_tokens, tokens])
        self.rows += rows

    def drop(self, rids: set[str]) -> None:
        """Remove the rows of `rids` (unknown rids are ignored)."""
        keep = [i for i, r in enumerate(self.rids) if r not in rids]
        if len(keep) == len(self.rids):
            return
        if not keep:
            self.rids, self.cache, self.last_tokens, self.rows = [], None, None, []
            return
        idx = mx.array(keep, dtype=mx.int32)
        for c in self.cache:
            c.filter(idx)
        self.last_tokens = self.last_tokens[idx]
        self.rids = [self.rids[i] for i in keep]
        self.rows = [self.rows[i] for i in keep]


class ModelRunner:
    """Runs EXTEND and DECODE launches on one loaded model, one thread, one stream."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.batch = RunningBatch()
        self.pending: dict[int, Pending] = {}
        self._finalized = 0

    # ------------------------------------------------------------------ launches
    def launch(self, launch_id: int, mode: ForwardMode, batch: ForwardBatch) -> None:
        """Build and start launch `launch_id`; never blocks on the device.

        Raises `ValueError` for a mode outside `WORKER_FORWARD_MODES` or a DECODE whose rids
        are not exactly the running batch; the error is also kept for `finalize`.
        """
        try:
            if mode not in WORKER_FORWARD_MODES:
                raise ValueError(
                    f"worker cannot launch forward mode {ForwardMode(mode).name}; supported: {describe_modes(WORKER_FORWARD_MODES)}"
                )
            if mode == ForwardMode.EXTEND:
                tokens = self._extend(batch)
            else:
                tokens = self._decode(batch)
        except Exception as e:
            self.pending[launch_id] = Pending(ForwardMode(mode), list(batch.rids), None, f"{type(e).__name__}: {e}")
            raise
        mx.async_eval(tokens)
        self.pending[launch_id] = Pending(ForwardMode(mode), list(batch.rids), tokens)

    def _extend(self, batch: ForwardBatch) -> mx.array:
        if not batch.rids or len(batch.input_ids) != len(batch.rids) or len(batch.sampling) != len(batch.rids):
            raise ValueError("EXTEND batch needs one prompt and one SamplingParams per rid")
        known = set(self.batch.rids)
        caches, logits = [], []
        for rid, ids in zip(batch.rids, batch.input_ids):
            if rid in known:
                raise ValueError(f"request {rid!r} is already running in the worker")
            if not ids:
                raise ValueError(f"request {rid!r} has an empty prompt")
            cache = make_prompt_cache(self.model)
            logits.append(prefill_last_logits(self.model, ids, cache))
            caches.append(cache)
        rows = [RowSampling.start(p) for p in batch.sampling]
        tokens = sample(mx.concatenate(logits, axis=0), rows)
        merged = [BatchKVCache.merge([c[layer] for c in caches]) for layer in range(len(caches[0]))]
        self.batch.append(list(batch.rids), merged, tokens, rows)
        return tokens

    def _decode(self, batch: ForwardBatch) -> mx.array:
        if list(batch.rids) != self.batch.rids:
            raise ValueError(
                f"DECODE rids {batch.rids[:4]}... do not match the worker's running batch {self.batch.rids[:4]}..."
            )
        logits = decode_logits(self.model, self.batch.last_tokens, self.batch.cache)
        tokens = sample(logits, self.batch.rows)
        self.batch.last_tokens = tokens
        return tokens

    # ------------------------------------------------------------------ finalize / abort
    def finalize(self, launch_id: int) -> tuple[list[str], list[int]]:
        """Block on launch `launch_id`'s tokens; return (rids, token ids).

        Raises `KeyError` for an unknown launch id, `ValueError` for a pending whose mode
        this worker cannot finalize, `RuntimeError` carrying the launch's own error.
        """
        p = self.pending.pop(launch_id)
        if p.mode not in WORKER_FORWARD_MODES:
            raise ValueError(
                f"cannot finalize launch in mode {p.mode.name}; supported: {describe_modes(WORKER_FORWARD_MODES)}"
            )
        if p.error:
            raise RuntimeError(p.error)
        ids = p.tokens.tolist()
        self._finalized += 1
        if self._finalized % CLEAR_CACHE_EVERY == 0 or not self.batch.rids:
            mx.clear_cache()
        return p.rids, ids

    def abort(self, rids: list[str]) -> None:
        """Forget these requests' KV and sampling state."""
        self.batch.drop(set(rids))
        if not self.batch.rids:
            mx.clear_cache()
