"""The scheduler process: sockets around `Scheduler`, the plain launch-then-finalize loop.

Worker recovery: when launch reports the worker dead (`WorkerExited`), the requests on the
device fail with a 503, the link to the worker is replaced (nothing queued for the dead
worker reaches the next), the tokenizer hears `WorkerStatus(False)` (/health 503), and the
loop launches nothing until a `WorkerReady` of a later generation arrives; then the KV
accounting starts afresh from it (empty prefix cache) and the waiting requests run. Anything
else on the results socket meanwhile, and any result of another generation, is dropped.
"""

from __future__ import annotations

import importlib
import threading
import time

import msgspec
import zmq

from protocol import codec, endpoints
from protocol.config import ServerArgs
from protocol.enums import Role
from protocol.messages import (
    AbortReq,
    CacheFlushed,
    Finalize,
    FlushCache,
    GenerateReq,
    HealthAnswer,
    HealthProbe,
    LaunchResult,
    ResolvedSettings,
    SchedulerShutdown,
    WorkerExited,
    WorkerReady,
    WorkerShutdown,
    WorkerStatus,
)
from protocol.process import Handshake, configure_logging, exit_now, install_stop_handlers, start_child
from protocol.sockets import bind_pull
from scheduler_proc.deadlines import Deadlines
from scheduler_proc.grammar import GrammarBackend
from scheduler_proc.mem.kv_memory import KVMemory
from scheduler_proc.outbox import SocketOutbox
from scheduler_proc.replicas.control import REPLICA_MESSAGES, ReplicaControl
from scheduler_proc.schedule_batch import ScheduleBatch
from scheduler_proc.scheduler import Scheduler
from scheduler_proc.spec.speculator import Speculator
from scheduler_proc.step_trace import SchedulerTrace, TracedOutbox

POLL_MS = 100
HELD_POLL_MS = 2
"""The idle wait while requests are held (a grammar compiling off the loop)."""
STATS_EVERY_S = 1.0


def prefill_chunk(chunked_prefill_size: int, ready: WorkerReady) -> int:
    """The chunk the scheduler prefills in (tokens per launch): ``--chunked-prefill-size``,
    at most one model call of the worker's prefills (`WorkerReady.prefill_call_tokens`), so
    that a launch is one call and a request cancelled after its launch costs the others at
    most that call (the worker cannot stop a launch it has queued on the device). 0 (chunking
    off, prompts whole) stays 0."""
    if chunked_prefill_size <= 0 or ready.prefill_call_tokens <= 0:
        return chunked_prefill_size
    return min(chunked_prefill_size, ready.prefill_call_tokens)


def resolved_settings(ready: WorkerReady, chunk: int) -> ResolvedSettings:
    """The settings `ready` reports and the prefill `chunk` (`prefill_chunk`), for the HTTP
    process's ``/get_server_info``."""
    return ResolvedSettings(
        {
            "max_total_tokens": ready.max_total_tokens,
            "context_length": ready.context_length,
            "decode_graph_max_bs": ready.graph_max_batch,
            "chunked_prefill_size": chunk,
            "prefill_call_tokens": ready.prefill_call_tokens,
        }
    )


class SchedulerProcess:
    """Owns the sockets and runs the loop until a stop signal (`install_stop_handlers`) or a
    `SchedulerShutdown`."""

    def __init__(self, args: ServerArgs, log) -> None:
        self.args, self.log = args, log
        self.ctx = zmq.Context()
        self.inbox = bind_pull(self.ctx, endpoints.scheduler(args.run_dir))
        self.results = bind_pull(self.ctx, endpoints.worker_results(args.run_dir))
        self.outbox, self.trace = _outbox(self.ctx, args)
        threading.Thread(target=importlib.import_module, args=("xgrammar",), daemon=True).start()  # ~3 s, while the
        ready = self._wait_worker_ready()  # worker loads; a first grammar request then compiles at once
        memory = self._memory(ready)
        chunk = prefill_chunk(args.chunked_prefill_size, ready)
        if chunk != args.chunked_prefill_size:
            log.info(
                "prefill chunks of one model call",
                chunked_prefill_size=chunk,
                asked=args.chunked_prefill_size,
                why="a cancelled prompt then costs the others at most one model call",
            )
        self.outbox.to_tokenizer(resolved_settings(ready, chunk))
        self.sched = Scheduler(
            self.outbox,
            max_running_requests=args.max_running_requests,
            max_prefill_tokens=args.max_prefill_tokens,
            detokenizers=args.detokenizers,
            chunked_prefill_size=chunk,
            enable_mixed_chunk=args.enable_mixed_chunk,
            memory=memory,
            grammar=GrammarBackend(args.run_dir, ready.vocab_size),
            logit_processors=frozenset(ready.logit_processors),
            vocab_size=ready.vocab_size,
            state_interval=args.state_interval if ready.state_slots else 0,
            speculator=Speculator(args.speculative_num_draft_tokens) if args.speculative_algorithm else None,
            deadlines=Deadlines(args.queue_timeout, args.stall_timeout),
            log=log,
        )
        self.sched.detok.log, self.sched.detok.wait_s = log, args.detokenizer_wait_s
        if args.speculative_algorithm:
            log.info(
                "speculative decoding",
                algorithm=args.speculative_algorithm,
                draft_tokens=args.speculative_num_draft_tokens,
                policy="draft caps chosen per batch size by measured tokens/s (debug: 'speculation cap')",
            )
        self.replicas = ReplicaControl(self.ctx, args.run_dir, self.sched.detok, log)
        self.overlap = not args.disable_overlap_schedule
        self.stopping = False
        self.generation = ready.generation  # of the worker that serves
        self.awaited_generation: int | None = None  # while recovering: the least generation accepted

    def _memory(self, ready: WorkerReady) -> KVMemory:
        """Fresh KV accounting for the pool that `ready` reports (logged). A model with
        recurrent or sliding-window layers needs the worker's state snapshots for a prefix
        cache."""
        snapshot_layers = ready.recurrent_layers + ready.window_layers
        stateless = snapshot_layers and not ready.state_slots
        radix = not self.args.disable_radix_cache and not stateless
        self.log.info(
            "KV memory",
            slots=ready.max_total_tokens,
            bytes=ready.max_total_tokens * ready.bytes_per_token,
            radix_cache=radix,
            state_slots=ready.state_slots,
            worker_generation=ready.generation,
            **(
                {
                    "radix_cache_off": f"{ready.recurrent_layers} recurrent and {ready.window_layers} sliding-window "
                    "layers and no state snapshot slots"
                }
                if stateless and not self.args.disable_radix_cache
                else {}
            ),
        )
        return KVMemory(
            ready.max_total_tokens,
            self.args.max_running_requests + 1,
            ready.context_length,
            radix=radix,
            state_slots=ready.state_slots if radix else 0,
            end_snapshots=self.args.enable_mamba_extra_buffer,
        )

    @property
    def recovering(self) -> bool:
        """True from a `WorkerExited` until the next worker's `WorkerReady`."""
        return self.awaited_generation is not None

    def _worker_exited(self, msg: WorkerExited) -> None:
        """The worker died: fail what was on it and wait for the next generation."""
        if msg.generation < self.generation:
            return  # a worker already replaced
        self.awaited_generation = max(self.awaited_generation or 0, msg.generation + 1)
        if msg.generation > self.generation:
            return  # the replacement died while loading: nothing ran on it
        failed = self.sched.worker_lost(
            f"the worker {msg.reason} while running this request; the server is restarting it: retry shortly"
        )
        self.outbox.reset_worker()
        self.outbox.to_tokenizer(WorkerStatus(False, f"the worker {msg.reason}; it is restarting"))
        self.log.error(
            "worker died; failed the requests on it, waiting for its replacement",
            pid=msg.pid,
            exit=msg.reason,
            generation=msg.generation,
            failed=failed,
            waiting=len(self.sched.waiting),
        )

    def _await_worker(self, timeout_ms: int) -> None:
        """While recovering: take the next worker's `WorkerReady` (dropping anything else on
        the results socket) and resume with fresh KV accounting."""
        if not self.results.poll(timeout_ms):
            return
        msg = self._decode_result(self.results.recv())
        if isinstance(msg, WorkerReady) and msg.generation >= self.awaited_generation:
            self._worker_ready(msg)

    def _worker_ready(self, msg: WorkerReady) -> None:
        self.generation, self.awaited_generation = msg.generation, None
        self.sched.worker_ready(self._memory(msg))
        self.sched.chunked_prefill_size = prefill_chunk(self.args.chunked_prefill_size, msg)
        self.outbox.to_tokenizer(resolved_settings(msg, self.sched.chunked_prefill_size))
        self.outbox.to_tokenizer(WorkerStatus(True))
        self.log.info("worker replaced; serving again", generation=msg.generation, waiting=len(self.sched.waiting))

    def _decode_result(self, raw: bytes):
        """A FromWorker message, or None (logged) when malformed."""
        try:
            return codec.from_worker.decode(raw)
        except msgspec.MsgspecError as e:
            self.log.error("bad message on scheduler results socket", error=str(e), bytes=len(raw))
            return None

    def _wait_worker_ready(self) -> WorkerReady:
        """Block until the worker reports its KV pool (it loads the model meanwhile)."""
        while True:
            msg = self._decode_result(self.results.recv())
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
        elif isinstance(msg, WorkerExited):
            self._worker_exited(msg)
        elif isinstance(msg, HealthProbe):  # answered here, in the loop: the answer shows that the loop turns
            self.outbox.to_tokenizer(HealthAnswer(msg.seq))
        elif isinstance(msg, FlushCache):
            freed, held = self.sched.mem.flush()
            self.log.info("prefix cache flushed", freed_tokens=freed, held_tokens=held)
            self.outbox.to_tokenizer(CacheFlushed(msg.seq, freed, held))
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
        """The result of `launch_id`, or None when asked to stop, or the worker died, while
        waiting. Meanwhile (a long launch, or a worker that stopped) the inbox is read whenever
        no result came for `POLL_MS`: new requests and aborts are taken in, deadlines enforced,
        and a worker silent for longer than ``--stall-timeout`` is logged once. Results of
        another worker generation, frames that are not messages and other launches' results are
        dropped with a logged error. Such a silent worker also turns /health 503 (the
        tokenizer hears `WorkerStatus(False)`) until its next message, when it turns 200 again."""
        since, told = time.monotonic(), False
        while True:
            while not self.results.poll(POLL_MS):
                self._drain(0)
                if self.stopping or self.recovering:
                    return None
                self.sched.expire()
                waited = time.monotonic() - since
                if not told and self.args.stall_timeout and waited > self.args.stall_timeout:
                    told = True
                    self.log.warning(
                        "no result from the worker",
                        launch_id=launch_id,
                        waited_s=round(waited, 1),
                        running=len(self.sched.running),
                        waiting=len(self.sched.waiting),
                    )
                    self.outbox.to_tokenizer(
                        WorkerStatus(False, f"the worker has sent no result for {waited:.0f} s (stopped or stuck)")
                    )
            if told:
                told = False
                self.outbox.to_tokenizer(WorkerStatus(True))
                self.log.info(
                    "the worker answers again", launch_id=launch_id, waited_s=round(time.monotonic() - since, 1)
                )
            raw = self.results.recv()
            if self.trace is not None:
                self.trace.mark("result_recv")
            msg = self._decode_result(raw)
            if self.trace is not None:
                self.trace.mark("result_decoded")
            if msg is None:
                continue
            if isinstance(msg, WorkerReady) and msg.generation > self.generation:  # before launch's WorkerExited
                self._worker_exited(WorkerExited(0, self.generation, "was replaced"))
                self._worker_ready(msg)
                return None
            if isinstance(msg, LaunchResult) and msg.generation != self.generation:
                self.log.warning(
                    "dropped a result of another worker generation",
                    launch_id=msg.launch_id,
                    generation=msg.generation,
                    serving=self.generation,
                )
                continue
            if isinstance(msg, LaunchResult) and msg.launch_id == launch_id:
                return msg
            self.log.error(
                "dropped an unexpected message while waiting for a launch's result",
                launch_id=launch_id,
                msg=repr(msg)[:200],
            )

    def _check_idle(self) -> None:
        """Conservation check while idle: free + cached + held = all slots (logged if not)."""
        try:
            self.sched.mem.check()
        except AssertionError as e:
            self.log.error("KV accounting is off", error=str(e))

    def close(self) -> None:
        """Close every socket once `run` returned: the shutdowns queued for the worker and the
        replicas are delivered for up to 1 s; the inboxes and replica control hold nothing to
        deliver."""
        self.outbox.close(linger_ms=1000)
        self.ctx.destroy(linger=0)

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
            self.sched.expire()
            if self.recovering:
                inflight = None  # it died with the worker
                self._await_worker(POLL_MS)
                continue
            if inflight is None:
                started = self.sched.next_launch()
                if started is None:
                    self._check_idle()
                    self._drain(HELD_POLL_MS if self.sched.held else POLL_MS)
                    continue
                inflight, launch = started
                self.outbox.to_worker(launch)
            following = None
            if self.overlap and self.sched.can_chain(inflight):
                following, chain = self.sched.chain(inflight)
                self.outbox.to_worker(chain)
            self.outbox.to_worker(Finalize(inflight.launch_id))
            if self.trace is not None:
                self.trace.mark("finalizing")
            result = self._wait_result(inflight.launch_id)
            if result is None:
                continue  # stopping, or the worker died (its batches with it)
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
    install_stop_handlers(lambda: setattr(proc, "stopping", True), log)
    hs.ready(f"max_running_requests={args.max_running_requests}")
    proc.run()
    proc.close()
    hs.close()
    log.info("scheduler stopped")
    exit_now(0)
