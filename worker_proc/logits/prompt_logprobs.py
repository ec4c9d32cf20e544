"""Prompt logprobs, computed in the prefill chunks that already run.

The logprob of prompt token j comes from the logits at position j - 1. A chunk computes
positions a .. b-1, so it scores tokens a+1 .. b-1 itself, token a from the last row of the
previous chunk (carried), and leaves its own last row to the next chunk (or, for the final
chunk, to sampling: it scores the first output token). Only tokens from
max(logprob_start_len, 1) on are scored (token 0 has no logprob; the scheduler limits a
cached prefix so that every asked position is computed).
"""

from __future__ import annotations

import mlx.core as mx

from worker_proc.logits.logprobs import LazyLogprobs, score
from worker_proc.logits.row import RowSampling


def score_chunk(
    logits: mx.array, ids: list[int], start: int, carry: mx.array | None, row: RowSampling
) -> tuple[LazyLogprobs | None, mx.array]:
    """Score the prompt tokens a chunk completes.

    logits: float [l, V] of the chunk's positions start .. start+l-1; ids: its l tokens;
    carry: [1, V] logits of position start-1 (None for a request's first chunk). Returns
    (the logprobs of the asked tokens, or None; the [1, V] logits of the chunk's last
    position, for the next chunk).
    """
    logits = logits.astype(mx.float32)
    if row.bias is not None:
        logits = logits + row.bias
    if carry is not None:
        rows, targets, first = mx.concatenate([carry, logits[:-1]]), ids, start
    else:
        rows, targets, first = logits[:-1], ids[1:], start + 1
    skip = max(0, max(row.params.logprob_start_len, 1) - first)
    if skip >= len(targets):
        return None, logits[-1:]
    n = len(targets) - skip
    lazy = score(
        rows[skip:],
        mx.array(targets[skip:], dtype=mx.int32),
        [max(row.params.top_logprobs, 0)] * n,
        [list(row.params.token_ids_logprob)] * n,
    )
    return lazy, logits[-1:]
