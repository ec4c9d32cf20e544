"""One launch's logits to tokens: edits, penalties, logprobs, sampling (see the package doc)."""

from __future__ import annotations

import mlx.core as mx

from worker_proc.logits.custom import apply_processors
from worker_proc.logits.edits import apply_edits
from worker_proc.logits.logprobs import LazyLogprobs, score
from worker_proc.logits.penalties import PenaltyState
from worker_proc.logits.row import RowSampling
from worker_proc.logits.sampling import sample


def process(
    logits: mx.array,
    rows: list[RowSampling],
    penalties: PenaltyState | None = None,
    grammar: dict[int, bytes] | None = None,
    failed: dict[int, str] | None = None,
) -> tuple[mx.array, LazyLogprobs | None, list[int]]:
    """Sample one token per row and score the rows that ask for logprobs (all lazy).

    logits: [B, V] any float dtype; rows[i]: row i's state (its `generated` count is advanced);
    penalties: the rows' penalty state (advanced with the sampled tokens); grammar: row ->
    packed mask; failed: filled with row -> message for rows whose custom processor failed.
    Returns (tokens int32 [B], logprobs of the asking rows or None, those rows).
    """
    logits = apply_edits(logits.astype(mx.float32), rows, grammar)
    if penalties is not None:
        logits = penalties.apply(logits)
    logits, errors = apply_processors(logits, [r.processor for r in rows])
    if failed is not None:
        failed.update(errors)
    tokens = sample(logits, rows)
    asking = [i for i, r in enumerate(rows) if r.params.wants_logprobs]
    lazy = None
    if asking:
        idx = mx.array(asking, dtype=mx.int32)
        lazy = score(
            logits[idx],
            tokens[idx],
            [max(rows[i].params.top_logprobs, 0) for i in asking],
            [list(rows[i].params.token_ids_logprob) for i in asking],
        )
    if penalties is not None:
        penalties.advance(tokens)
    for r in rows:
        r.generated += 1
    return tokens, lazy, asking
