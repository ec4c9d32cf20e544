"""TARGET_VERIFY: one launch checks the draft tokens of every running row (issue 42).

- **Inputs** int32 [B, S], S = 1 + the longest draft: each physical row's last sampled token,
  then its draft tokens, then filler up to S (token 0: computed, never kept). One model call
  gives logits [B, S, V].
- **Position 0** of every row goes through the whole logits pipeline (`pipeline.process`:
  edits, penalties, grammar masks, custom processors, logprobs): the token a DECODE samples.
- **Position j >= 1** of a row with a draft is sampled as a DECODE j steps later would sample
  it (`sample_drafted`): its logit_bias and min_tokens edits and its truncation, with the
  noise key of ``generated + j``; rows that ask for logprobs are scored there too
  (`score_drafted`). The scheduler drafts only for rows whose state no per-step reader
  advances (no penalties, grammar, custom processor or reasoning budget: `scheduler_proc.spec`).
- **Acceptance** (`accept`, at finalize, on the host): draft token j + 1 is accepted while it
  equals the token sampled at position j (j = 0, 1, ... in order); the row produces the
  sampled tokens 0..a, a being its accepted drafts. For a greedy row that is the longest
  prefix the model agrees with, so the output is the one without speculation, token for
  token. For a sampled row it is speculative sampling (Leviathan et al. 2023, Chen et al.
  2023) with a draft distribution q one-hot at the draft token d (prompt lookup, a greedy
  draft model): d is kept with probability min(1, p(d) / q(d)) = p(d) = P(sample = d); when
  it is not, the token is the sample itself, distributed as p without d, renormalized, which
  is the residual norm(max(p - q, 0)). The noise of each position is keyed by (seed, tokens
  generated) (`logits.sampling`), so a seeded row draws the tokens it draws without
  speculation.
- **Rollback** (`rollback`): every layer wrote S positions per row; row r keeps 1 + a_r (its
  last token and its accepted drafts; the last produced token has no KV yet, as after any
  step). The part every row discards is trimmed (`BatchKVCache.trim`), the rest rolled per
  row so that rows stay right-aligned (mlx-lm's right-padding `finalize`: the discarded
  positions become left padding, which the mask hides).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from protocol.messages import TokenLogprobs
from worker_proc.logits.edits import apply_edits
from worker_proc.logits.logprobs import LazyLogprobs, score
from worker_proc.logits.row import RowSampling
from worker_proc.logits.sampling import sample
from worker_proc.memory.layer_caches import CacheKinds


def unsupported(kinds: CacheKinds) -> str:
    """Why a model with these layers cannot verify drafts ("" when it can): only
    full-attention KV layers roll back by length here; recurrent state and sliding windows
    need their own rollback (not built yet)."""
    if kinds.snapshot:
        return (
            f"speculative decoding needs full-attention layers only; this model has {len(kinds.state)} recurrent "
            f"and {len(kinds.window)} sliding-window layers, whose rollback is not built yet"
        )
    return ""


@dataclass
class VerifyPending:
    """What a TARGET_VERIFY launch leaves for its finalize (all by physical row).

    width: S, positions per row; spec: the physical rows with a draft; drafts[k]: spec[k]'s
    draft tokens; later: int32 [len(spec), S - 1] (lazy), the tokens sampled at positions
    1..S-1 of those rows; slots: the physical row of each launch row; logprobs: (the indexes
    k into `spec` of the rows that ask for logprobs, their positions 1..S-1 scored, row by
    row) or None."""

    width: int
    spec: list[int]
    drafts: list[list[int]]
    later: mx.array | None
    slots: list[int]
    logprobs: tuple[list[int], LazyLogprobs] | None = None

    def arrays(self) -> list[mx.array]:
        """The lazy arrays a finalize reads."""
        return [self.later, *(self.logprobs[1].arrays() if self.logprobs else [])]

    def run_logprobs(self, runs: list[list[int]]) -> dict[int, TokenLogprobs]:
        """k (index into `spec`) -> the logprobs of its run's tokens (positions 1..len(run)),
        for the asking rows with a non-empty run (blocks)."""
        if self.logprobs is None:
            return {}
        asking, lazy = self.logprobs
        w = self.width - 1
        keep = [(n, k) for n, k in enumerate(asking) if runs[k]]
        got = lazy.rows([[n * w + j for j in range(len(runs[k]))] for n, k in keep])
        return {k: tl for (_, k), tl in zip(keep, got)}


def verify_inputs(last_tokens: mx.array, drafts: dict[int, list[int]], size: int) -> tuple[mx.array, int]:
    """(int32 [size, S] inputs, S): column 0 the rows' last tokens [size] (may be lazy), then
    each physical row's draft (`drafts`: row -> tokens; absent rows get filler 0)."""
    width = 1 + max((len(d) for d in drafts.values()), default=0)
    grid = np.zeros((size, width - 1), dtype=np.int32)
    for s, d in drafts.items():
        grid[s, : len(d)] = d
    return mx.concatenate([last_tokens.astype(mx.int32)[:, None], mx.array(grid)], axis=1), width


def sample_drafted(
    logits: mx.array, rows: list[RowSampling], width: int
) -> tuple[mx.array, LazyLogprobs | None, list[int]]:
    """The tokens a DECODE would sample at positions 1..width-1 of each row, and the logprobs
    of those tokens for the rows that ask (after logit edits, before temperature, as a
    DECODE scores them).

    logits: [R, width, V] of the drafted rows (any float dtype); rows: their sampling state
    before this launch's position 0 was sampled (not modified: position j uses a copy at
    ``generated + j``). Returns (int32 [R, width - 1], lazy; the asking rows' positions
    scored row by row, or None; those rows' indexes)."""
    r, v, w = logits.shape[0], logits.shape[-1], width - 1
    flat = logits[:, 1:, :].reshape(r * w, v).astype(mx.float32)
    shifted = [dataclasses.replace(row, generated=row.generated + j) for row in rows for j in range(1, width)]
    edited = apply_edits(flat, shifted)
    tokens = sample(edited, shifted)
    asking = [k for k, row in enumerate(rows) if row.params.wants_logprobs]
    lazy = None
    if asking:
        pos = mx.array([k * w + j for k in asking for j in range(w)], dtype=mx.int32)
        ps = [rows[k].params for k in asking for _ in range(w)]
        lazy = score(
            edited[pos], tokens[pos], [max(p.top_logprobs, 0) for p in ps], [list(p.token_ids_logprob) for p in ps]
        )
    return tokens.reshape(r, w), lazy, asking


def accept(first: list[int], drafts: list[list[int]], later: list[list[int]]) -> list[list[int]]:
    """The tokens each drafted row produces after its first one: the sampled tokens at
    positions 1..a, a being the drafts accepted in order (draft j + 1 is accepted while it
    equals the token sampled at position j). first[k]: position 0's token; drafts[k]: the
    draft; later[k]: positions 1.. (at least len(drafts[k]) of them)."""
    out = []
    for tok, d, rest in zip(first, drafts, later):
        sampled = [tok, *rest]
        a = 0
        while a < len(d) and d[a] == sampled[a]:
            a += 1
        out.append(list(rest[:a]))
    return out


def rollback(caches: list, discard: list[int]) -> None:
    """Drop the last discard[r] positions of every physical row r from each layer's
    `BatchKVCache` (see the module doc); no-op when nothing is discarded."""
    common = min(discard, default=0)
    rest = [d - common for d in discard]
    for c in caches:
        if common:
            c.trim(common)
        if any(rest):
            # a captured step leaves every layer sharing one left_padding array, and mlx-lm's
            # finalize adds in place (+=): each layer gets its own array first
            c.left_padding = mx.array(c.left_padding)
            c.prepare(right_padding=rest)
            c.finalize()
