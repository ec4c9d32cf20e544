"""Optional per-step timestamps taken in the scheduler, for `bench/step_profile.py`.

Enabled by ``LAZYSERVE_TRACE_DIR`` (`protocol.trace`): one JSON line per loop iteration that
applied a launch's result, with `time.perf_counter()` seconds: ``start`` (the iteration
began), ``finalizing`` (the Finalize's send returned: the scheduler now waits), ``result_recv`` / ``result_decoded`` (the
LaunchResult was read / decoded), ``end`` (it was applied: finish checks, token batches
to the detokenizers, frees); the seconds spent encoding and sending messages to the worker
(``enc_worker``, ``send_worker``) and to detokenizers (``enc_detok``, ``send_detok``) within
the iteration; ``sent``: launch id -> when the send of its Launch/ChainDecode started;
``fin_sent`` likewise for the Finalize; ``detok``: [replica, `batch_key`, send started,
rows] of each token batch sent. Keyed by ``id``, the launch whose result was applied.
"""

from __future__ import annotations

import time

from protocol import codec
from protocol.enums import mode_name
from protocol.messages import BatchTokenOut, ChainDecode, Finalize, Launch, ToDetokenizer, ToWorker
from protocol.trace import batch_key, open_trace, write_record
from scheduler_proc.outbox import SocketOutbox


class SchedulerTrace:
    """Collects one loop iteration's timestamps and writes them when it ends."""

    def __init__(self, file) -> None:
        self.file = file
        self.step: dict = {}

    @classmethod
    def from_env(cls) -> SchedulerTrace | None:
        """A trace in ``$LAZYSERVE_TRACE_DIR``, or None when it is unset."""
        file = open_trace("scheduler")
        return cls(file) if file else None

    def begin(self) -> None:
        """A loop iteration starts."""
        self.step = {"start": time.perf_counter()}

    def mark(self, name: str) -> None:
        """Record the time of event `name` in this iteration."""
        self.step[name] = time.perf_counter()

    def worker_message(self, msg: ToWorker, t0: float, t1: float, t2: float) -> None:
        """A message to the worker: encoding started at t0, sending at t1, returned at t2 (s)."""
        self.step["enc_worker"] = self.step.get("enc_worker", 0.0) + t1 - t0
        self.step["send_worker"] = self.step.get("send_worker", 0.0) + t2 - t1
        if isinstance(msg, (Launch, ChainDecode)):
            self.step.setdefault("sent", {})[msg.launch_id] = t1
        elif isinstance(msg, Finalize):
            self.step["fin_sent"] = t1

    def detok_message(self, index: int, msg: ToDetokenizer, t0: float, t1: float, t2: float) -> None:
        """A message to detokenizer replica `index`, timed as in `worker_message`."""
        self.step["enc_detok"] = self.step.get("enc_detok", 0.0) + t1 - t0
        self.step["send_detok"] = self.step.get("send_detok", 0.0) + t2 - t1
        if isinstance(msg, BatchTokenOut):
            self.step.setdefault("detok", []).append(
                [index, batch_key(msg.rids, msg.completion_tokens), t1, len(msg.rids)]
            )

    def end(self, launch_id: int, mode: int, rows: int, chained: bool) -> None:
        """The result of `launch_id` (`mode`, `rows` rows) was applied; `chained`: the next
        decode was chained before it. Writes the iteration's record."""
        write_record(
            self.file,
            id=launch_id,
            mode=mode_name(mode),
            rows=rows,
            chained=chained,
            end=time.perf_counter(),
            **self.step,
        )
        self.step = {}


class TracedOutbox(SocketOutbox):
    """`SocketOutbox` that times the encoding and sending of worker and detokenizer messages."""

    def __init__(self, ctx, args, trace: SchedulerTrace) -> None:
        super().__init__(ctx, args)
        self.trace = trace

    def to_worker(self, msg: ToWorker) -> None:
        t0 = time.perf_counter()
        raw = codec.encoder.encode(msg)
        t1 = time.perf_counter()
        self.worker.send(raw)
        self.trace.worker_message(msg, t0, t1, time.perf_counter())

    def to_detokenizer(self, index: int, msg: ToDetokenizer) -> None:
        t0 = time.perf_counter()
        raw = codec.encoder.encode(msg)
        t1 = time.perf_counter()
        self.detoks[index].send(raw)
        self.trace.detok_message(index, msg, t0, t1, time.perf_counter())
