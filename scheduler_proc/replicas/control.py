"""`ReplicaControl`: the scheduler process's side of detokenizer replica lifecycles, between
its sockets and the `DetokRouter`.

Registration arrives on the scheduler's control socket (Control channel): a replica's
Hello is checked (role, `PROTOCOL_VERSION`, index) and either registered (the router
answers `ReplicaWelcome`) or refused with `ReplicaRefused` and a message saying why; its
Ready makes it take requests. Lifecycle messages arrive on the scheduler's inbox
(`ReplicaHeartbeat`, `DrainReplica`, `ReplicaExited`) as do the tokenizer's
`DeliveredChars` and `StreamsClosed`; `handle` passes them to the router.
"""

from __future__ import annotations

import msgspec
import zmq

from protocol import PROTOCOL_VERSION, codec, endpoints
from protocol.enums import Role
from protocol.messages import (
    DeliveredChars,
    DrainReplica,
    Hello,
    Ready,
    ReplicaExited,
    ReplicaHeartbeat,
    ReplicaRefused,
    StreamsClosed,
)
from protocol.sockets import bind_pull
from scheduler_proc.replicas.router import DetokRouter

REPLICA_MESSAGES = (ReplicaHeartbeat, DrainReplica, ReplicaExited, DeliveredChars, StreamsClosed)
"""The ToScheduler messages `ReplicaControl.handle` takes."""


class ReplicaControl:
    """Binds the scheduler's control socket in `run_dir` and feeds `router`."""

    def __init__(self, ctx: zmq.Context, run_dir: str, router: DetokRouter, log) -> None:
        self.ctx, self.run_dir, self.router, self.log = ctx, run_dir, router, log
        self.sock = bind_pull(ctx, endpoints.scheduler_control(run_dir))

    def drain(self) -> None:
        """Handle every registration message waiting (does not block)."""
        while True:
            try:
                raw = self.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.handle_control(raw)

    def handle_control(self, raw: bytes) -> None:
        """One Control message: Hello registers or refuses a replica, Ready starts it."""
        try:
            msg = codec.control.decode(raw)
        except msgspec.MsgspecError as e:
            self.log.error("bad message on scheduler control socket", error=str(e))
            return
        if isinstance(msg, Hello):
            self._hello(msg)
        elif isinstance(msg, Ready) and msg.role == Role.DETOKENIZER:
            self.router.ready(msg.index, msg.pid)

    def _hello(self, msg: Hello) -> None:
        if msg.role != Role.DETOKENIZER:
            self.log.warning("ignored Hello from a process that is not a detokenizer", role=msg.role.name, pid=msg.pid)
            return
        attach = msg.index < 0
        endpoint = (
            endpoints.attached_detokenizer(self.run_dir, msg.pid)
            if attach
            else endpoints.detokenizer(self.run_dir, msg.index)
        )
        if msg.protocol_version != PROTOCOL_VERSION:
            self._refuse(
                endpoint,
                msg.pid,
                f"this detokenizer speaks protocol {msg.protocol_version}, the server "
                f"speaks {PROTOCOL_VERSION}: run the replica from the same lazyserve "
                f"version as the server",
            )
            return
        try:
            self.router.register(None if attach else msg.index, msg.pid, endpoint)
        except ValueError as e:
            self._refuse(endpoint, msg.pid, str(e))

    def _refuse(self, endpoint: str, pid: int, message: str) -> None:
        self.log.warning("refused a detokenizer replica", pid=pid, reason=message)
        sock = self.ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 1000)
        sock.connect(endpoint)
        sock.send(codec.encoder.encode(ReplicaRefused(message)))
        sock.close()

    def handle(self, msg) -> list[str]:
        """One of `REPLICA_MESSAGES`; returns the rids the scheduler must abort."""
        r = self.router
        if isinstance(msg, ReplicaHeartbeat):
            r.heartbeat(msg.index, msg.pid)
        elif isinstance(msg, DrainReplica):
            error = r.drain(msg.index)
            if error:
                self.log.warning("cannot drain detokenizer replica", error=error)
        elif isinstance(msg, ReplicaExited):
            r.exited(msg.index, msg.pid, msg.reason)
        elif isinstance(msg, DeliveredChars):
            return r.delivered(msg.rids, msg.chars)
        elif isinstance(msg, StreamsClosed):
            return r.streams_closed(msg.rids)
        return []

    def close(self) -> None:
        """Close the control socket."""
        self.sock.close(linger=0)
