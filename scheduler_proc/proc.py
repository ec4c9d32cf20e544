"""The scheduler process: sockets around `Scheduler`, the plain launch-then-finalize loop."""

from __future__ import annotations

import importlib
import signal
import threading
import time

import msgspec
import zmq

from protocol import codec, endpoints
from protocol.config import ServerArgs
from protocol.enums import Role
from protocol.messages import (
    AbortReq,
    Finalize,
    GenerateReq,
    LaunchResult,
    SchedulerShutdown,
    ToDetokenizer,
    ToTokenizer,
    ToWorker,
    WorkerReady,
    WorkerShutdown,
)
from protocol.process import Handshake, configure_logging, start_child
from protocol.sockets import bind_pull
from scheduler_proc.grammar import GrammarBackend
from scheduler_proc.mem.kv_memory import KVMemory
from scheduler_proc.replica_control import REPLICA_MESSAGES, ReplicaControl
from scheduler_proc.schedule_batch import ScheduleBatch
from scheduler_proc.scheduler import Scheduler

POLL_MS = 100
HELD_POLL_MS = 2
"""The idle wait while requests are held (a grammar compiling off the loop)."""
STATS_EVERY_S = 1.0


class SocketOutbox:
    """`Outbox` over ZeroMQ PUSH sockets."""

    def __init__(self, ctx: zmq.Context, args: ServerArgs) -> None:
        self.worker = ctx.socket(zmq.PUSH)
        self.worker.connect(endpoints.worker(args.run_dir))
        self.tokenizer = ctx.socket(zmq.PUSH)
        self.tokenizer.connect(endpoints.tokenizer(args.run_dir))
        self.ctx = ctx
        self.detoks: dict[int, zmq.Socket] = {}
        for i in range(args.detokenizers):
            self.connect_detokenizer(i, endpoints.detokenizer(args.run_dir, i))

    def to_worker(self, msg: ToWorker) -> None:
        self.worker.send(codec.encoder.encode(msg))

    def to_detokenizer(self, index: int, msg: ToDetokenizer) -> None:
        self.detoks[index].send(codec.encoder.encode(msg))

    def connect_detokenizer(self, index: int, endpoint: str) -> None:
        """A link with no queue limit: a replica that died queues messages until it is
        declared lost instead of blocking the scheduler."""
        self.disconnect_detokenizer(index)
        sock = self.ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.connect(endpoint)
        self.detoks[index] = sock

    def disconnect_detokenizer(self, index: int, flush: bool = False) -> None:
        sock = self.detoks.pop(index, None)
        if sock is not None:
            sock.close(linger=1000 if flush else 0)

    def to_tokenizer(self, msg: ToTokenizer) -> None:
        self.tokenizer.send(codec.encoder.encode(msg))


class SchedulerProcess:
    """Owns the sockets and runs the loop until SIGTERM or a `SchedulerShutdown`."""

    def __init__(self, args: ServerArgs, log) -> None:
        self.args, self.log = args, log
        self.ctx = zmq.Context()
        self.inbox = bind_pull(self.ctx, endpoints.scheduler(args.run_dir))
        self.results = bind_pull(self.ctx, endpoints.worker_results(args.run_dir))
        self.outbox, self.trace = _outbox(self.ctx, args)
        threading.Thread(target=importlib.import_module, args=("xgrammar",), daemon=True).start()  # ~3 s, while the
        ready = self._wait_worker_ready()  # worker loads; a first grammar request then compiles at once
        memory = KVMemory(ready.max_total_tokens, args.max_running_requests + 1, ready.context_length,
                          radix=not args.disable_radix_cache)
        log.info("KV memory", slots=ready.max_total_tokens, bytes=ready.max_total_tokens * ready.bytes_per_token,
                 radix_cache=not args.disable_radix_cache)
        self.sched = Scheduler(
            self.outbox,
            max_running_requests=args.max_running_requests,
            max_prefill_tokens=args.max_prefill_tokens,
            detokenizers=args.detokenizers,
            chunked_prefill_size=args.chunked_prefill_size,
            enable_mixed_chunk=args.enable_mixed_chunk,
            memory=memory,
            grammar=GrammarBackend(args.run_dir, ready.vocab_size),
            logit_processors=frozenset(ready.logit_processors),
        )
        self.sched.detok.log, self.sched.detok.wait_s = log, args.detokenizer_wait_s
        self.replicas = ReplicaControl(self.ctx, args.run_dir, self.sched.detok, log)
        self.overlap = not args.disable_overlap_schedule
        self.stopping = False

    def _result_msg(self, raw: bytes) -> object | None:
        """`raw` from the results socket decoded, or None (logged) when it is not a message."""
        try:
            return codec.from_worker.decode(raw)
        except msgspec.MsgspecError as e:
            self.log.error("bad message on scheduler results socket", error=str(e), bytes=len(raw))
            return None

    def _wait_worker_ready(self) -> WorkerReady:
        """Block until the worker reports its KV pool (it loads the model meanwhile)."""
        while True:
            msg = self._result_msg(self.results.recv())
            if isinstance(msg, WorkerReady):
                return msg
            if msg is not None:
                self.log.error("unexpected message before WorkerReady", msg=repr(msg)[:200])

    def _handle(self, raw: bytes) -> None:
        try:
            msg = codec.to_scheduler.decode(raw)
        except msgspec.MsgspecError as e:
            self.log.error("bad message on scheduler inbox", error=str(e))
            return
        if isinstance(msg, GenerateReq):
            self.sched.add_request(msg)
        elif isinstance(msg, AbortReq):
            self.sched.abort(msg)
        elif isinstance(msg, REPLICA_MESSAGES):
            for rid in self.replicas.handle(msg):
                self.sched.abort(AbortReq(rid))
        elif isinstance(msg, SchedulerShutdown):
            self.stopping = True

    def _drain(self, timeout_ms: int) -> None:
        if self.inbox.poll(timeout_ms):
            while True:
                try:
                    self._handle(self.inbox.recv(zmq.NOBLOCK))
                except zmq.Again:
                    break
        self.replicas.drain()
        for rid in self.sched.detok.tick():  # requests that waited too long for a detokenizer
            self.sched.abort(AbortReq(rid))

    def _wait_result(self, launch_id: int) -> LaunchResult | None:
        """The result of `launch_id`, or None when asked to stop while waiting. Anything else
        on the results socket (a frame that is not a message, another launch's result) is
        dropped with a logged error."""
        while True:
            while not self.results.poll(POLL_MS):
                if self.stopping:
                    return None
            raw = self.results.recv()
            if self.trace is not None:
                self.trace.mark("result_recv")
            msg = self._result_msg(raw)
            if self.trace is not None:
                self.trace.mark("result_decoded")
            if isinstance(msg, LaunchResult) and msg.launch_id == launch_id:
                return msg
            if msg is not None:
                self.log.error("dropped an unexpected message while waiting for a launch's result",
                               launch_id=launch_id, msg=repr(msg)[:200])

    def _check_idle(self) -> None:
        """Conservation check while idle: free + cached + held = all slots (logged if not)."""
        try:
            self.sched.mem.check()
        except AssertionError as e:
            self.log.error("KV accounting is off", error=str(e))

    def run(self) -> None:
        """The loop. With overlap (default), while the batch is a pure decode the next decode
        is chained on the worker before the current one is finalized, so the device runs
        step N+1 while this process applies step N; otherwise launch, finalize, apply."""
        inflight: ScheduleBatch | None = None
        last_stats, stats_at = None, 0.0
        while not self.stopping:
            if self.trace is not None:
                self.trace.begin()
            if time.monotonic() - stats_at > STATS_EVERY_S:
                stats_at = time.monotonic()
                if (stats := self.sched.stats()) != last_stats:
                    self.outbox.to_tokenizer(stats)
                    last_stats = stats
            self._drain(0)
            if inflight is None:
                inflight = self.sched.next_batch()
                if inflight is None:
                    self._check_idle()
                    self._drain(HELD_POLL_MS if self.sched.held else POLL_MS)
                    continue
                self.outbox.to_worker(self.sched.launch(inflight))
            following = None
            if self.overlap and self.sched.can_chain(inflight):
                following, chain = self.sched.chain(inflight)
                self.outbox.to_worker(chain)
            self.outbox.to_worker(Finalize(inflight.launch_id))
            if self.trace is not None:
                self.trace.mark("finalizing")
            result = self._wait_result(inflight.launch_id)
            if result is None:
                break
            self.sched.process_result(inflight, result)
            if self.trace is not None:
                self.trace.end(inflight.launch_id, inflight.mode, len(inflight.reqs), following is not None)
            inflight = following
        self.sched.fail_all("server is shutting down")
        self.sched.detok.shutdown()
        self.outbox.to_worker(WorkerShutdown())


def _outbox(ctx: zmq.Context, args: ServerArgs):
    """(the outbox, the step trace): a timed outbox and its `SchedulerTrace` when
    ``LAZYSERVE_TRACE_DIR`` is set, else a plain `SocketOutbox` and None."""
    from scheduler_proc.step_trace import SchedulerTrace, TracedOutbox  # that module imports this one

    trace = SchedulerTrace.from_env()
    return (SocketOutbox(ctx, args), None) if trace is None else (TracedOutbox(ctx, args, trace), trace)


def main(run_dir: str) -> None:
    """Entry point: ``python -m scheduler_proc RUN_DIR``."""
    start_child("lazyserve::scheduler")
    args = ServerArgs.load(run_dir)
    log = configure_logging(args.log_level, args.log_format, proc="scheduler")
    ctx = zmq.Context.instance()
    hs = Handshake(ctx, run_dir, Role.SCHEDULER)
    try:
        proc = SchedulerProcess(args, log)
    except Exception as e:
        hs.failed(e)
        raise
    stop = lambda *_: setattr(proc, "stopping", True)  # noqa: E731
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    hs.ready(f"max_running_requests={args.max_running_requests}")
    hs.close()
    proc.run()
    log.info("scheduler stopped")
