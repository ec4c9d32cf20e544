"""Repetition, frequency and presence penalties with per-row token counts on the device.

Semantics as vLLM and OpenAI: frequency and presence count generated tokens only,
``logit -= frequency * count + presence * (count > 0)``; repetition counts prompt and
generated tokens, dividing a positive logit by the penalty and multiplying a negative one
(CTRL, Keskar et al. 2019, as transformers and vLLM apply it). Repetition is applied first.

The counts are a float32 [B, V] array advanced inside the graph from the sampled tokens
(`advance`), so a penalized batch chains like any other; rows without penalties have zero
coefficients and a repetition penalty of 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx

from worker_proc.logits.row import RowSampling


@dataclass
class PenaltyState:
    """Penalty state of B batch rows: counts float32 [B, V] (generated tokens), prompt_seen
    bool [B, V] (prompt tokens; None when no row has a repetition penalty), and per-row
    coefficients float32 [B] (frequency, presence, repetition)."""

    counts: mx.array
    prompt_seen: mx.array | None
    frequency: mx.array
    presence: mx.array
    repetition: mx.array

    @classmethod
    def for_rows(
        cls, rows: list[RowSampling], prompts: list[list[int]], generated: list[list[int]], vocab: int
    ) -> PenaltyState | None:
        """State for new rows (None when none is penalized). prompts[i]: row i's prompt ids
        (only read for rows with a repetition penalty); generated[i]: tokens row i already
        generated (a retracted request prefilled again), counted as output."""
        if not any(r.params.penalized for r in rows):
            return None
        n = len(rows)
        counts = mx.zeros((n, vocab), dtype=mx.float32)
        pairs = [(i, t) for i, g in enumerate(generated) for t in g if 0 <= t < vocab]
        if pairs:
            counts = counts.at[mx.array([i for i, _ in pairs]), mx.array([t for _, t in pairs])].add(1.0)
        seen = None
        rep_rows = [i for i, r in enumerate(rows) if r.params.repetition_penalty != 1.0]
        if rep_rows:
            seen = mx.zeros((n, vocab), dtype=mx.bool_)
            pairs = [(i, t) for i in rep_rows for t in prompts[i] if 0 <= t < vocab]
            if pairs:
                seen[mx.array([i for i, _ in pairs]), mx.array([t for _, t in pairs])] = True
        coef = lambda name: mx.array([getattr(r.params, name) for r in rows], dtype=mx.float32)  # noqa: E731
        return cls(counts, seen, coef("frequency_penalty"), coef("presence_penalty"), coef("repetition_penalty"))

    @classmethod
    def neutral(cls, n: int, vocab: int, with_seen: bool) -> PenaltyState:
        """State of n unpenalized rows (zero counts, coefficients that change nothing)."""
        seen = mx.zeros((n, vocab), dtype=mx.bool_) if with_seen else None
        return cls(mx.zeros((n, vocab), dtype=mx.float32), seen, mx.zeros((n,)), mx.zeros((n,)), mx.ones((n,)))

    def apply(self, logits: mx.array) -> mx.array:
        """Penalized logits float32 [B, V] (lazy)."""
        generated = self.counts > 0
        seen = generated if self.prompt_seen is None else (generated | self.prompt_seen)
        rep = self.repetition[:, None]
        logits = mx.where(seen, mx.where(logits > 0, logits / rep, logits * rep), logits)
        return logits - self.frequency[:, None] * self.counts - self.presence[:, None] * generated

    def advance(self, tokens: mx.array) -> None:
        """Count the sampled tokens int32 [B] (lazy; may be -1 for a row that sampled none,
        which is not counted)."""
        rows = mx.arange(tokens.shape[0])
        self.counts = self.counts.at[rows, mx.maximum(tokens, 0)].add((tokens >= 0).astype(mx.float32))

    def take(self, idx: mx.array) -> PenaltyState:
        """The state of rows `idx` (int32 [K]), in that order."""
        seen = None if self.prompt_seen is None else self.prompt_seen[idx]
        return PenaltyState(self.counts[idx], seen, self.frequency[idx], self.presence[idx], self.repetition[idx])


def concat(a: PenaltyState | None, n_a: int, b: PenaltyState | None, n_b: int, vocab: int) -> PenaltyState | None:
    """The state of a batch of n_a rows (state a) followed by n_b rows (state b); a missing
    side gets neutral rows. None when neither side has a state."""
    if a is None and b is None:
        return None
    with_seen = any(s is not None and s.prompt_seen is not None for s in (a, b))
    a = a or PenaltyState.neutral(n_a, vocab, with_seen)
    b = b or PenaltyState.neutral(n_b, vocab, with_seen)
    seen = None
    if with_seen:
        seen = mx.concatenate(
            [s.prompt_seen if s.prompt_seen is not None else mx.zeros(s.counts.shape, dtype=mx.bool_) for s in (a, b)]
        )
    return PenaltyState(
        mx.concatenate([a.counts, b.counts]),
        seen,
        mx.concatenate([a.frequency, b.frequency]),
        mx.concatenate([a.presence, b.presence]),
        mx.concatenate([a.repetition, b.repetition]),
    )
