"""The link between rank 0 and the ranks started by hand on other hosts (``--hostfile``).

On one host rank 0 feeds the other ranks over ipc in the run directory
(`tensor_parallel.RankForwarder`). A rank on another host has no run directory: it runs
``python -m worker_proc --rank R --hostfile FILE --attach HOST:PORT --dist-key-file KEY``
and connects, over ZeroMQ TCP, to rank 0, which binds a ROUTER socket on HOST:PORT only
(``--dist-init-addr``; never a wildcard address). Over that one connection:

1. the rank sends `Attach` (its rank and protocol version);
2. rank 0 answers with the `ServerArgs` of the server (model, pool and sampling settings;
   the model path must name the same model on the rank's host), or with an error string;
3. rank 0 then sends every ToWorker message it receives, as encoded, in order.

Liveness: both ends send ZeroMQ heartbeats (`HEARTBEAT_S`), so a connection whose peer
exited closes at once and one whose host vanished (or whose process stopped) closes after
the timeout. A rank exits when its connection closes (`watch_link`). Rank 0 knows which
connection is which rank's: the rank reads its own TCP port once connected and sends it in
`Attach`, and rank 0 maps each accepted connection's file descriptor to its peer address;
when an attached rank's connection closes, `RankServer.watch` calls back with its rank (rank
0 then exits too: its group cannot go on without the rank, and it may already be blocked in a
collective that will never return).

Authentication: ZeroMQ CURVE. The key file holds one CURVE secret key (Z85, 40 characters;
`write_key` makes one, mode 0600); rank 0 uses it as its server key and accepts only
clients whose public key is the one of that same secret (a ZAP handler), and the ranks use
it as their client key. So only holders of the key file can attach, and the traffic is
encrypted; a peer with another key fails the CURVE handshake and never reaches the socket.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import structlog
import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import recv_monitor_message

from protocol import PROTOCOL_VERSION
from protocol.config import ServerArgs
from protocol.sockets import MAX_FRAME_BYTES

ATTACH_TIMEOUT_S = 600.0
"""How long rank 0 waits for the ranks started by hand to attach before it fails."""
HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
"""The monitor events of a failed CURVE handshake (a client with another server key sees
NO_DETAIL: the server drops its HELLO)."""
KEY_FAILURES = 3
"""Failed handshakes after which a rank stops trying to attach (another key, surely: one
may be a rank 0 that exited mid-handshake)."""
HEARTBEAT_S = (2.0, 10.0)
"""Both ends of the link ping every 2 s and count the other end lost after 10 s without an
answer (a host that vanished, a stopped process); an exited peer is seen at once (its TCP
connection closes)."""
CONN_WAIT_S = 2.0
"""How long rank 0 waits for the connection an `Attach` names to be known open (its monitor
thread sees a new connection a moment after the rank's first frame may be read)."""


class Attach(msgspec.Struct, frozen=True):
    """A rank's first frame to rank 0; port: the local TCP port of its connection."""

    rank: int
    protocol_version: int
    port: int = 0


class Welcome(msgspec.Struct, frozen=True):
    """Rank 0's answer to `Attach`: the server's args, or an error (then args is None)."""

    args: ServerArgs | None
    error: str = ""


def write_key(path: Path) -> Path:
    """Write a fresh CURVE secret key (Z85) to `path` (mode 0600), unless the file exists;
    returns `path`."""
    if not path.exists():
        _, secret = zmq.curve_keypair()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secret + b"\n")
    return path


def read_key(path: Path | str) -> tuple[bytes, bytes]:
    """(public, secret) Z85 CURVE keys from the key file `path`. Raises `OSError` when it
    cannot be read and `ValueError` when it does not hold a 40-character Z85 key."""
    secret = Path(path).read_bytes().strip()
    if len(secret) != 40:
        raise ValueError(
            f"{path}: not a CURVE secret key (40 Z85 characters; make one with --dist-key-file "
            f"on launch, which writes it when the file is missing)"
        )
    try:
        return zmq.curve_public(secret), secret
    except (zmq.ZMQError, ValueError) as e:
        raise ValueError(f"{path}: not a CURVE secret key: {e}") from e


def parse_addr(addr: str) -> tuple[str, int]:
    """("ip", port) of ``"ip:port"``; raises `ValueError` for anything else, including a
    wildcard address (``0.0.0.0``, ``*``)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{addr!r} is not HOST:PORT")
    if host in ("*", "0.0.0.0", "::", "[::]"):
        raise ValueError(f"{addr!r}: give the address of one interface, not a wildcard")
    return host, int(port)


class _OnlyKey:
    """ZAP credentials provider accepting one CURVE public key."""

    def __init__(self, public: bytes) -> None:
        self.public = public

    def callback(self, domain: str, key: bytes) -> bool:
        """Whether the client's public key (Z85) is the accepted one."""
        return key == self.public


class RankServer:
    """Rank 0's side: a CURVE ROUTER socket bound on `addr` ("ip:port") for the ranks
    started by hand. Raises `zmq.ZMQError` when the address cannot be bound, `ValueError`
    for a bad address or key file."""

    def __init__(self, ctx: zmq.Context, addr: str, key_file: str) -> None:
        host, port = parse_addr(addr)
        public, secret = read_key(key_file)
        self.auth = ThreadAuthenticator(ctx)
        self.auth.start()
        self.auth.configure_curve_callback("*", _OnlyKey(public))
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.HEARTBEAT_IVL, int(HEARTBEAT_S[0] * 1000))
        self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(HEARTBEAT_S[1] * 1000))
        self.sock.setsockopt(zmq.LINGER, 2000)  # the WorkerShutdown sent at exit still goes out
        self.sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a vanished rank raises instead of dropping frames
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.setsockopt(zmq.MAXMSGSIZE, 4096)  # ranks send only their Attach
        self.sock.curve_server = True
        self.sock.curve_secretkey = secret
        self.sock.curve_publickey = public
        self.addr = addr
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # notified when a connection opens
        self._conns: dict[int, tuple[str, int]] = {}  # fd -> peer (ip, port), of the open connections
        self._ranks: dict[tuple[str, int], int] = {}  # peer (ip, port) -> rank, once attached
        self._on_lost: Callable[[int], None] | None = None
        self._lost: list[int] = []  # ranks lost before `watch`
        self._reported: set[int] = set()
        self.peers: dict[int, bytes] = {}  # rank -> routing id, once the group formed
        self._monitor = self.sock.get_monitor_socket(
            zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | HANDSHAKE_FAILED | zmq.EVENT_MONITOR_STOPPED
        )
        self._watcher = threading.Thread(target=self._watch_conns, name="tp-link ranks", daemon=True)
        self._watcher.start()
        try:
            self.sock.bind(f"tcp://{host}:{port}")
        except zmq.ZMQError:
            self.close()
            raise

    def _watch_conns(self) -> None:
        """Monitor thread: map each accepted connection's fd to its peer address, and report
        the rank of an attached peer whose connection closed. Ends, closing the monitor
        socket (which it owns), when `close` stops the monitor or the context terminates."""
        try:
            while (event := recv_monitor_message(self._monitor))["event"] != zmq.EVENT_MONITOR_STOPPED:
                self._on_event(event)
        except zmq.ZMQError:
            pass  # the context is terminating
        finally:
            self._monitor.close(linger=0)

    def _on_event(self, event: dict) -> None:
        """One monitor event of the ROUTER socket (`_watch_conns`)."""
        if event["event"] & HANDSHAKE_FAILED:
            structlog.get_logger().warning(
                "a peer failed the CURVE key check of the rank link (a rank with another "
                "--dist-key-file, or not a rank)",
                listening=self.addr,
            )
            return
        fd = int(event["value"])
        if event["event"] == zmq.EVENT_ACCEPTED:
            try:
                with socket.socket(fileno=os.dup(fd)) as conn:
                    peer = conn.getpeername()[:2]
            except OSError:
                return  # already gone
            with self._changed:
                self._conns[fd] = peer
                self._changed.notify_all()
            return
        with self._lock:
            peer = self._conns.pop(fd, None)
            rank = self._ranks.pop(peer, None) if peer is not None else None
        if rank is not None:
            self._report(rank)

    def _report(self, rank: int) -> None:
        """Pass a lost rank to the `watch` callback, or keep it for `watch`; once per rank."""
        with self._lock:
            if rank in self._reported:
                return
            self._reported.add(rank)
            on_lost = self._on_lost
            if on_lost is None:
                self._lost.append(rank)
        if on_lost is not None:
            on_lost(rank)

    def watch(self, on_lost: Callable[[int], None]) -> None:
        """Call `on_lost(rank)` when the connection of an attached rank closes: it exited, or
        its host stopped answering the heartbeats. It is called from the monitor thread, from
        `send` when a frame finds the rank gone first, and at once, from this call, for a rank
        lost already."""
        with self._lock:
            self._on_lost, lost = on_lost, list(self._lost)
        for rank in lost:
            on_lost(rank)

    def wait_ranks(self, ranks: range, args: ServerArgs, timeout_s: float = ATTACH_TIMEOUT_S) -> None:
        """Wait until every rank of `ranks` attached, answering each with `args`. Raises
        `TimeoutError` naming the ranks still missing after `timeout_s`.

        An `Attach` counts only when the connection it names (the frame's peer address and
        the port the rank read) is open here: a rank's Attach queued on a connection that
        closed (say, to a rank 0 that exited mid-handshake) reaches this rank 0 over the next
        connection with a stale port, and is dropped (the rank sends another one, with the
        right port, on each new connection)."""
        missing, deadline = set(ranks), time.monotonic() + timeout_s
        by_rank: dict[int, bytes] = {}
        while missing:
            left = deadline - time.monotonic()
            if left <= 0 or not self.sock.poll(int(left * 1000) + 1):
                raise TimeoutError(
                    f"ranks {sorted(missing)} did not attach within {timeout_s:.0f} s (start them "
                    f"with python -m worker_proc --rank R --hostfile FILE [--starting-port P] "
                    f"--attach ADDR --dist-key-file KEY)"
                )
            peer, frame = self.sock.recv_multipart(copy=False)[:2]
            peer = peer.bytes
            try:
                hello = msgspec.json.decode(frame.bytes, type=Attach)
            except msgspec.MsgspecError:
                continue
            if peer in by_rank.values():
                continue  # a repeat from an attached connection
            if hello.protocol_version != PROTOCOL_VERSION or hello.rank not in missing:
                error = (
                    f"rank {hello.rank} speaks protocol {hello.protocol_version}, rank 0 speaks {PROTOCOL_VERSION}"
                    if hello.protocol_version != PROTOCOL_VERSION
                    else f"rank {hello.rank} is not awaited (ranks {sorted(missing)} are)"
                )
                self._answer(peer, Welcome(None, error))
                continue
            if not self._map_rank((frame.get("Peer-Address"), hello.port), hello.rank):
                continue  # stale, or its connection closed already: the rank attaches again
            if not self._answer(peer, Welcome(args)):
                continue  # gone between the two (the monitor reports it once `watch` is called)
            by_rank[hello.rank] = peer
            missing.discard(hello.rank)
        self.peers = dict(sorted(by_rank.items()))

    def _map_rank(self, address: tuple[str, int], rank: int) -> bool:
        """Record that the open connection from `address` (ip, port) is `rank`'s; False when
        no such connection opens within `CONN_WAIT_S` (the monitor thread may learn of a new
        connection a moment after its first frame is read)."""
        with self._changed:
            if not self._changed.wait_for(lambda: address in self._conns.values(), CONN_WAIT_S):
                return False
            self._ranks[address] = rank
            return True

    def _answer(self, peer: bytes, welcome: Welcome) -> bool:
        """Send `welcome` to `peer`; False when its connection is gone."""
        try:
            self.sock.send_multipart([peer, msgspec.json.encode(welcome)])
        except zmq.ZMQError as e:
            if e.errno != zmq.EHOSTUNREACH:
                raise
            return False
        return True

    def refuse_late(self) -> None:
        """Answer, without blocking, each `Attach` that came after the group formed (a second
        rank R, or one restarted while this rank 0 still runs): refused, naming why, so the
        rank exits at once instead of waiting unanswered. A repeat from an attached rank's
        own connection is dropped."""
        while self.sock.poll(0):
            peer, raw = self.sock.recv_multipart()[:2]
            try:
                hello = msgspec.json.decode(raw, type=Attach)
            except msgspec.MsgspecError:
                continue
            if peer in self.peers.values():
                continue
            error = (
                f"rank {hello.rank}: every rank of this group is attached; a rank's place frees when its link "
                f"closes (rank 0 then restarts, within {HEARTBEAT_S[1]:.0f} s of a rank that stopped answering)"
            )
            self._answer(peer, Welcome(None, error))

    def send(self, raw: bytes) -> None:
        """Send one encoded ToWorker message to every attached rank. A rank whose connection
        is gone (seen here before the monitor thread sees it) is reported to the `watch`
        callback, and the others still get the message."""
        for rank, peer in self.peers.items():
            try:
                self.sock.send_multipart([peer, raw])
            except zmq.ZMQError as e:
                if e.errno != zmq.EHOSTUNREACH:
                    raise
                self._report(rank)

    def close(self, linger_ms: int = 0) -> None:
        """Close the socket without reporting the ranks its closing disconnects, and stop
        its monitor and ZAP threads (so that the context can then be terminated). Frames
        still queued for the ranks (the `WorkerShutdown` sent at exit) are delivered for up
        to `linger_ms` milliseconds, by the context's termination."""
        with self._lock:
            self._on_lost = lambda rank: None
        self.sock.disable_monitor()
        self._watcher.join(5)
        self.sock.close(linger=linger_ms)
        self.auth.stop()


def attach(
    ctx: zmq.Context, addr: str, key_file: str, rank: int, timeout_s: float = ATTACH_TIMEOUT_S
) -> tuple[zmq.Socket, ServerArgs]:
    """A rank's side: connect to rank 0 at `addr` with the CURVE key of `key_file`, send
    `Attach`, and return (the socket the ToWorker messages then arrive on, the server's
    args). Raises `TimeoutError` when rank 0 does not answer within `timeout_s` (not
    started, or unreachable), `RuntimeError` when it refuses the rank or its key."""
    host, port = parse_addr(addr)
    public, secret = read_key(key_file)
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    sock.setsockopt(zmq.HEARTBEAT_IVL, int(HEARTBEAT_S[0] * 1000))
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(HEARTBEAT_S[1] * 1000))
    sock.curve_serverkey = public
    sock.curve_publickey = public
    sock.curve_secretkey = secret
    # its own inproc address: watch_link's monitor comes next, before this one is surely unbound
    mon = sock.get_monitor_socket(zmq.EVENT_CONNECTED | HANDSHAKE_FAILED, addr=f"inproc://lazyserve-attach-{id(sock)}")
    sock.connect(f"tcp://{host}:{port}")
    try:
        try:
            welcome = _await_welcome(sock, mon, rank, addr, time.monotonic() + timeout_s)
        finally:
            sock.disable_monitor()
            mon.close(linger=0)
    except BaseException:
        sock.close()
        raise
    if welcome.args is None:
        sock.close()
        raise RuntimeError(f"rank 0 refused rank {rank}: {welcome.error}")
    return sock, welcome.args


def _await_welcome(sock: zmq.Socket, mon: zmq.Socket, rank: int, addr: str, deadline: float) -> Welcome:
    """Send `Attach` (with the connection's local port) each time the monitor `mon` of
    `sock` reports a connection: again after a reconnect, since a rank 0 that restarted never
    saw the first; return rank 0's `Welcome`. Raises `RuntimeError` when the CURVE handshake
    fails `KEY_FAILURES` times (another key file than rank 0's), `TimeoutError` when no answer
    comes before `deadline` (monotonic s)."""
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(mon, zmq.POLLIN)
    failures = 0
    while (left := deadline - time.monotonic()) > 0:
        ready = dict(poller.poll(int(left * 1000) + 1))
        if sock in ready:
            return msgspec.json.decode(sock.recv(), type=Welcome)
        if mon not in ready:
            continue
        event = recv_monitor_message(mon)
        if event["event"] & HANDSHAKE_FAILED:
            failures += 1
            if failures >= KEY_FAILURES:
                raise RuntimeError(
                    f"rank 0 at {addr} refused this rank's CURVE key: --dist-key-file must be a "
                    f"copy of rank 0's key file (or {addr} is not a lazyserve rank 0)"
                )
            continue
        try:
            with socket.socket(fileno=os.dup(int(event["value"]))) as conn:
                local_port = conn.getsockname()[1]
        except OSError:
            continue  # that connection closed at once: zmq retries
        sock.send(msgspec.json.encode(Attach(rank, PROTOCOL_VERSION, local_port)))
    raise TimeoutError(f"rank 0 at {addr} did not answer within the attach timeout (not started yet, or unreachable)")


def watch_link(sock: zmq.Socket, on_lost: Callable[[], None]) -> threading.Thread:
    """Call `on_lost` (from a daemon thread) once the connection of `sock` (from `attach`)
    to rank 0 closes: rank 0 exited or its host stopped answering the heartbeats. A rank
    blocked in a collective would wait for the dead group forever; `main_attached` exits
    instead, so that a supervisor (or the user) restarts it and it attaches to the next rank 0.
    Returns the started thread."""
    mon = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    def run() -> None:
        try:
            while recv_monitor_message(mon)["event"] != zmq.EVENT_DISCONNECTED:
                pass
        except zmq.ZMQError:
            return  # the context is terminating
        finally:
            mon.close(linger=0)
        on_lost()

    thread = threading.Thread(target=run, name="tp-link watch", daemon=True)
    thread.start()
    return thread
