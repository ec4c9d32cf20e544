"""`RunningBatch`: the requests that decode together, in rows that are reused (issue 13).

The decode batch keeps one left-padded `BatchKVCache` per attention layer: every row's KV
is right-aligned at the cache's write index (sliding-window layers a `WindowBatchKVCache`,
cut back to their window as they grow, `trim_windows`; recurrent layers a batched
`ArraysCache`, one state per row; `layer_caches`). Removing a row (`BatchKVCache.filter`) or adding
one (`extend`) rewrites every layer; with 64 rows on an H200 a leave cost about one whole
decode step (`python bench/kv_layout.py`). So rows are slots:

- a request that leaves frees its slot without a copy: the row keeps decoding under a
  neutral greedy sampling state, and nobody reads its tokens;
- a joining request whose KV fits in the batch's width (its length <= the write index)
  is written into a free slot, one row per layer; otherwise, or when the batch has penalty
  state, the batch is compacted and the request appended (the copies of before);
- the batch is compacted once more than `MAX_FREE_SHARE` of its rows are free, or when a
  join cannot use the free slots, or when every live row carries `TRIM_AT` positions of
  left padding: under steady load free rows are refilled and never compacted, and the
  write index (the cache's width: memory and attention work) would grow without bound.

`rids` is the scheduler's order of the live requests (DECODE launches name them in that
order); `slots[i]` is the physical row of `rids[i]`. Everything else (`cache`, `last_tokens`,
`rows`, `lengths`, `penalties`) is by physical row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from protocol.messages import SamplingParams
from worker_proc.logits.penalties import PenaltyState, concat
from worker_proc.logits.row import RowSampling
from worker_proc.memory.layer_caches import batch_width, is_full, is_state, write_state_rows
from worker_proc.memory.window_cache import is_window, trim_window

MAX_FREE_SHARE = 0.5
"""Free rows the batch carries at most, as a share of its rows, before it is compacted."""
TRIM_AT = 256
"""Left padding every live row carries (cache positions before the longest live row's
first) at which a join compacts the batch first (one copy per `TRIM_AT` steps at most)."""
_NEUTRAL = SamplingParams(temperature=0.0)


@dataclass
class RunningBatch:
    """The live requests (`rids`, scheduler order) and their rows (see module doc)."""

    vocab: int
    rids: list[str] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    cache: list | None = None
    last_tokens: mx.array | None = None
    rows: list[RowSampling] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    penalties: PenaltyState | None = None

    @property
    def size(self) -> int:
        """Physical rows, live and free (the batch size a decode step computes)."""
        return len(self.rows)

    def free(self) -> list[int]:
        """Physical rows no live request holds, ascending."""
        held = set(self.slots)
        return [s for s in range(self.size) if s not in held]

    def length(self, i: int) -> int:
        """KV positions of live request i."""
        return self.lengths[self.slots[i]]

    def row(self, i: int) -> RowSampling:
        """Sampling state of live request i."""
        return self.rows[self.slots[i]]

    def live_tokens(self, tokens: mx.array) -> mx.array:
        """int32 [live] in `rids` order, from a step's tokens by physical row [size] (lazy)."""
        if self.slots == list(range(self.size)):
            return tokens
        return tokens[mx.array(self.slots, dtype=mx.int32)]

    def append(
        self,
        rids: list[str],
        cache: list,
        tokens: mx.array,
        rows: list[RowSampling],
        lengths: list[int],
        penalties: PenaltyState | None,
    ) -> list[int]:
        """Add prefilled requests after the live ones and return their physical rows. cache:
        their per-layer caches (one row each, in order); tokens: int32 [n] their first
        sampled tokens; lengths: KV positions of each; penalties: their penalty state (None
        when none is penalized)."""
        if not self.rids:
            self.slots, self.cache, self.last_tokens = list(range(len(rids))), cache, tokens
            self.rows, self.lengths, self.penalties = list(rows), list(lengths), penalties
            self.rids = list(rids)
            self.trim_windows()
            return list(self.slots)
        if self.padding() >= TRIM_AT:
            self.compact(trim=True)
        free, width = self.free(), batch_width(self.cache)
        if (
            penalties is None
            and self.penalties is None
            and len(rids) <= len(free)
            and (width is None or max(lengths) <= width)
            and all(
                mine._idx >= min(theirs._idx, mine.window) for mine, theirs in zip(self.cache, cache) if is_window(mine)
            )
        ):
            self._fill(free[: len(rids)], cache, tokens, rows, lengths)
        else:
            self.compact()
            base = self.size
            for mine, theirs in zip(self.cache, cache):
                mine.extend(theirs)
            self.penalties = concat(self.penalties, base, penalties, len(rids), self.vocab)
            self.last_tokens = mx.concatenate([self.last_tokens, tokens])
            self.rows += rows
            self.lengths += lengths
            self.slots += list(range(base, base + len(rids)))
        self.rids += rids
        self.trim_windows()
        return self.slots[-len(rids) :]

    def trim_windows(self) -> None:
        """Cut the window layers back to their window once they carry `WINDOW_SLACK`
        positions more (`window_cache.trim_window`; no-op for a model without them)."""
        for c in self.cache or ():
            if is_window(c):
                trim_window(c)

    def _fill(
        self, slots: list[int], cache: list, tokens: mx.array, rows: list[RowSampling], lengths: list[int]
    ) -> None:
        """Write new rows j into free `slots[j]`: their KV right-aligned at the write index
        (the slot's older positions are masked by its new left padding), their recurrent
        state in place of the slot's. The last ``min(write index, their width)`` positions
        are copied for every row at once, a row's own left padding with them (masked too).
        A window layer may have been cut shorter than a new row's positions (`trim_windows`):
        the row keeps the last ones, at least its window, and its left padding starts at the
        first one copied, so no column of the slot's last occupant stays visible."""
        idx, lens = mx.array(slots, dtype=mx.int32), mx.array(lengths)  # shared by every layer
        for mine, theirs in zip(self.cache, cache):
            if is_state(mine):
                write_state_rows(mine, slots, theirs)
                continue
            end, src = mine._idx, theirs._idx
            w = min(end, src)  # >= every new row's length: one write per array for all rows
            mine.keys[idx, :, end - w : end, :] = theirs.keys[:, :, src - w : src, :]
            mine.values[idx, :, end - w : end, :] = theirs.values[:, :, src - w : src, :]
            mine.left_padding[idx] = mx.maximum(theirs.left_padding + (end - src), end - w)
            mine.offset[idx] = lens
        last = mx.array(self.last_tokens)  # a new array: a pending launch may return the old one
        last[idx] = tokens
        self.last_tokens = last
        for j, s in enumerate(slots):
            self.rows[s], self.lengths[s] = rows[j], lengths[j]
        self.slots += slots

    def rows_kv(self, rows: list[tuple[int, int, int]]) -> list[tuple[mx.array, mx.array]]:
        """Per full-attention layer (keys, values) [N, kv_heads, head_dim] (lazy) of the positions
        start..end-1 of each live request i of `rows` = [(i, start, end), ...], in that order
        (N: their total). One indexing per cache array for all of them: a slice per request
        and layer costs a copy kernel each, which a GPU's host thread pays for (~40 ms for
        37 prompts of a Llama-1B on an H200, between a prefill and the next launch). Each
        request's KV is right-aligned at the write index."""
        counts = np.array([end - start for _, start, end in rows])
        r = mx.array(np.repeat([self.slots[i] for i, _, _ in rows], counts).astype(np.int32))
        # each position relative to the write index: -(length - start) for a row's first, then +1 each
        back = np.repeat([self.lengths[self.slots[i]] - start for i, start, _ in rows], counts)
        within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        relative = within - back
        out, positions = [], {}
        for c in (c for c in self.cache if is_full(c)):
            if c._idx not in positions:  # the write index is shared by every attention layer
                positions[c._idx] = mx.array((relative + c._idx).astype(np.int32))
            p = positions[c._idx]
            out.append((c.keys[r, :, p, :], c.values[r, :, p, :]))
        return out

    def drop(self, rids: set[str]) -> None:
        """Free the rows of `rids` (unknown rids are ignored); compact past `MAX_FREE_SHARE`."""
        gone = [i for i, r in enumerate(self.rids) if r in rids]
        if not gone:
            return
        if len(gone) == len(self.rids):
            self.rids, self.slots, self.cache, self.last_tokens = [], [], None, None
            self.rows, self.lengths, self.penalties = [], [], None
            return
        for i in gone:
            self.rows[self.slots[i]] = RowSampling.start(_NEUTRAL, self.vocab)
        gone_set = set(gone)
        keep = [i for i in range(len(self.rids)) if i not in gone_set]
        self.rids = [self.rids[i] for i in keep]
        self.slots = [self.slots[i] for i in keep]
        if self.size - len(self.slots) > MAX_FREE_SHARE * self.size:
            self.compact()

    def padding(self) -> int:
        """Cache positions before the longest live row's first (0 without live rows or
        attention layers)."""
        width = batch_width(self.cache) if self.rids else None
        if width is None:
            return 0
        return width - max(self.lengths[s] for s in self.slots)

    def compact(self, trim: bool = False) -> None:
        """Rewrite the batch as its live rows only, in `rids` order, without the padding they
        all carry (no-op without free rows, unless `trim`)."""
        if len(self.slots) == self.size and not trim:
            return
        idx = mx.array(self.slots, dtype=mx.int32)
        for c in self.cache:
            c.filter(idx)
        self.last_tokens = self.last_tokens[idx]
        self.rows = [self.rows[s] for s in self.slots]
        self.lengths = [self.lengths[s] for s in self.slots]
        if self.penalties is not None:
            self.penalties = self.penalties.take(idx) if any(r.params.penalized for r in self.rows) else None
        self.slots = list(range(len(self.rids)))
