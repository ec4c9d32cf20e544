"""One log line per request at its end, and the request metrics, as the HTTP process sees it.

The HTTP process is the one place that sees every request (every choice of an ``n`` > 1
request, by its own rid) from arrival to its end, errors and client disconnects included.
The scheduler's queue and prefill times reach it with the request's first token
(`protocol.messages.ReqTiming`). The line, ``request`` (info; warning for an error):

    rid, prompt_tokens, cached_tokens, output_tokens, queue_s, prefill_s (admission to the
    first token, in the scheduler), ttft_s, decode_s (first to last token), e2e_s, then
    finish_reason (stop, length, abort: the client left) or error and status, with this
    process's view of a failed request (stage, seconds since its last output, characters
    received).

No prompt or output text is logged unless ``--log-requests`` (`RequestLog.prompt_text` set):
then ``prompt`` and ``output`` hold at most `MAX_LOGGED_CHARS` characters each (longer
ones are cut, saying how long they were); the renderers escape newlines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from protocol.enums import FinishReason
from protocol.messages import GenerateReq, ReqTiming
from tokenizer_proc.errors import APIError
from tokenizer_proc.link.metrics import RequestMetrics

MAX_LOGGED_CHARS = 2000
"""Characters of prompt and of output a ``--log-requests`` line holds at most."""


@dataclass
class RequestRecord:
    """One request's timeline in this process (monotonic seconds). output: its text so far
    (kept only under ``--log-requests``, at most `MAX_LOGGED_CHARS` + 1 characters)."""

    req: GenerateReq
    arrival: float
    first_token_at: float | None = None
    last_token_at: float | None = None
    output_tokens: int = 0
    cached_tokens: int = 0
    chars: int = 0
    timing: ReqTiming | None = None
    output: str | None = None


class RequestLog:
    """Writes each request's end line and observes `metrics` (see the module docstring).

    log: a structlog logger; prompt_text: token ids -> text, given only under
    ``--log-requests``; clock: monotonic seconds (tests pass a fake)."""

    def __init__(
        self,
        log,
        metrics: RequestMetrics,
        prompt_text: Callable[[list[int]], str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = log if log is not None else structlog.get_logger()
        self.metrics, self.prompt_text, self.clock = metrics, prompt_text, clock

    def start(self, req: GenerateReq) -> RequestRecord:
        """A request arrives (it is about to be sent to the scheduler)."""
        return RequestRecord(req, self.clock(), output="" if self.prompt_text is not None else None)

    def delta(
        self, rec: RequestRecord, completion_tokens: int, text: str, cached_tokens: int, timing: ReqTiming | None
    ) -> None:
        """A step of `rec` arrived: its cumulative token count, new text, cached prompt tokens
        and (with the first token) the scheduler's times. Observes time to first token, one
        inter-token latency per token after the first (a step of k tokens counts its gap
        k times, divided by k) and the token counters."""
        now = self.clock()
        m = self.metrics
        rec.timing = timing or rec.timing
        rec.cached_tokens = cached_tokens or rec.cached_tokens
        new = completion_tokens - rec.output_tokens
        if new > 0:
            if rec.first_token_at is None:
                rec.first_token_at = now
                m.ttft.observe(now - rec.arrival)
                m.prompt_tokens.inc(len(rec.req.input_ids))
                gaps, gap = new - 1, 0.0
            else:
                gaps, gap = new, (now - rec.last_token_at) / new
            for _ in range(gaps):
                m.itl.observe(gap)
            m.generation_tokens.inc(new)
            rec.last_token_at, rec.output_tokens = now, completion_tokens
        rec.chars += len(text)
        if rec.output is not None and len(rec.output) <= MAX_LOGGED_CHARS:
            rec.output += text[: MAX_LOGGED_CHARS + 1 - len(rec.output)]

    def end(self, rec: RequestRecord, reason: FinishReason | None, error: APIError | None = None) -> None:
        """`rec` ended: with `reason` (finished), with `error`, or with neither (the client
        left: counted and logged as ``abort``). Writes its line and observes the latency
        histograms of finished requests."""
        now = self.clock()
        m = self.metrics
        t = rec.timing
        decode = rec.last_token_at - rec.first_token_at if rec.first_token_at is not None else None
        fields = dict(
            rid=rec.req.rid,
            prompt_tokens=len(rec.req.input_ids),
            cached_tokens=rec.cached_tokens,
            output_tokens=rec.output_tokens,
            queue_s=_round(t.queue_time if t else None),
            prefill_s=_round(t.prefill_time if t else None),
            ttft_s=_round(rec.first_token_at - rec.arrival if rec.first_token_at is not None else None),
            decode_s=_round(decode),
            e2e_s=_round(now - rec.arrival),
        )
        if t is not None and t.spec_draft_tokens:
            fields.update(
                spec_draft_tokens=t.spec_draft_tokens,
                spec_accepted_tokens=t.spec_accepted_tokens,
                spec_acceptance=round(t.spec_accepted_tokens / t.spec_draft_tokens, 3),
            )
        if self.prompt_text is not None:
            n = len(rec.req.input_ids)
            fields["prompt"] = _clip(self.prompt_text(rec.req.input_ids[: MAX_LOGGED_CHARS + 1]), f"{n} tokens")
            fields["output"] = _clip(rec.output or "", f"{rec.chars} characters")
        if error is not None:
            m.request_errors.labels(status=str(error.status)).inc()
            since = now - (rec.last_token_at or rec.arrival)
            self.log.warning(
                "request",
                **fields,
                error=error.message,
                status=error.status,
                stage="queued or prefilling" if rec.first_token_at is None else "decoding",
                since_last_output_s=_round(since),
                chars_received=rec.chars,
            )
            return
        reason = FinishReason.ABORT if reason is None else reason
        m.request_success.labels(finished_reason=reason.api_str).inc()
        if reason != FinishReason.ABORT:
            m.e2e.observe(now - rec.arrival)
            if t is not None:
                m.queue.observe(t.queue_time)
                m.prefill.observe(t.prefill_time)
            if decode is not None:
                m.decode.observe(decode)
        self.log.info("request", **fields, finish_reason=reason.api_str)


def _round(seconds: float | None) -> float | None:
    """Seconds to the millisecond (None stays None)."""
    return None if seconds is None else round(seconds, 4)


def _clip(text: str, total: str) -> str:
    """`text` cut to `MAX_LOGGED_CHARS` characters, saying how long the whole was (`total`,
    e.g. "812 tokens"). Both log renderers escape newlines (console: repr; JSON)."""
    return f"{text[:MAX_LOGGED_CHARS]}... (cut; {total} in all)" if len(text) > MAX_LOGGED_CHARS else text
