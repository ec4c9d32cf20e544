"""`Speculator`: the scheduler's speculative decoding, NGRAM drafts under the policies of
`policy`, and its counters for /metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler_proc.spec.ngram import TokenHistory
from scheduler_proc.spec.policy import DraftLength, SpeedPolicy


@dataclass
class ReqSpec:
    """One request's drafting state: its tokens (`TokenHistory`, synced with its output
    before each draft), its adaptive draft length, and its verified and accepted draft
    tokens."""

    history: TokenHistory
    length: DraftLength
    synced: int = 0
    drafted: int = 0
    accepted: int = 0


@dataclass
class SpecCounters:
    """Totals since start: verified rows that carried a draft, their draft tokens, the
    accepted ones, and accept_lengths[j]: drafts that had j tokens accepted (j = 0..k)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accept_lengths: list[int] = field(default_factory=list)


class Speculator:
    """Drafts for the running requests that may speculate, and the decision to speculate.

    k: ``--speculative-num-draft-tokens``, the longest draft (a verify computes k + 1
    positions per row); speed: the per-batch on/off policy (default: a new `SpeedPolicy`).
    Raises `ValueError` for k < 1."""

    def __init__(self, k: int, speed: SpeedPolicy | None = None) -> None:
        if k < 1:
            raise ValueError(f"--speculative-num-draft-tokens must be at least 1, got {k}")
        self.k = k
        self.speed = speed or SpeedPolicy(k)
        self.counters = SpecCounters(accept_lengths=[0] * (k + 1))
        self._next: int | None = None

    def decide(self, batch_size: int) -> int:
        """The draft-length cap of the next decode-type launch (0: it does not speculate),
        decided once per launch and kept until `take`."""
        if self._next is None:
            self._next = self.speed.cap(batch_size)
        return self._next

    def take(self, batch_size: int) -> int:
        """`decide` for the launch being built now, and forget the decision."""
        decision = self.decide(batch_size)
        self._next = None
        return decision

    @staticmethod
    def eligible(req) -> bool:
        """Whether `req` may take a draft: it did not opt out (``speculative: false``) and no
        per-token state reads its tokens one at a time (penalties, a custom logit processor, a
        grammar, a reasoning budget)."""
        p = req.msg.sampling
        return (
            p.speculative and not p.penalized and not p.logit_processor and req.grammar is None and req.budget is None
        )

    def draft(self, req, cap: int) -> list[int]:
        """`req`'s draft for its next launch: prompt lookup over its tokens, at most its
        adaptive length, `cap` and one short of its remaining max_tokens ([] when not
        eligible)."""
        if not self.eligible(req):
            return []
        st = req.spec
        if st is None:
            st = req.spec = ReqSpec(TokenHistory(req.input_ids), DraftLength(self.k))
        if st.synced < len(req.output_ids):
            st.history.extend(req.output_ids[st.synced :])
            st.synced = len(req.output_ids)
        k = min(st.length.next(), cap, req.max_new_tokens - len(req.output_ids) - 1)
        return st.history.propose(k)

    def verified(self, req, drafted: int, accepted: int) -> None:
        """A draft of `drafted` tokens of `req` was verified, `accepted` of them kept."""
        if drafted <= 0 or req.spec is None:
            return
        req.spec.length.update(drafted, accepted)
        req.spec.drafted += drafted
        req.spec.accepted += accepted
        c = self.counters
        c.drafts += 1
        c.draft_tokens += drafted
        c.accepted_tokens += accepted
        c.accept_lengths[min(accepted, self.k)] += 1
