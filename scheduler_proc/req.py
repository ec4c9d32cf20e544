"""`Req`: the scheduler's state for one request."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field

from protocol.enums import FinishReason
from protocol.messages import GenerateReq, ReqTiming
from scheduler_proc.logprobs import ReqLogprobs
from scheduler_proc.mem.kv_memory import KVState
from scheduler_proc.reasoning_budget import BudgetRow
from scheduler_proc.spec.speculator import ReqSpec


@dataclass(eq=False)
class Req:
    """One request from arrival to finish.

    output_ids: generated token ids (including an EOS/stop token that ended it);
    fill_ids: the tokens to prefill (the prompt; after a retraction, prompt plus output);
    prefilled: tokens of fill_ids whose KV exists or is being computed (a cached prefix
    counts); kv: its KV slots while admitted; cached_tokens: prefix hit at first admission;
    detokenizer: the replica index chosen when it was first scheduled (-1 before);
    finish_reason: set exactly once, by `Scheduler` (the one place that decides).
    logprobs: kept when the request asks for output or prompt logprobs (else None);
    grammar: its matcher once compiled (a `scheduler_proc.grammar.RowGrammar`), and
    grammar_future while it compiles. budget: its reasoning budget (a
    `scheduler_proc.reasoning_budget.BudgetRow`), or None. spec: its speculative decoding
    state once it first drafted (`scheduler_proc.spec.speculator.ReqSpec`), or None.
    Times (the scheduler's clock, seconds): arrived_at when it reached the scheduler;
    admitted_at at its first admission; first_token_at when its first token was sampled;
    progress_at when it last progressed (arrival, admission, a prefill chunk, a token, a
    retraction), which `Scheduler.expire` watches.
    """

    rid: str
    input_ids: list[int]
    max_new_tokens: int
    msg: GenerateReq
    stop_ids: frozenset[int]
    output_ids: list[int] = field(default_factory=list)
    prefilled: int = 0
    fill_ids: list[int] = field(default_factory=list)
    kv: KVState | None = None
    cached_tokens: int = 0
    detokenizer: int = -1
    finish_reason: FinishReason | None = None
    matched_stop: int | None = None
    logprobs: ReqLogprobs | None = None
    grammar: object | None = None
    grammar_future: Future | None = None
    budget: BudgetRow | None = None
    spec: ReqSpec | None = None
    arrived_at: float = 0.0
    admitted_at: float | None = None
    first_token_at: float | None = None
    progress_at: float = 0.0

    @classmethod
    def from_msg(cls, msg: GenerateReq, now: float = 0.0) -> Req:
        """Build from the tokenizer's `GenerateReq`, arrived at time `now`."""
        ids = list(msg.input_ids)
        wants = msg.sampling.wants_logprobs or msg.sampling.logprob_start_len >= 0
        return cls(
            msg.rid,
            ids,
            msg.max_new_tokens,
            msg,
            frozenset(msg.eos_token_ids) | frozenset(msg.stop_token_ids),
            fill_ids=ids,
            logprobs=ReqLogprobs() if wants else None,
            arrived_at=now,
            progress_at=now,
        )

    @property
    def timing(self) -> ReqTiming | None:
        """Its queue and prefill times once it has its first token (else None), and its
        draft tokens verified and accepted so far."""
        if self.first_token_at is None or self.admitted_at is None:
            return None
        drafted, accepted = (self.spec.drafted, self.spec.accepted) if self.spec is not None else (0, 0)
        return ReqTiming(self.admitted_at - self.arrived_at, self.first_token_at - self.admitted_at, drafted, accepted)

    @property
    def reads_last_token(self) -> bool:
        """True when its next step needs its last token as a finalized int (a grammar mask,
        a custom logit processor, a reasoning budget about to force), so a decode cannot be
        chained behind it."""
        return (
            self.grammar is not None
            or bool(self.msg.sampling.logit_processor)
            or (self.budget is not None and self.budget.reads_last_token)
        )

    def next_mask(self) -> bytes | None:
        """The packed token mask of its next token (`protocol.token_mask`): the one forced
        token of its reasoning budget, else its grammar's mask, else None. Call only with its
        last token finalized (see `reads_last_token`)."""
        if self.budget is not None and (mask := self.budget.next_mask()) is not None:
            return mask
        return None if self.grammar is None else self.grammar.next_mask()

    @property
    def max_prefix(self) -> int | None:
        """The longest cached prefix this request may use (None: any): a request asking for
        prompt logprobs from position s computes positions from s - 1 on (the logits at
        j - 1 score token j), the first time its prompt is prefilled."""
        s = self.msg.sampling.logprob_start_len
        return max(s - 1, 0) if s >= 0 and not self.output_ids else None

    @property
    def finished(self) -> bool:
        """True once a finish reason is set."""
        return self.finish_reason is not None

    @property
    def scores_prompt(self) -> bool:
        """True when it asks for prompt logprobs (then it is prefilled even with
        max_new_tokens 0: completions' echo with logprobs scores a prompt)."""
        return self.msg.sampling.logprob_start_len >= 0

    def check_finish(self, token: int) -> bool:
        """Record `token` and set the finish reason it causes, if any; returns whether the
        token is part of the output (False for a request with max_new_tokens 0, which only
        scored its prompt and ends LENGTH without it).

        STOP when token is an EOS or stop token id (matched_stop = the id for a user stop
        token, None for EOS, as vLLM's stop_reason), or when the request's grammar has
        terminated with it (or rejects it, which its mask prevents); LENGTH when
        max_new_tokens tokens exist.
        """
        if self.max_new_tokens <= 0:
            self.finish_reason = FinishReason.LENGTH
            return False
        self.output_ids.append(token)
        if self.budget is not None:
            self.budget.accept(token)
        if token in self.stop_ids:
            self.finish_reason = FinishReason.STOP
            self.matched_stop = token if token in self.msg.stop_token_ids else None
        elif self.grammar is not None and (not self.grammar.accept(token) or self.grammar.terminated):
            self.finish_reason = FinishReason.STOP
        elif len(self.output_ids) >= self.max_new_tokens:
            self.finish_reason = FinishReason.LENGTH
        return True

    def shows(self, token: int) -> bool:
        """False for an EOS or stop token: it ends the text and is not rendered, unless the
        request asked for include_stop_str_in_output, which (as in vLLM) renders the stop
        token that ended it too (an EOS renders as "" with skip_special_tokens)."""
        return token not in self.stop_ids or self.msg.detok.include_stop_str_in_output
