"""What every child process does the same way: title, logging, parent watch, handshake."""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

import setproctitle
import structlog
import zmq

from protocol import PROTOCOL_VERSION, endpoints
from protocol.codec import encoder
from protocol.enums import Role
from protocol.messages import Failed, Hello, Ready

_PR_SET_PDEATHSIG = 1
EXIT_RANK_LOST = 75
"""Exit code of a ``--tp`` rank 0 that lost a rank started by hand on another host (its
link closed): the group cannot go on, launch restarts rank 0 (`describe_exit`)."""
PARENT_PID_ENV = "LAZYSERVE_PARENT_PID"
"""Set by launch in its children's environment: the pid they must outlive no longer."""
STOP_SIGNAL = signal.SIGUSR1
"""What launch stops its children with once the server has drained (`install_stop_handlers`;
a detokenizer replica drains on it: it finishes what it holds, then leaves)."""
DRAIN_SIGNAL = signal.SIGUSR2
"""What a child of launch sends launch when it got a SIGTERM itself: drain and stop the server
(as a SIGTERM to launch does, except that it never counts as the second signal that ends a
drain at once: a SIGTERM to every process of the server sends launch one of each per child)."""


def configure_logging(level: str = "info", fmt: str = "console", **bind: object) -> structlog.BoundLogger:
    """Set up structlog for this process; returns a logger bound to `bind` (e.g. proc=...).

    fmt: "console" (human) or "json" (one JSON object per line). Logs go to stderr, each line
    in one write: launch's children share one log file, unbuffered, and a line written in two
    parts (text, then newline) merges with another process's line. Every line of the process
    carries the `bind` keys, also one written through a plain ``structlog.get_logger()`` (a
    socket monitor's thread, an error handler): launch's children share one log, where a
    line without ``proc`` could not be told apart.
    """
    renderer = structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)

    def add_bound(_logger: object, _method: str, event: dict) -> dict:
        for key, value in bind.items():
            event.setdefault(key, value)
        return event

    structlog.configure(
        processors=[
            add_bound,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    return structlog.get_logger().bind(**bind)


def exit_now(code: int = 0) -> NoReturn:
    """End this process with `code` at once, skipping the interpreter's finalization: with torch
    imported (transformers and xgrammar import it) its last garbage collection takes over a
    second on a 2-core CPU, and every server stop would wait for it in each process. Call it
    only once the process's own cleanup is done (sockets closed, their messages delivered);
    stdout and stderr are flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its parent dies (no orphans, even when launch is
    SIGKILLed); no-op elsewhere. A child of launch (which sets `PARENT_PID_ENV`) whose parent
    died before this took effect terminates at once."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        except OSError:
            return
        if os.environ.get(PARENT_PID_ENV, "").isdigit() and not launch_alive():
            os.kill(os.getpid(), signal.SIGTERM)


class Handshake:
    """The child's side of Hello -> Ready/Failed on launch's control socket.

    Use: ``hs = Handshake(run_dir, role, index)`` (sends Hello), then ``hs.ready(info)`` or
    ``hs.failed(exc)``. The link stays open while the process runs: launch logs every link of
    its control socket that closes (`protocol.sockets`), and a link closed once the process
    is ready would be one such line per child at every start, although nothing is wrong.
    `close()` it when the process ends (or failed to start).
    """

    def __init__(self, ctx: zmq.Context, run_dir: str, role: Role, index: int = 0) -> None:
        self.role, self.index = role, index
        self.answered = False
        self.sock = ctx.socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 2000)
        self.sock.connect(endpoints.control(run_dir))
        self.sock.send(encoder.encode(Hello(role, index, os.getpid(), PROTOCOL_VERSION)))

    def ready(self, info: str = "") -> None:
        """Report that this process serves from now on (once; no-op after `failed` or `close`),
        after `freeze_startup_heap`."""
        if self.sock is not None and not self.answered:
            freeze_startup_heap()
        self._answer(Ready(self.role, self.index, info))

    def failed(self, exc: BaseException) -> None:
        """Report a start-up failure with the exception's message (no-op after `ready` or
        `close`: a process that served does not fail to start)."""
        self._answer(Failed(self.role, self.index, f"{type(exc).__name__}: {exc}"))

    def _answer(self, msg: Ready | Failed) -> None:
        if self.sock is not None and not self.answered:
            self.answered = True
            self.sock.send(encoder.encode(msg))

    def close(self) -> None:
        """Close the control link (pending messages are still delivered)."""
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def freeze_startup_heap() -> None:
    """Collect the garbage of start-up, then put every object still alive (modules, the
    model's and tokenizer's Python objects: ~230,000 in the worker) out of the cyclic
    garbage collector's reach (`gc.freeze`), as vLLM and SGLang do once their servers are up.

    Python's collector traverses every tracked object in a full (oldest-generation)
    collection, which it runs whenever enough objects survived the younger ones: in the
    worker, with the default model loaded, one such collection took 115 ms on a 2-core CPU,
    and a 64-row prefill allocates enough to set one off, so a whole decode step's worth of
    time or more went to traversing objects that live as long as the process. Frozen
    objects are never traversed or freed; what the process allocates afterwards is
    collected as before."""
    gc.collect()
    gc.freeze()


def describe_exit(code: int) -> str:
    """How a child ended, from its Popen return code: ``exited with code N``, ``was killed by
    SIGKILL``, or for `EXIT_RANK_LOST` what that code means."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code == EXIT_RANK_LOST:
        return (
            "lost a tensor-parallel rank started on another host (its link closed: the rank exited or its "
            "host stopped answering)"
        )
    return f"exited with code {code}"


def launch_alive() -> bool:
    """True when this process is a child of launch (`PARENT_PID_ENV` set) whose launch still
    runs: a process whose parent died is re-parented, so ``os.getppid()`` then differs."""
    parent = os.environ.get(PARENT_PID_ENV, "")
    return parent.isdigit() and os.getppid() == int(parent)


def install_stop_handlers(stop: Callable[[], None] | None, log: structlog.BoundLogger | None = None) -> None:
    """Call `stop` on `STOP_SIGNAL` (launch stopping this child after the drain) and on
    SIGTERM or SIGHUP, except one that comes while this process's launch still runs, which
    asks launch to drain the server instead (`DRAIN_SIGNAL`); ignore SIGINT and
    `DRAIN_SIGNAL` (launch's own signal: sent here by hand, its default action would kill the
    process and cut its streams).

    A SIGTERM to a child of a live launch is one sent to every process of the server at once
    (systemd's ``KillMode=control-group``, its default, or ``killall``), to the children
    alone (``pkill lazyserve`` matches their titles, not ``python launch.py``) or to one of
    them. Either way the user stops the server: launch drains it (new requests get a 503,
    those in flight finish) and then stops its children in order. A child that stopped on the
    SIGTERM would cut the requests in flight, so it keeps serving. A SIGTERM after launch died
    (`die_with_parent`'s parent-death signal) or to a process started by hand (a ``--tp`` rank
    on another host) stops it. SIGINT: each child runs in a session of its own, so a
    terminal's Ctrl-C reaches launch alone; one sent to a child on purpose is ignored as well.
    `start_child` installs these for the start-up with no `stop`: the signal's default action
    then ends the process at once, even inside a long native call (loading a model or a
    tokenizer), where a Python handler would wait for the call to return; each child installs
    its own `stop` once it serves. log: where the pass-on is logged (None: stderr)."""

    def on_sigterm(signum: int, _frame: object) -> None:
        if launch_alive():
            message = f"{signal.Signals(signum).name}: launch drains the server, then stops this process"
            if log is not None:
                log.warning(message, launch_pid=os.getppid())
            else:
                print(f"lazyserve: {message} (launch pid {os.getppid()})", file=sys.stderr, flush=True)
            os.kill(os.getppid(), DRAIN_SIGNAL)
        elif stop is None:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        else:
            stop()

    signal.signal(STOP_SIGNAL, signal.SIG_DFL if stop is None else lambda *_: stop())
    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGHUP, on_sigterm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(DRAIN_SIGNAL, signal.SIG_IGN)


def start_child(title: str) -> None:
    """Common first steps of a child: process title, stop signals for the start-up (a SIGTERM
    while launch lives asks launch to stop the server, which it does cleanly during a start-up
    too; launch's `STOP_SIGNAL` or a SIGTERM after it died ends it at once), parent-death signal."""
    setproctitle.setproctitle(title)
    install_stop_handlers(None)
    die_with_parent()
