"""`Launcher`: spawns the children of one server, waits for them to be ready, tends them while
the server runs (restarting a worker or a detokenizer replica that died, stopping the server
when the scheduler or the HTTP front dies), drains and stops them; `install_signal_handlers`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import zmq

from protocol import PROTOCOL_VERSION, codec, endpoints
from protocol.config import ServerArgs
from protocol.endpoints import SERVER_ARGS_FILE, STOPPING_FILE
from protocol.enums import Role
from protocol.messages import (
    Drained,
    Failed,
    Hello,
    Ready,
    ReplicaExited,
    ServerReady,
    TokenizerDrain,
    TokenizerShutdown,
    ToScheduler,
    ToTokenizer,
    WorkerExited,
)
from protocol.process import DRAIN_SIGNAL, EXIT_RANK_LOST, PARENT_PID_ENV, STOP_SIGNAL, describe_exit
from protocol.sockets import bind_pull
from worker_proc.tp.setup import rank_env, write_hostfile, write_ring

ROOT = Path(__file__).resolve().parent.parent
"""The checkout (or installed tree) the children run from."""
STARTUP_TIMEOUT_S = 900
STOP_TIMEOUT_S = 10
RESTART_BACKOFF_S = (0.0, 1.0, 2.0, 5.0, 10.0, 30.0)
"""Delay before restarting a worker or replica that died, by how many times in a row it died
within `QUICK_DEATH_S` of its start."""
QUICK_DEATH_S = 30.0
NOT_RESTARTED = {
    Role.SCHEDULER: "it held every request's state (queue, KV accounting, detokenizer routing)",
    Role.TOKENIZER: "it held every client connection",
}
"""Why the death of these children stops the server (for the log line)."""


@dataclass
class Child:
    """A spawned process: its role, index, name for logs, and Popen handle."""

    role: Role
    index: int
    name: str
    popen: subprocess.Popen
    ready: bool = False
    started: float = field(default_factory=time.monotonic)


class Launcher:
    """Spawns, watches and stops the children of one server."""

    def __init__(self, args: ServerArgs, log) -> None:
        self.args, self.log = args, log
        self.ctx = zmq.Context()
        self.control = bind_pull(self.ctx, endpoints.control(args.run_dir))
        self.children: list[Child] = []
        self.stop_requested = False
        self.signals = 0  # SIGINT/SIGTERM received; a second one ends the drain
        self.to_scheduler: zmq.Socket | None = None
        self.to_tokenizer: zmq.Socket | None = None
        self.restart_at: dict[tuple[Role, int], float] = {}  # (role, index) -> when to restart it
        self.quick_deaths: dict[tuple[Role, int], int] = {}
        self.worker_generation = 0  # +1 per restart of the worker
        self.hostfile: Path | None = None  # the ring hostfile of the current --tp group

    def _spawn(self, role: Role, index: int, module: str, *extra: str, env_extra: dict[str, str] | None = None) -> None:
        env = dict(os.environ, **(env_extra or {}))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        env[PARENT_PID_ENV] = str(os.getpid())
        cmd = [sys.executable, "-m", module, self.args.run_dir, *extra]
        name = role.name.lower() + (f"-{index}" if role == Role.DETOKENIZER else f"-rank{index}" if index else "")
        # a session of its own: a signal to launch's process group (`timeout`, `kill -- -PGID`, a
        # terminal's Ctrl-C) reaches launch alone, which drains, instead of stopping every child at once
        self.children.append(
            Child(role, index, name, subprocess.Popen(cmd, env=env, cwd=str(ROOT), start_new_session=True))
        )

    def _spawn_restartable(self, role: Role, index: int) -> None:
        """Start the worker (of the current generation; with ``--tp N`` its N ranks, on a fresh
        ring hostfile) or detokenizer replica `index`."""
        if role == Role.WORKER and self.args.tp > 1:
            if self.hostfile is not None:
                self.hostfile.unlink(missing_ok=True)
            path = Path(self.args.run_dir) / f"tp-hostfile-{self.worker_generation}.json"
            # with --hostfile the ring read from it (either format); the other ranks are started by hand and attach
            self.hostfile = (
                write_ring(path, self.args.dist_ring) if self.args.hostfile else write_hostfile(path, self.args.tp)
            )
            for rank in range(1 if self.args.hostfile else self.args.tp):
                self._spawn(
                    Role.WORKER,
                    rank,
                    "worker_proc",
                    str(self.worker_generation),
                    env_extra=rank_env(rank, self.hostfile),
                )
        elif role == Role.WORKER:
            self._spawn(Role.WORKER, 0, "worker_proc", str(self.worker_generation))
        else:
            self._spawn(Role.DETOKENIZER, index, "detokenizer_proc", str(index))

    def spawn_all(self) -> None:
        """Start every child (they load in parallel). The worker preloads the CPU BLAS itself,
        once it knows MLX runs on the CPU (`worker_proc.cpu.blas.preload_env`)."""
        self._spawn_restartable(Role.WORKER, 0)
        self._spawn(Role.SCHEDULER, 0, "scheduler_proc")
        for i in range(self.args.detokenizers):
            self._spawn_restartable(Role.DETOKENIZER, i)
        self._spawn(Role.TOKENIZER, 0, "tokenizer_proc")

    def _dead(self) -> Child | None:
        return next((c for c in self.children if c.popen.poll() is not None), None)

    def wait_ready(self) -> None:
        """Block until every child sent Ready. Raises `RuntimeError` with the child's error
        when one reports failure, exits, speaks another protocol version, or times out."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        by_key = {(c.role, c.index): c for c in self.children}
        while not all(c.ready for c in self.children):
            if self.stop_requested:
                raise KeyboardInterrupt
            if time.monotonic() > deadline:
                raise RuntimeError(f"start-up took longer than {STARTUP_TIMEOUT_S} s")
            if self.control.poll(100):
                raw = self.control.recv()
                try:
                    msg = codec.control.decode(raw)
                except msgspec.MsgspecError as e:
                    self.log.error("bad message on the control socket", error=str(e), bytes=len(raw))
                    continue
                child = by_key.get((msg.role, msg.index))
                if isinstance(msg, Hello) and msg.protocol_version != PROTOCOL_VERSION:
                    raise RuntimeError(
                        f"{msg.role.name.lower()} speaks protocol {msg.protocol_version}, "
                        f"launch speaks {PROTOCOL_VERSION}"
                    )
                if isinstance(msg, Failed):
                    raise RuntimeError(f"{child.name if child else msg.role.name} failed to start: {msg.error}")
                if isinstance(msg, Ready) and child is not None:
                    child.ready = True
                    self.log.info("ready", proc=child.name, info=msg.info)
                continue
            dead = self._dead()
            if dead is not None:
                if self.control.poll(1000):
                    continue  # its Failed message, with the error, may still be on the way
                raise RuntimeError(f"{dead.name} {describe_exit(dead.popen.returncode)} during start-up")

    def _tell_tokenizer(self, msg: ToTokenizer) -> None:
        """Send `msg` to the HTTP process on one link kept open while launch runs: the tokenizer
        logs every link of its inbox that closes, and a link per message would be such a line
        at every start (`ServerReady`), although nothing is wrong."""
        if self.to_tokenizer is None:
            self.to_tokenizer = self.ctx.socket(zmq.PUSH)
            self.to_tokenizer.connect(endpoints.tokenizer(self.args.run_dir))
        self.to_tokenizer.send(codec.encoder.encode(msg))

    def announce_ready(self) -> None:
        """Tell the HTTP front that every process is up (/health turns 200)."""
        self._tell_tokenizer(ServerReady())

    def supervise(self) -> int:
        """Run until a signal (returns 0) or the exit of the scheduler or the tokenizer
        (returns 1)."""
        while not self.stop_requested:
            self._drain_control()
            if self._tend_children():
                return 1
            time.sleep(0.2)
        return 0

    def _tend_children(self) -> bool:
        """One supervision step, while serving and while draining: a worker or replica that
        exited is handled by `_worker_exited` / `_replica_exited`, and the restarts that are
        due are started. Returns True when the scheduler or the tokenizer exited (the server
        must stop), or when the run directory was removed from under the server (a /tmp
        cleaner, an ``rm``): a restarted child or an attached replica could no longer reach the
        sockets, so the server stops (exit 1, for a supervisor to start it again) rather than
        stay up unable to recover."""
        if not (Path(self.args.run_dir) / SERVER_ARGS_FILE).exists():
            self.log.error(
                "the run directory was removed while serving; shutting down (no process started "
                "from now on could reach the sockets)",
                run_dir=self.args.run_dir,
            )
            return True  # (its sockets cannot be reached to say why: the streams end with the SIGTERM's 503)
        for dead in [c for c in self.children if c.popen.poll() is not None]:
            if dead not in self.children:
                continue  # a rank of a --tp group another rank's exit already took down
            if dead.role == Role.DETOKENIZER:
                self._replica_exited(dead)
            elif dead.role == Role.WORKER:
                self._worker_exited(dead)
            else:
                exit_ = describe_exit(dead.popen.returncode)
                self.log.error(
                    "child process exited; shutting down",
                    proc=dead.name,
                    exit=exit_,
                    not_restarted=NOT_RESTARTED[dead.role],
                )
                if dead.role == Role.SCHEDULER:  # the streams in flight end saying why, before the SIGTERM
                    self._tell_tokenizer(TokenizerShutdown(f"the scheduler {exit_}; the server is stopping"))
                    self._wait_exit(Role.TOKENIZER, STOP_TIMEOUT_S)
                return True
        now = time.monotonic()
        for key, at in list(self.restart_at.items()):
            if now >= at:
                del self.restart_at[key]
                self._spawn_restartable(*key)
        return False

    def _to_scheduler(self, msg: ToScheduler) -> None:
        if self.to_scheduler is None:
            self.to_scheduler = self.ctx.socket(zmq.PUSH)
            self.to_scheduler.connect(endpoints.scheduler(self.args.run_dir))
        self.to_scheduler.send(codec.encoder.encode(msg))

    def _restart_later(self, child: Child, crashed: bool = True) -> float:
        """Schedule `child`'s restart after the back-off (`RESTART_BACKOFF_S`, longer while it
        keeps dying within `QUICK_DEATH_S` of its start; the first step when not `crashed`, which
        does not count as a quick death); returns the delay in seconds."""
        key = (child.role, child.index)
        quick = crashed and time.monotonic() - child.started < QUICK_DEATH_S
        deaths = self.quick_deaths[key] = self.quick_deaths.get(key, 0) + 1 if quick else 0
        delay = RESTART_BACKOFF_S[min(deaths, len(RESTART_BACKOFF_S) - 1)]
        self.restart_at[key] = time.monotonic() + delay
        return delay

    def _replica_exited(self, child: Child) -> None:
        """Tell the scheduler; restart the replica unless it exited 0 (drained and left) while
        the server serves, after a back-off when it keeps dying soon after its start. One that
        left during launch's drain is restarted at once: a SIGTERM sent to every process of the
        server (systemd's ``KillMode=control-group``, ``pkill``) drains each replica as well,
        and the requests still queued need one to finish."""
        code = child.popen.returncode
        self.children.remove(child)
        self._to_scheduler(ReplicaExited(child.index, child.popen.pid, describe_exit(code)))
        if code == 0 and not self.stop_requested:
            self.log.info("detokenizer replica left (drained); not restarting it", proc=child.name)
            return
        if code == 0:
            self._restart_later(child, crashed=False)
            self.log.info(
                "detokenizer replica left during the drain; restarting it for the requests left", proc=child.name
            )
            return
        delay = self._restart_later(child)
        self.log.warning(
            "detokenizer replica died; restarting it", proc=child.name, exit=describe_exit(code), restart_in_s=delay
        )

    def _worker_exited(self, child: Child) -> None:
        """Tell the scheduler (it fails the requests on the device and waits for the new
        worker) and restart the worker as the next generation, after the back-off. With
        ``--tp`` the other ranks are killed first (they would block in a collective) and the
        whole group restarts; when rank 0 left because a rank was lost (`EXIT_RANK_LOST`)
        and a rank of this host is dead too, that rank's end is the reason given."""
        group = [c for c in self.children if c.role == Role.WORKER]
        if child.popen.returncode == EXIT_RANK_LOST:  # rank 0 left a broken group: name the rank that died
            child = next((c for c in group if c.popen.poll() not in (None, EXIT_RANK_LOST)), child)
        code = child.popen.returncode
        for rank in group:
            if rank is not child and rank.popen.poll() is None:
                rank.popen.kill()
                rank.popen.wait()
            self.children.remove(rank)
        reason = describe_exit(code) if not child.index else f"rank {child.index} {describe_exit(code)}"
        self._to_scheduler(WorkerExited(child.popen.pid, self.worker_generation, reason))
        self.worker_generation += 1
        # rank 0 that lost a rank on another host did not crash: it waits for the ranks again
        delay = self._restart_later(min(group, key=lambda c: c.index), crashed=code != EXIT_RANK_LOST)
        self.log.error(
            "worker died; restarting it (it reloads the model)",
            proc=child.name,
            exit=describe_exit(code),
            ranks=len(group),
            next_generation=self.worker_generation,
            restart_in_s=delay,
        )

    def _drain_control(self) -> None:
        """Log the handshake of restarted replicas (Ready, or Failed with their error)."""
        while True:
            try:
                msg = codec.control.decode(self.control.recv(zmq.NOBLOCK))
            except zmq.Again:
                return
            except msgspec.MsgspecError as e:
                self.log.error("bad message on the control socket", error=str(e))
                continue
            self._log_restarted(msg)

    def _log_restarted(self, msg: object) -> None:
        """Log a restarted child's handshake message (Ready, or Failed with its error)."""
        if isinstance(msg, Failed):
            self.log.error(
                "restarted process failed to start", proc=f"{msg.role.name.lower()}-{msg.index}", error=msg.error
            )
        elif isinstance(msg, Ready):
            self.log.info("restarted process ready", proc=f"{msg.role.name.lower()}-{msg.index}", info=msg.info)

    def drain(self, timeout_s: float) -> int:
        """Let the requests in flight finish before `stop_all`: the HTTP front refuses new ones
        (503) and reports `Drained` when none is left. Waits up to `timeout_s` seconds (0: not
        at all), less if a second signal comes. Supervision goes on meanwhile (`_tend_children`):
        a worker or replica that dies is restarted, so the requests queued for it still run.
        Returns 0, or 1 when the scheduler or the tokenizer exits meanwhile."""
        self.mark_stopping()
        if timeout_s <= 0:
            return 0
        start = time.monotonic()
        self._tell_tokenizer(TokenizerDrain())
        self.log.info("draining: new requests get 503; waiting for those in flight", timeout_s=timeout_s)
        while self.signals < 2:
            left = start + timeout_s - time.monotonic()
            if left <= 0:
                self.log.warning("shutdown timeout passed; failing the requests still in flight", timeout_s=timeout_s)
                return 0
            if self.control.poll(int(min(left, 0.2) * 1000) + 1):
                try:
                    msg = codec.control.decode(self.control.recv())
                except msgspec.MsgspecError as e:
                    self.log.error("bad message on the control socket", error=str(e))
                    continue
                if isinstance(msg, Drained):
                    self.log.info("drained", seconds=round(time.monotonic() - start, 3))
                    return 0
                self._log_restarted(msg)
            if self._tend_children():
                return 1
        self.log.warning("second signal: stopping at once")
        return 0

    def _wait_exit(self, role: Role, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the children of `role` to exit on their own."""
        deadline = time.monotonic() + timeout_s
        for c in (c for c in self.children if c.role == role):
            try:
                c.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return

    def mark_stopping(self) -> None:
        """Write `endpoints.STOPPING_FILE`: the links that close from now on are the server
        stopping, which the sockets log at debug only (`protocol.sockets`)."""
        with contextlib.suppress(OSError):  # a run directory already gone: nothing to mark
            (Path(self.args.run_dir) / STOPPING_FILE).touch()

    def stop_all(self) -> None:
        """Stop the children in order (tokenizer, scheduler, worker, detokenizers) with
        `STOP_SIGNAL` (they pass a SIGTERM on to launch while it lives:
        `install_stop_handlers`); SIGKILL any still alive after `STOP_TIMEOUT_S`. `SERVER_ARGS_FILE` is removed once the
        scheduler stopped. The control socket is closed first: nothing is read from it any
        more, and its links (`Handshake`) then close unlogged as the children stop."""
        self.mark_stopping()
        self.control.close(linger=0)
        order = [Role.TOKENIZER, Role.SCHEDULER, Role.WORKER, Role.DETOKENIZER]
        for role in order:
            group = [c for c in self.children if c.role == role and c.popen.poll() is None]
            for c in group:
                c.popen.send_signal(STOP_SIGNAL)
            for c in group:
                try:
                    c.popen.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self.log.warning("child did not stop; killing it", proc=c.name)
                    c.popen.kill()
                    c.popen.wait()
            if role == Role.SCHEDULER:  # nothing is left for replicas to render or deliver, even when the
                # scheduler died and cannot drain them: the file's absence tells them to leave at once
                (Path(self.args.run_dir) / SERVER_ARGS_FILE).unlink(missing_ok=True)
        self.ctx.destroy(linger=0)


def install_signal_handlers(launcher: Launcher) -> None:
    """SIGINT, SIGTERM and SIGHUP (the terminal closed) drain the server and count towards a
    second one that stops it at once (`Launcher.signals`); `DRAIN_SIGNAL` (a child passing a
    SIGTERM on) drains it. `STOP_SIGNAL`, the children's stop signal, sent here by hand, would
    kill launch: it gets a handler that does nothing, not ``SIG_IGN``, because an ignored
    signal stays ignored across ``exec``, and a child still importing its modules (before
    `start_child`) would then drop launch's stop and run on until killed."""

    def on_signal(*_: object) -> None:
        launcher.stop_requested = True
        launcher.signals += 1

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    signal.signal(DRAIN_SIGNAL, lambda *_: setattr(launcher, "stop_requested", True))
    signal.signal(STOP_SIGNAL, lambda *_: None)
