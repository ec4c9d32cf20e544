"""`TokenizerManager`: per-request state in the HTTP process and its ZeroMQ links.

Each request gets an asyncio queue; one background task receives `BatchStrOut`/`ReqError`
from the detokenizers and the scheduler and routes rows to the queues by rid. A request
whose consumer goes away (client disconnect, cancelled task) is aborted in the scheduler.
Each request's text passes through a `Receipt` (exactly once, by offset, even when a
detokenizer replica is lost); when its stream ends the scheduler hears `StreamsClosed`, and
it may ask how much text arrived (`DeliveredQuery`, answered with `DeliveredChars`).
On `TokenizerDrain` (launch got SIGTERM/SIGINT) new requests are refused with a 503 and
`Drained` goes to launch once the last request in flight has ended.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

import msgspec
import zmq
import zmq.asyncio

from protocol import codec, endpoints
from protocol.enums import FinishReason, Role
from protocol.messages import (
    AbortReq,
    BatchStrOut,
    CacheFlushed,
    DeliveredChars,
    DeliveredQuery,
    DetokStatus,
    Drained,
    FlushCache,
    GenerateReq,
    HealthAnswer,
    LogprobEntries,
    ReqError,
    ReqTiming,
    ResolvedSettings,
    SchedulerStats,
    ServerReady,
    StreamsClosed,
    TokenizerDrain,
    TokenizerShutdown,
    WorkerStatus,
)
from protocol.sockets import bind_pull
from tokenizer_proc.errors import APIError, FieldError
from tokenizer_proc.link.fanout_trace import FanoutTrace
from tokenizer_proc.link.metrics import RequestMetrics
from tokenizer_proc.link.receipt import Receipt, TextGap
from tokenizer_proc.link.request_hold import ClientGone, Hold
from tokenizer_proc.link.request_log import RequestLog
from tokenizer_proc.link.scheduler_probe import SchedulerProbe


@dataclass
class Delta:
    """One step of one request: new text, the cumulative completion token count, and the
    finish reason and matched stop once it ended. logprobs: the logprob entries of its new
    output tokens (None when none came); prompt_logprobs: the prompt's entries (once, with an
    early step, for requests that asked for them). timing: the scheduler's queue and prefill
    times (with the first token)."""

    text: str
    completion_tokens: int
    finish_reason: FinishReason | None = None
    matched_stop: str | int | None = None
    cached_tokens: int = 0
    logprobs: LogprobEntries | None = None
    prompt_logprobs: LogprobEntries | None = None
    timing: ReqTiming | None = None


RETRY_AFTER_S = 1
"""``Retry-After`` of a 429 for a full queue: requests end at any step, so the queue may
have room within a second; clients back off further on their own when it has not."""

DRAIN_POLL_S = 0.05
"""How often a draining tokenizer checks whether the last request in flight has ended."""

WATCH_INTERVAL_S = 1.0
"""While requests are in flight (or the scheduler counts as stuck), the HTTP process probes the
scheduler this often (`_watch_scheduler`)."""
RID_REUSE_GRACE_S = 2.0
"""How long a request whose client-chosen id is held by a request whose client has left
waits for that id to be let go before it is refused as in use (`wait_rids_free`)."""


class TokenizerManager:
    """Sends requests to the scheduler and yields their `Delta`s.

    max_running: the scheduler's ``--max-running-requests``; max_queued: how many choices
    may wait beyond them (``--max-queued-requests``, None: unlimited), see `check_room`;
    prompt_text: token ids -> text, for request log lines with text (``--log-requests``;
    None: no text); stall_timeout_s: ``--stall-timeout``, how long the scheduler may leave a
    health probe unanswered (`probe`; 0: not probed) before the requests in flight fail and
    new ones are refused (`_watch_scheduler`). metrics: the app's `RequestMetrics`;
    requests: the per-request log."""

    def __init__(
        self,
        run_dir: str,
        log,
        max_running: int = 64,
        max_queued: int | None = None,
        prompt_text: Callable[[list[int]], str] | None = None,
        stall_timeout_s: float = 0.0,
    ) -> None:
        self.log, self.run_dir = log, run_dir
        self.max_running, self.max_queued = max_running, max_queued
        self.ctx = zmq.asyncio.Context()
        self.to_scheduler = self.ctx.socket(zmq.PUSH)
        self.to_scheduler.connect(endpoints.scheduler(run_dir))
        self.inbox = bind_pull(self.ctx, endpoints.tokenizer(run_dir))
        self.queues: dict[str, asyncio.Queue] = {}
        self.receipts: dict[str, Receipt] = {}
        self.client_rids: set[str] = set()
        """Ids that clients chose for the requests in flight (see `generate`)."""
        self.client_gone: dict[str, ClientGone] = {}
        """For ids in `client_rids` whose route said how: whether their client has left (`Hold`)."""
        self._rids_freed = asyncio.Event()
        """Set (and replaced) whenever ids leave `client_rids` (`release_client_rids`)."""
        self.held = 0
        """Choices accepted whose `generate` has not started yet (see `Hold`)."""
        self.detok_status: DetokStatus | None = None
        self.ready = False
        self.stopping = False
        self.failed = False  # set by fail_all: even requests accepted earlier (held) fail now
        self.shutdown_reason: str | None = None  # set by launch's TokenizerShutdown: the process then stops
        self.worker_down = ""  # why, while the scheduler waits for a restarted worker
        self.stats: SchedulerStats | None = None
        self.resolved: dict[str, int] = {}
        """Settings the worker resolved (the latest `ResolvedSettings`), for /get_server_info."""
        self._task: asyncio.Task | None = None
        self._drain_task: asyncio.Task | None = None
        self._watch_task: asyncio.Task | None = None
        self.scheduler_stuck = ""
        """Why the scheduler counts as stuck (its health probe unanswered for the stall
        timeout), "" while it answers; new requests get a 503 saying it meanwhile."""
        self.trace = FanoutTrace.from_env()
        self.metrics = RequestMetrics(lambda: self.stats, lambda: self.in_flight)
        self.requests = RequestLog(log, self.metrics, prompt_text)
        self.probe = SchedulerProbe(lambda msg: self.to_scheduler.send(codec.encoder.encode(msg)), stall_timeout_s)
        self._flushes: dict[int, asyncio.Future] = {}
        """`FlushCache` seq -> done with the scheduler's `CacheFlushed` (see `flush_cache`)."""
        self._flush_seq = 0

    async def flush_cache(self, timeout_s: float) -> CacheFlushed:
        """Ask the scheduler to drop the prefixes its radix cache holds that no request in
        flight uses (``/flush_cache``) and return its answer. Raises `TimeoutError` when none
        came within `timeout_s` seconds (the scheduler reads its inbox between steps)."""
        self._flush_seq += 1
        seq = self._flush_seq
        answered = self._flushes[seq] = asyncio.get_running_loop().create_future()
        await self.to_scheduler.send(codec.encoder.encode(FlushCache(seq)))
        try:
            return await asyncio.wait_for(answered, timeout_s)
        finally:
            self._flushes.pop(seq, None)

    def start(self) -> None:
        """Start the receive loop, and the scheduler's watch, on the running event loop."""
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._recv_loop())
        if self.probe.timeout_s:
            self._watch_task = loop.create_task(self._watch_scheduler())

    async def _watch_scheduler(self) -> None:
        """While requests are in flight, probe the scheduler every `WATCH_INTERVAL_S`. A probe
        unanswered for the stall timeout (its loop is stuck, or the process stopped) fails
        every request in flight with a 503 saying so (their streams hung, with keep-alives
        only, for as long as it did: the scheduler's own deadlines stop with its loop) and
        sends their aborts, which the scheduler reads if it comes back; until it answers,
        new requests get the same 503."""
        while True:
            await asyncio.sleep(WATCH_INTERVAL_S)
            if not self.queues and not self.scheduler_stuck:
                continue
            why = await self.probe.stalled()
            if not why:
                continue
            if not self.scheduler_stuck:
                self.log.error(
                    "the scheduler does not answer; failing the requests in flight",
                    reason=why,
                    in_flight=len(self.queues),
                )
                for rid in list(self.queues):
                    self._end_with(rid, APIError(f"{why}; the request was ended", 503))
                    self.to_scheduler.send(codec.encoder.encode(AbortReq(rid)))  # queued: it may come back
            self.scheduler_stuck = why  # until its next answer (`_recv_loop`)

    async def _recv_loop(self) -> None:
        while True:
            raw = await self.inbox.recv()
            t0 = time.perf_counter() if self.trace is not None else 0.0
            try:
                msg = codec.to_tokenizer.decode(raw)
            except msgspec.MsgspecError as e:
                self.log.error("bad message on tokenizer inbox", error=str(e))
                continue
            if isinstance(msg, BatchStrOut):
                self._text(msg)
                if self.trace is not None:
                    self.trace.batch(msg, t0, self.queues)
            elif isinstance(msg, ReqError):
                self._error(msg)
            elif isinstance(msg, DeliveredQuery):
                got = [self.receipts.get(rid) for rid in msg.rids]
                await self.to_scheduler.send(
                    codec.encoder.encode(
                        DeliveredChars(msg.rids, [-1 if r is None or r.ended else r.chars for r in got])
                    )
                )
            elif isinstance(msg, DetokStatus):
                self.detok_status = msg
            elif isinstance(msg, SchedulerStats):
                self.stats = msg
            elif isinstance(msg, ResolvedSettings):
                self.resolved = msg.values
            elif isinstance(msg, ServerReady):
                self.ready = True
            elif isinstance(msg, HealthAnswer):
                self.probe.answered(msg.seq)
                if self.scheduler_stuck:
                    self.log.info("the scheduler answers again")
                    self.scheduler_stuck = ""
            elif isinstance(msg, CacheFlushed):
                if (flushed := self._flushes.pop(msg.seq, None)) is not None and not flushed.done():
                    flushed.set_result(msg)
            elif isinstance(msg, WorkerStatus):
                self.worker_down = "" if msg.ready else msg.reason or "the worker is restarting"
            elif isinstance(msg, TokenizerShutdown):
                self.shutdown_reason = msg.reason or "server is shutting down"
                self.fail_all(self.shutdown_reason)
            elif isinstance(msg, TokenizerDrain) and self._drain_task is None:
                self._drain_task = asyncio.get_running_loop().create_task(self._drain())

    def _error(self, msg: ReqError) -> None:
        """Fail request `msg.rid` (if it is still here) with the scheduler's error: a
        `FieldError` carrying its field, which the route names (`choices.merged`)."""
        self._end_with(msg.rid, FieldError(msg.message, msg.status, msg.field))

    def _end_with(self, rid: str, error: APIError) -> None:
        """End request `rid` (if it is still here) with `error`: later text for it is dropped."""
        q = self.queues.get(rid)
        if q is not None:
            q.put_nowait(error)
            self.receipts[rid].ended = True

    def _text(self, msg: BatchStrOut) -> None:
        """Pass each row's new text and logprob entries to its request's queue (see `Receipt`)."""
        for i, rid in enumerate(msg.rids):
            q, receipt = self.queues.get(rid), self.receipts.get(rid)
            if q is None or receipt is None or receipt.ended:
                continue
            reason = msg.finish_reasons[i]
            offset = msg.text_offsets[i] if i < len(msg.text_offsets) else receipt.chars
            try:
                text = receipt.accept(msg.text_deltas[i], offset, msg.completion_tokens[i], reason is not None)
                entries = receipt.accept_entries(msg.logprobs[i] if i < len(msg.logprobs) else None)
            except TextGap as e:
                receipt.ended = True
                self.log.error("detokenizer output lost", rid=rid, error=str(e))
                q.put_nowait(APIError(f"internal error: part of the output was lost ({e})", 500))
                continue
            prompt = receipt.accept_prompt_entries(msg.prompt_logprobs[i] if i < len(msg.prompt_logprobs) else None)
            timing = msg.timings[i] if i < len(msg.timings) else None
            if text is None and entries is None and prompt is None and timing is None:
                continue
            matched = msg.matched_stop[i] if i < len(msg.matched_stop) else None
            cached = msg.cached_tokens[i] if i < len(msg.cached_tokens) else 0
            q.put_nowait(Delta(text or "", receipt.completion_tokens, reason, matched, cached, entries, prompt, timing))

    async def _drain(self) -> None:
        """Refuse new requests, wait until none is in flight (also none accepted whose stream
        has not started: `held`), then tell launch (`Drained`)."""
        self.stopping = True
        self.log.info("draining: refusing new requests", in_flight=self.in_flight)
        while self.in_flight:
            await asyncio.sleep(DRAIN_POLL_S)
        sock = self.ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.connect(endpoints.control(self.run_dir))
        await sock.send(codec.encoder.encode(Drained(Role.TOKENIZER)))
        sock.close()
        self.log.info("drained: no request in flight")

    def check_can_start(self, rid: str, client_rid: str | None = None, accepted: bool = False) -> None:
        """Raises `APIError` (503 while shutting down or while the scheduler is stuck, 400 for a
        request id in use) when a request `rid` (or the id its client chose, `client_rid`) could
        not start now; streamed routes call it before answering 200. accepted: the request was
        accepted before (its `Hold`): a drain lets it start, as it lets requests in flight
        finish; only `fail_all` refuses it."""
        if self.failed or (self.stopping and not accepted):
            raise APIError("server is shutting down", 503)
        if self.scheduler_stuck:
            raise APIError(self.scheduler_stuck, 503)
        for used in (rid, client_rid):
            if used in self.queues or used in self.client_rids:
                raise APIError(f"request id {used!r} is already in use", 400, "rid")

    def release_client_rids(self, ids: Iterable[str | None]) -> None:
        """Let go of client-chosen ids (None entries skipped) and wake `wait_rids_free`."""
        for i in ids:
            self.client_rids.discard(i)
            self.client_gone.pop(i, None)
        self._rids_freed.set()
        self._rids_freed = asyncio.Event()

    async def wait_rids_free(self, ids: Iterable[str | None], grace_s: float = RID_REUSE_GRACE_S) -> None:
        """Wait while the client-chosen `ids` (None entries skipped) still held are all held
        by requests whose clients have left (`client_gone`), up to `grace_s` seconds; returns
        at once when none is held or one is held by a request whose client is still there
        (`check_can_start` then refuses it as in use). A client may reuse an id at once after
        leaving a stream: its old request ends when this process has acted on the disconnect,
        a few event-loop turns (or one decode step) after it was seen."""
        wanted = {i for i in ids if i is not None}
        deadline = asyncio.get_running_loop().time() + grace_s
        while held := wanted & self.client_rids:
            for i in held:
                gone = self.client_gone.get(i)
                if gone is None or not await gone():
                    return
            freed = self._rids_freed
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            try:
                await asyncio.wait_for(freed.wait(), left)
            except asyncio.TimeoutError:
                return

    @property
    def in_flight(self) -> int:
        """Choices this process has accepted and not yet seen end (running or waiting),
        counting those accepted whose stream has not started (`held`)."""
        return len(self.queues) + self.held

    def hold(self, n: int, client_rids: tuple[str, ...] = (), gone: ClientGone | None = None) -> Hold:
        """Claim room for `n` choices just accepted by `check_room` and the ids their client
        chose (`client_rids`; gone: whether that client has left) until each starts or the
        request lets them go (see `Hold`)."""
        return Hold(self, n, client_rids, gone)

    def check_room(self, n: int) -> None:
        """Raises `APIError` when a request of `n` choices would leave more than `max_queued`
        choices waiting, counting as waiting those in flight beyond `max_running` (the
        tokenizer does not see admission): a 429 with ``Retry-After``, or a 400 when `n`
        alone is more than running and waiting together may hold."""
        if self.max_queued is None:
            return
        if n > self.max_running + self.max_queued:
            raise APIError(
                f"{n} choices in one request (n, times the prompts of a list) can never be admitted: at "
                f"most {self.max_running} run and "
                f"{self.max_queued} wait (--max-running-requests, --max-queued-requests)",
                400,
                "n",
            )
        if self.in_flight + n - self.max_running > self.max_queued:
            waiting = max(0, self.in_flight - self.max_running)
            raise APIError(
                f"the server is busy: {waiting} waiting (queued requests), and {n} more would pass the limit "
                f"of {self.max_queued} (--max-queued-requests); retry later",
                429,
                type_="rate_limit_error",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )

    async def generate(
        self, req: GenerateReq, client_rid: str | None = None, hold: Hold | None = None
    ) -> AsyncIterator[Delta]:
        """Send `req` and yield its deltas until it finishes. client_rid: the id its client
        chose (native ``rid``), held as in use while `req` runs; `req.rid` itself is fresh
        (see `request.builder.Built.client_rid`).

        Raises `APIError` when the server reports an error for it or is shutting down.
        Leaving the iteration early (disconnect) aborts the request in the scheduler, which
        alone decides every finish (a request for no tokens too, after its checks). Its end
        is logged and counted (`RequestLog`), whichever way it ends. hold: what the checks
        that accepted it claimed (`Hold`), which it takes over as it starts.
        """
        if hold is not None:
            hold.take(client_rid)
        self.check_can_start(req.rid, client_rid, accepted=hold is not None)
        rec = self.requests.start(req)
        q: asyncio.Queue = asyncio.Queue()
        self.queues[req.rid] = q
        self.receipts[req.rid] = Receipt()
        if client_rid is not None:
            self.client_rids.add(client_rid)
        finished = False
        reason: FinishReason | None = None
        error: APIError | None = None
        try:
            await self.to_scheduler.send(codec.encoder.encode(req))
            while True:
                item = await q.get()
                if isinstance(item, APIError):
                    finished, error = True, item
                    raise item
                self.requests.delta(rec, item.completion_tokens, item.text, item.cached_tokens, item.timing)
                if item.finish_reason is not None:
                    finished, reason = True, item.finish_reason
                yield item
                if self.trace is not None:
                    self.trace.written(req.rid, item.completion_tokens)
                if finished:
                    return
        finally:
            self.queues.pop(req.rid, None)
            self.receipts.pop(req.rid, None)
            self.release_client_rids((client_rid,))
            if not finished:
                self.to_scheduler.send(codec.encoder.encode(AbortReq(req.rid)))
            self.to_scheduler.send(codec.encoder.encode(StreamsClosed([req.rid])))
            self.requests.end(rec, reason, error)

    def fail_all(self, message: str, status: int = 503) -> None:
        """Answer every request still waiting with an error (shutdown); new ones are refused,
        and a drain under way ends (launch no longer waits for it)."""
        self.stopping = self.failed = True
        if self._drain_task is not None:
            self._drain_task.cancel()
        for q in self.queues.values():
            q.put_nowait(APIError(message, status))

    def close(self) -> None:
        """Stop receiving and close the sockets."""
        for task in (self._task, self._drain_task, self._watch_task):
            if task is not None:
                task.cancel()
        self.ctx.destroy(linger=0)
