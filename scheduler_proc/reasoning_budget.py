"""`BudgetRow`: one request's reasoning budget, enforced on its finalized tokens.

A request with a `ReasoningBudget` may write at most ``budget`` tokens inside its think
block; once it has and the block is still open, the scheduler forces the block's closing
tag (``close_ids``, one token per step, through a one-token mask in
`ForwardBatch.grammar_masks`), and the model goes on with its answer. The same design as
SGLang's and vLLM's thinking-budget processors, placed where finishes and grammars are
decided: the scheduler, on token ids, never text.

States: BEFORE (the output may still open a block: it does so with ``open_ids`` within its
first ``len(open_ids) + LEAD`` tokens or never), INSIDE (counting), FORCING (writing the
closing tag), DONE (the block closed, by the model or by force, or never opened).

The overlap pipeline chains a decode before the last token is known; a row only needs its
last token when the step it launches next may be a forced one (`reads_last_token`), so a
budget costs overlap for one step per request, not the whole reasoning.
"""

from __future__ import annotations

from collections import deque
from enum import Enum

from protocol.messages import ReasoningBudget
from protocol.token_mask import only

LEAD = 2
"""Tokens the output may write before ``open_ids`` (leading whitespace) and still open a block."""


class Phase(Enum):
    """Where a `BudgetRow` stands (see the module docstring)."""

    BEFORE = "before"
    INSIDE = "inside"
    FORCING = "forcing"
    DONE = "done"


class BudgetRow:
    """The budget of one request. spec: its `ReasoningBudget`; vocab_size: the model's logit
    width (masks are ``4 * ceil(vocab_size / 32)`` bytes). Per step: `next_mask` when its next
    token is launched, then `accept` with that token once finalized. Not thread-safe.

    Raises `ValueError` for a negative budget, a missing tag, or tag ids outside the vocabulary."""

    def __init__(self, spec: ReasoningBudget, vocab_size: int) -> None:
        if spec.budget < 0 or not spec.open_ids or not spec.close_ids:
            raise ValueError("a reasoning budget needs budget >= 0 and both tags' ids")
        if not all(0 <= t < vocab_size for t in spec.open_ids + spec.close_ids):
            raise ValueError(f"a reasoning budget's tag ids must lie in [0, {vocab_size})")
        self.spec, self.vocab_size = spec, vocab_size
        self.phase = Phase.INSIDE if spec.inside else Phase.BEFORE
        self.count = 0  # tokens written inside the block
        self.seen = 0  # tokens written while BEFORE
        self.forced = 0  # closing-tag tokens forced so far
        self._tail: deque[int] = deque(maxlen=max(len(spec.open_ids), len(spec.close_ids)))

    def _ends_with(self, tag: list[int]) -> bool:
        n = len(tag)
        return len(self._tail) >= n and list(self._tail)[-n:] == tag

    def _closing(self) -> int:
        """How many leading tokens of the closing tag the output already ends with (the
        model was writing it): forcing goes on from there instead of starting it again."""
        close = self.spec.close_ids
        return next((k for k in range(min(len(close) - 1, len(self._tail)), 0, -1) if self._ends_with(close[:k])), 0)

    def accept(self, token: int) -> None:
        """Advance by the next finalized output token."""
        if self.phase == Phase.DONE:
            return
        if self.phase == Phase.INSIDE and self.count >= self.spec.budget:
            self.phase, self.forced = Phase.FORCING, self._closing()  # `token` was forced (its launch was masked)
        if self.phase == Phase.FORCING:
            self.forced += 1
            if self.forced == len(self.spec.close_ids):
                self.phase = Phase.DONE
            return
        self._tail.append(token)
        if self.phase == Phase.BEFORE:
            self.seen += 1
            if self._ends_with(self.spec.open_ids):
                self.phase, self.count = Phase.INSIDE, 0
                self._tail.clear()
            elif self.seen >= len(self.spec.open_ids) + LEAD:
                self.phase = Phase.DONE
        elif self._ends_with(self.spec.close_ids):
            self.phase = Phase.DONE
        else:
            self.count += 1

    @property
    def reads_last_token(self) -> bool:
        """True when the step after the one in flight may be forced, so it must be launched
        with this row's last token known (no decode chained behind it)."""
        more = len(self.spec.close_ids) - 1  # forced tag tokens that may still follow the one in flight
        if self.phase == Phase.FORCING:
            return self.forced < more
        if self.phase == Phase.BEFORE:
            return self.spec.budget == 0  # the token in flight may open the block
        if self.phase == Phase.INSIDE and self.count >= self.spec.budget:  # the token in flight was forced
            return self._closing() < more
        return self.phase == Phase.INSIDE and self.count + 1 >= self.spec.budget

    def next_mask(self) -> bytes | None:
        """The one-token mask of the next step when it is forced, else None (free)."""
        if self.phase == Phase.FORCING:
            return only(self.spec.close_ids[self.forced], self.vocab_size)
        if self.phase == Phase.INSIDE and self.count >= self.spec.budget:
            return only(self.spec.close_ids[self._closing()], self.vocab_size)
        return None
