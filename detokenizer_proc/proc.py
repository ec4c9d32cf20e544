"""A detokenizer replica process: token ids in, text deltas to the tokenizer out.

Life of a replica (DESIGN.md §7):
1. Start: launch's replicas (``RUN_DIR INDEX``) say Hello to launch; attached ones
   (``--attach RUN_DIR``) skip that. Both load the tokenizer and bind their inbox.
2. Register with the scheduler: Hello (with `PROTOCOL_VERSION`) on its control socket;
   the answer arrives on the inbox: `ReplicaWelcome(index)` (then it sends Ready and
   serves) or `ReplicaRefused(message)` (it exits 1 with that message).
3. Serve: render `BatchTokenOut`s, send a `ReplicaHeartbeat` every `HEARTBEAT_INTERVAL_S`.
4. Leave: for an attached one SIGTERM or SIGINT, for one of launch's its `STOP_SIGNAL` (a
   SIGTERM to it asks launch to stop the server: `install_stop_handlers`), and for either
   ``--detach``, drain it: it asks the scheduler to route
   nothing new to it (`DrainReplica`), keeps rendering what it holds and exits 0 on the
   scheduler's `DetokShutdown`. It also leaves when the scheduler stays silent for
   `DRAIN_IDLE_S` while draining, or when the server's run directory loses its
   `server_args.json` (the server stopped). As it exits it sends `ReplicaExited`.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import setproctitle
import zmq

from detokenizer_proc.manager import DetokenizerManager
from protocol import PROTOCOL_VERSION, codec, endpoints
from protocol.config import ServerArgs
from protocol.enums import Role
from protocol.messages import (
    BatchTokenOut,
    DetokAbort,
    DetokSeed,
    DetokShutdown,
    DrainReplica,
    Hello,
    Ready,
    ReplicaExited,
    ReplicaHeartbeat,
    ReplicaRefused,
    ReplicaWelcome,
)
from protocol.process import Handshake, configure_logging, install_stop_handlers, start_child
from protocol.sockets import bind_pull
from protocol.trace import batch_key, open_trace, write_record

POLL_MS = 100
HEARTBEAT_INTERVAL_S = 0.5
"""Seconds between heartbeats (the scheduler declares a replica lost after 5 s without)."""
ATTACH_TIMEOUT_S = 60.0
"""An attached replica that gets no answer to its Hello this long gives up."""
DRAIN_IDLE_S = 5.0
"""A draining replica that hears nothing from the scheduler this long leaves anyway."""
FLUSH_LINGER_MS = 5000


class ReplicaProcess:
    """The sockets and loop of one replica.

    run_dir: the server's run directory; index: launch's index, or None for an attached
    replica (the scheduler assigns one); manager: the text state; log: structlog logger.
    """

    def __init__(self, ctx: zmq.Context, run_dir: str, index: int | None, manager: DetokenizerManager, log) -> None:
        self.run_dir, self.index, self.manager, self.log = run_dir, index, manager, log
        self.pid = os.getpid()
        self.ctx = ctx
        ep = (
            endpoints.detokenizer(run_dir, index)
            if index is not None
            else endpoints.attached_detokenizer(run_dir, self.pid)
        )
        self.inbox = bind_pull(ctx, ep)
        self.inbox.setsockopt(zmq.LINGER, 0)
        self.to_tokenizer = self._push(endpoints.tokenizer(run_dir))
        self.to_scheduler = self._push(endpoints.scheduler(run_dir))
        self.control = self._push(endpoints.scheduler_control(run_dir))
        self.registered = False
        self.draining = False
        self.stop_requested = False
        self.server_gone = False  # its server_args.json vanished: nobody is left to send to
        self.refused: str | None = None
        self.trace = open_trace("detokenizer")
        """`protocol.trace` file: per token batch, its key, when it was read (``recv``), when
        the send of its text started (``sending``), when it was done (``done``), and the key of the text batch (None: no trace)."""

    def _push(self, endpoint: str) -> zmq.Socket:
        sock = self.ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, FLUSH_LINGER_MS)
        sock.connect(endpoint)
        return sock

    def _send(self, sock: zmq.Socket, msg) -> None:
        sock.send(codec.encoder.encode(msg))

    def run(self, on_ready: Callable[[int], None], attach_timeout_s: float | None = None) -> int:
        """Register, serve, and return the exit code: 0 when it left (shutdown, drain), 1
        when refused or unanswered. on_ready(index) runs once registered."""
        self._send(
            self.control, Hello(Role.DETOKENIZER, -1 if self.index is None else self.index, self.pid, PROTOCOL_VERSION)
        )
        started = last_beat = last_heard = time.monotonic()
        server_args = Path(self.run_dir) / endpoints.SERVER_ARGS_FILE
        while True:
            if self.inbox.poll(POLL_MS):
                last_heard = time.monotonic()
                while True:
                    try:
                        raw = self.inbox.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    code = self._handle(raw, on_ready)
                    if code is not None:
                        return code
                    last_beat = self._maybe_beat(last_beat)
            now = time.monotonic()
            if self.registered and now - last_beat >= HEARTBEAT_INTERVAL_S:
                last_beat = self._maybe_beat(last_beat)
                if not server_args.exists():
                    self.log.info("the server's run directory is gone; leaving")
                    self.server_gone = True
                    return 0
            if self.stop_requested and not self.draining:
                if not self.registered:
                    return 0
                self.draining = True
                last_heard = now
                self._send(self.to_scheduler, DrainReplica(self.index))
                self.log.info(
                    "draining: finishing the requests held, taking no new ones", held=len(self.manager.states)
                )
            if self.draining and now - last_heard > DRAIN_IDLE_S:
                self.log.info("no word from the scheduler while draining; leaving", held=len(self.manager.states))
                return 0
            if not self.registered and attach_timeout_s is not None and now - started > attach_timeout_s:
                self.refused = (
                    f"no scheduler answered at {self.run_dir} within {attach_timeout_s:g} s (is the server running?)"
                )
                return 1

    def _maybe_beat(self, last: float) -> float:
        now = time.monotonic()
        if self.registered and now - last >= HEARTBEAT_INTERVAL_S:
            self._send(self.to_scheduler, ReplicaHeartbeat(self.index, self.pid))
            return now
        return last

    def _handle(self, raw: bytes, on_ready: Callable[[int], None]) -> int | None:
        """Handle one inbox message; returns an exit code when the replica must leave."""
        t0 = time.perf_counter() if self.trace is not None else 0.0
        try:
            msg = codec.to_detokenizer.decode(raw)
        except msgspec.MsgspecError as e:
            self.log.error("bad message on detokenizer inbox", error=str(e))
            return None
        if isinstance(msg, BatchTokenOut):
            out, stops = self.manager.tokens(msg)
            sending = time.perf_counter() if self.trace is not None else 0.0
            if out is not None:
                self._send(self.to_tokenizer, out)
            for s in stops:
                self._send(self.to_scheduler, s)
            if self.trace is not None:
                write_record(
                    self.trace,
                    key=batch_key(msg.rids, msg.completion_tokens),
                    recv=t0,
                    sending=sending,
                    done=time.perf_counter(),
                    rows=len(msg.rids),
                    out_key=batch_key(out.rids, out.completion_tokens) if out is not None else None,
                )
        elif isinstance(msg, DetokSeed):
            self.manager.seed(msg)
        elif isinstance(msg, DetokAbort):
            if msg.reason:
                self.log.warning("request failed by the scheduler", reason=msg.reason, **self.manager.describe(msg.rid))
            self.manager.abort(msg)
        elif isinstance(msg, DetokShutdown):
            return 0
        elif isinstance(msg, ReplicaWelcome):
            if not self.registered:
                self.index, self.registered = msg.index, True
                self._send(self.control, Ready(Role.DETOKENIZER, msg.index, f"pid={self.pid}", self.pid))
                on_ready(msg.index)
        elif isinstance(msg, ReplicaRefused):
            self.refused = msg.message
            return 1
        return None

    def close(self, reason: str) -> None:
        """Flush text still queued for the tokenizer, tell the scheduler this replica left,
        and close every socket: at once when the server is gone or never registered this
        replica (then nothing queued matters: a `Hello` no scheduler read would otherwise
        hold the exit for `FLUSH_LINGER_MS`)."""
        linger = 0 if self.server_gone or not self.registered else None
        self.inbox.close()
        self.to_tokenizer.close(linger)  # else lingers until its queued text is sent
        if self.registered and not self.server_gone:
            self._send(self.to_scheduler, ReplicaExited(self.index, self.pid, reason))
        self.to_scheduler.close(linger)
        self.control.close(0)  # Hello and heartbeats only: nothing to deliver on the way out
        self.ctx.term()


def load_server_args(run_dir: str) -> ServerArgs:
    """The server's args, or `SystemExit(2)` with a clear message when RUN_DIR holds none."""
    try:
        return ServerArgs.load(run_dir)
    except FileNotFoundError:
        print(
            f"lazyserve detokenizer: no lazyserve server in {run_dir}: {endpoints.SERVER_ARGS_FILE} is missing "
            f"(launch.py prints the run dir when it is ready; fix it with --run-dir)",
            file=sys.stderr,
        )
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        print(f"lazyserve detokenizer: {run_dir}/{endpoints.SERVER_ARGS_FILE} is unreadable: {e}", file=sys.stderr)
    raise SystemExit(2)


def main(run_dir: str, index: int | None) -> int:
    """Run a replica: launch's replica `index`, or an attached one when index is None.
    Returns the exit code (0: left after a drain or shutdown; 1: failed or refused)."""
    attached = index is None
    if attached:
        setproctitle.setproctitle("lazyserve::detokenizer-attaching")
    else:
        start_child(f"lazyserve::detokenizer-{index}")
    args = load_server_args(run_dir)
    log = configure_logging(args.log_level, args.log_format, proc="detokenizer" if attached else f"detokenizer-{index}")
    ctx = zmq.Context()
    hs = None if attached else Handshake(ctx, run_dir, Role.DETOKENIZER, index)
    try:
        from text.hf_tokenizer import load_resolved_tokenizer

        tokenizer = load_resolved_tokenizer(args.model, run_dir)
        proc = ReplicaProcess(ctx, run_dir, index, DetokenizerManager(tokenizer), log)
    except Exception as e:
        if hs is not None:
            hs.failed(e)
            hs.close()
        print(f"lazyserve detokenizer: cannot start: {type(e).__name__}: {e}", file=sys.stderr)
        return 1

    def on_signal(*_: object) -> None:
        proc.stop_requested = True

    if attached:  # started by hand: SIGTERM or Ctrl-C drains it (as --detach does)
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
    else:  # launch's: a SIGTERM stops the whole server (launch drains it); launch's STOP_SIGNAL drains this one
        install_stop_handlers(on_signal, log)

    def on_ready(i: int) -> None:
        nonlocal log
        proc.log = log = log.bind(proc=f"detokenizer-{i}")
        if attached:
            setproctitle.setproctitle(f"lazyserve::detokenizer-{i}")
            log.info("attached", index=i, run_dir=run_dir)
            print(f"lazyserve detokenizer: attached to {run_dir} as replica {i} (pid {proc.pid})", flush=True)
        else:
            hs.ready(f"pid={proc.pid}")

    code = proc.run(on_ready, attach_timeout_s=ATTACH_TIMEOUT_S if attached else None)
    if proc.refused is not None:
        log.error("refused by the scheduler", reason=proc.refused)
        print(f"lazyserve detokenizer: refused: {proc.refused}", file=sys.stderr, flush=True)
        if hs is not None:
            hs.failed(RuntimeError(proc.refused))  # (no-op once it was ready: refused later, it was revoked)
    if hs is not None:
        hs.close()
    proc.close("left" if code == 0 else (proc.refused or "failed"))
    log.info("detokenizer stopped", code=code)
    return code
