"""`Scheduler`: continuous batching, finish checks and detokenizer routing, without sockets.

The process loop (`proc.py`) feeds it messages and launch results; it answers through an
`Outbox`. Policy: new requests are prefilled (EXTEND) as soon as they fit under
`max_running_requests` and the prefill token budget, then join the running DECODE batch,
whose row order always equals the worker's.
"""

from __future__ import annotations

from collections import deque

from protocol.enums import WORKER_FORWARD_MODES, FinishReason, ForwardMode, describe_modes
from protocol.messages import (
    AbortReq,
    BatchTokenOut,
    DetokAbort,
    DetokSeed,
    Finalize,
    GenerateReq,
    Launch,
    LaunchResult,
    ReqError,
    WorkerAbort,
)
from scheduler_proc.outbox import Outbox
from scheduler_proc.req import Req
from scheduler_proc.schedule_batch import ScheduleBatch


class Scheduler:
    """Holds waiting and running requests; decides each launch and every finish.

    max_running_requests: rows in the decode batch at most; max_prefill_tokens: prompt
    tokens one EXTEND launch takes at most (a longer single prompt still runs alone);
    detokenizers: number of replicas to route between.
    """

    def __init__(self, outbox: Outbox, *, max_running_requests: int, max_prefill_tokens: int, detokenizers: int) -> None:
        self.out = outbox
        self.max_running = max_running_requests
        self.max_prefill_tokens = max_prefill_tokens
        self.detok_load = [0] * detokenizers
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.reqs: dict[str, Req] = {}
        self.next_launch_id = 1
        self.finished_count = 0

    # ------------------------------------------------------------------ inputs
    def add_request(self, msg: GenerateReq) -> None:
        """Queue a new request; a duplicate rid is refused with a 400 to the tokenizer."""
        if msg.rid in self.reqs:
            self.out.to_tokenizer(ReqError(msg.rid, 400, f"request id {msg.rid!r} is already in use"))
            return
        req = Req.from_msg(msg)
        self.reqs[req.rid] = req
        if req.max_new_tokens <= 0 or not req.input_ids:
            self._route(req)
            self._finish(req, FinishReason.LENGTH, emit=[])
            return
        self.waiting.append(req)

    def abort(self, msg: AbortReq) -> None:
        """End a request early (idempotent; unknown rids are ignored).

        reason ABORT: the client left; STOP: the detokenizer matched a stop string (it has
        already sent the final text and forgotten the request).
        """
        req = self.reqs.get(msg.rid)
        if req is None or req.finished:
            return
        if req in self.waiting:
            self.waiting.remove(req)
            self._close(req, msg.reason)
            return
        if req in self.running:  # else its EXTEND is in flight; the worker drops it on this abort
            self.running.remove(req)
        self.out.to_worker(WorkerAbort([req.rid]))
        if msg.reason == FinishReason.ABORT:
            self.out.to_detokenizer(req.detokenizer, DetokAbort(req.rid))
        self._close(req, msg.reason)

    # ------------------------------------------------------------------ batches
    def next_batch(self) -> ScheduleBatch | None:
        """The next launch: an EXTEND of waiting requests if any fit, else a DECODE of the
        running ones, else None (IDLE: nothing is sent)."""
        room = self.max_running - len(self.running)
        if self.waiting and room > 0:
            reqs, budget = [], self.max_prefill_tokens
            while self.waiting and len(reqs) < room:
                n = len(self.waiting[0].input_ids)
                if reqs and n > budget:
                    break
                reqs.append(self.waiting.popleft())
                budget -= n
            for r in reqs:
                self._route(r)
            return ScheduleBatch(ForwardMode.EXTEND, reqs)
        if self.running:
            return ScheduleBatch(ForwardMode.DECODE, list(self.running))
        return None

    def launch(self, batch: ScheduleBatch) -> list:
        """Assign a launch id and return the messages that run it (Launch, then Finalize).

        Raises `ValueError` for a mode the worker does not support (checked before sending).
        """
        if batch.mode not in WORKER_FORWARD_MODES:
            raise ValueError(
                f"scheduler will not send forward mode {batch.mode.name}; worker supports: {describe_modes(WORKER_FORWARD_MODES)}"
            )
        batch.launch_id = self.next_launch_id
        self.next_launch_id += 1
        return [Launch(batch.launch_id, batch.mode, batch.to_forward_batch()), Finalize(batch.launch_id)]

    def process_result(self, batch: ScheduleBatch, result: LaunchResult) -> None:
        """Apply launch `batch`'s sampled tokens: finish checks, token routing, worker frees."""
        if result.error:
            self._fail_batch(batch, result.error)
            return
        if batch.mode == ForwardMode.EXTEND:
            self.running += [r for r in batch.reqs if not r.finished]
        per_replica: dict[int, list[tuple[Req, list[int]]]] = {}
        done: list[Req] = []
        for req, token in zip(batch.reqs, result.next_token_ids):
            if req.finished:  # aborted while its launch was in flight: the token is never shown
                continue
            req.check_finish(token)
            show = [] if req.matched_stop is not None else [token]
            per_replica.setdefault(req.detokenizer, []).append((req, show))
            if req.finished:
                done.append(req)
        for index, rows in per_replica.items():
            self.out.to_detokenizer(
                index,
                BatchTokenOut(
                    [r.rid for r, _ in rows],
                    [ids for _, ids in rows],
                    [len(r.output_ids) for r, _ in rows],
                    [r.finish_reason for r, _ in rows],
                    [r.matched_stop for r, _ in rows],
                ),
            )
        if done:
            gone = set(done)
            self.running = [r for r in self.running if r not in gone]
            self.out.to_worker(WorkerAbort([r.rid for r in done]))
            for r in done:
                self._close(r, r.finish_reason)

    def fail_all(self, message: str, status: int = 503) -> None:
        """Fail every request held (shutdown): errors to the tokenizer, state dropped."""
        for req in list(self.reqs.values()):  # waiting, running and those in flight
            self.out.to_tokenizer(ReqError(req.rid, status, message))
            if req.detokenizer >= 0:
                self.out.to_detokenizer(req.detokenizer, DetokAbort(req.rid))
            self._close(req, FinishReason.ABORT)
        self.waiting.clear()
        self.running.clear()

    # ------------------------------------------------------------------ helpers
    def _route(self, req: Req) -> None:
        """Choose the least-loaded detokenizer replica and seed it with the request."""
        index = min(range(len(self.detok_load)), key=self.detok_load.__getitem__)
        self.detok_load[index] += 1
        req.detokenizer = index
        self.out.to_detokenizer(index, DetokSeed(req.rid, req.msg.detok, len(req.input_ids)))

    def _finish(self, req: Req, reason: FinishReason, emit: list[int]) -> None:
        req.finish_reason = reason
        self.out.to_detokenizer(req.detokenizer, BatchTokenOut([req.rid], [emit], [len(req.output_ids)], [reason]))
        self._close(req, reason)

    def _close(self, req: Req, reason: FinishReason) -> None:
        req.finish_reason = reason
        if req.detokenizer >= 0:
            self.detok_load[req.detokenizer] -= 1
        self.reqs.pop(req.rid, None)
        self.finished_count += 1

    def _fail_batch(self, batch: ScheduleBatch, error: str) -> None:
        live = [r for r in batch.reqs if not r.finished]
        gone = set(live)
        self.running = [r for r in self.running if r not in gone]
        self.out.to_worker(WorkerAbort([r.rid for r in live]))
        for r in live:
            self.out.to_tokenizer(ReqError(r.rid, 500, f"model execution failed: {error}"))
            self.out.to_detokenizer(r.detokenizer, DetokAbort(r.rid))
            self._close(r, FinishReason.ABORT)
