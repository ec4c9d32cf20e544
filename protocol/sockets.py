"""Receiving sockets: every process binds its PULL endpoints through `bind_pull`.

A bound socket drops frames over `MAX_FRAME_BYTES`: ZeroMQ reads the size in the frame's
header and closes that connection before allocating the frame (``ZMQ_MAXMSGSIZE``), so a
peer cannot make a process buffer an arbitrary amount of memory (the sender keeps the frame
queued, reconnects and sends it again). ZeroMQ says nothing to the receiver when it does
that, so each bound socket is watched (`_watch_links`): a link that closes is logged with its
endpoint, as a peer that left, or, when the peer is back at once, as a frame over the limit.
Once the server stops (launch wrote `endpoints.STOPPING_FILE`), closed links are processes
stopping, logged at debug only: a normal Ctrl-C logs no line that reads like a fault.
So that such a line means something, the processes keep their links open while they run
(the start-up handshake's too, `protocol.process.Handshake`, and launch's link to the HTTP
process): a start closes none, and launch stops reading its control socket before it stops
the children. The limit is far above any message a request can produce: a `GenerateReq` is
about the size of its HTTP body (at most ``--max-request-body-bytes``, which launch keeps
under `MAX_FRAME_BYTES` / 4), a launch's result with prompt logprobs about 1 KB per prefilled
token of the launch.
"""

from __future__ import annotations

import itertools
import threading
import time

import structlog
import zmq
from zmq.utils.monitor import recv_monitor_message

from protocol.endpoints import stopping_marker

MAX_FRAME_BYTES = 256 * 1024 * 1024
"""Frames larger than this are dropped by ZeroMQ on every bound socket."""


def bind_pull(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    """A PULL socket of `ctx` (plain or asyncio) bound at `endpoint`, dropping frames over
    `MAX_FRAME_BYTES`. Raises `zmq.ZMQError` when the endpoint cannot be bound."""
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    sock.bind(endpoint)
    _watch_links(ctx, sock, endpoint)
    return sock


_monitors = itertools.count()

RECONNECT_WINDOW_S = 1.0
"""A link that closes and is accepted again within this many seconds is a live peer whose frame
went over `MAX_FRAME_BYTES` (ZeroMQ keeps the frame queued at the sender, which reconnects and
sends it again, and again); one that stays closed is a peer that exited or closed its socket."""
REPEAT_WARNING_S = 60.0
"""The warning of a peer resending an oversized frame is repeated at most this often, with
how many times it came back meanwhile."""


def _watch_links(ctx: zmq.Context, sock: zmq.Socket, endpoint: str) -> None:
    """Log each link of `sock` that closes (ZeroMQ's ``EVENT_DISCONNECTED``), from a daemon
    thread reading the socket's monitor: a peer that left (no new link within
    `RECONNECT_WINDOW_S`) at info, or at debug once the run directory holds
    `endpoints.STOPPING_FILE` (the server stopping); a peer that came back at once, which is
    one whose frame went over `MAX_FRAME_BYTES`, at warning (at most every
    `REPEAT_WARNING_S`). The thread ends when the socket closes (its monitor stops) or its
    context terminates, closing its own socket so the context can."""
    address = f"inproc://lazyserve-monitor-{next(_monitors)}"
    sock.monitor(address, zmq.EVENT_DISCONNECTED | zmq.EVENT_ACCEPTED)
    mon = zmq.Context.shadow(ctx.underlying).socket(zmq.PAIR)  # plain sockets, also for an asyncio ctx
    mon.connect(address)
    marker = stopping_marker(endpoint)

    def left(log: structlog.BoundLogger) -> None:
        if marker is not None and marker.exists():
            log.debug("peer connection closed", endpoint=endpoint, note="the server is stopping")
        else:
            log.info("peer connection closed", endpoint=endpoint, note="a peer that exited or closed its socket")

    def run() -> None:
        log = structlog.get_logger()
        closed_at: float | None = None  # a close not yet told apart
        warned_at, returns = -REPEAT_WARNING_S, 0
        try:
            while True:
                if closed_at is not None:
                    wait_s = max(0.0, closed_at + RECONNECT_WINDOW_S - time.monotonic())
                    if not mon.poll(int(wait_s * 1000)):
                        left(log)
                        closed_at = None
                        continue
                event = recv_monitor_message(mon)["event"]
                if event == zmq.EVENT_MONITOR_STOPPED:
                    break
                if event == zmq.EVENT_DISCONNECTED:
                    if closed_at is not None:
                        left(log)
                    closed_at = time.monotonic()
                elif closed_at is not None:  # accepted at once: the same peer, resending what was refused
                    closed_at, returns = None, returns + 1
                    if time.monotonic() - warned_at >= REPEAT_WARNING_S:
                        log.warning("peer frame over the limit", endpoint=endpoint, max_bytes=MAX_FRAME_BYTES,
                                    times=returns, note="ZeroMQ closes the link of a frame over max_bytes; the peer "
                                    "keeps the frame queued and sends it again each time it reconnects")
                        warned_at, returns = time.monotonic(), 0
            if closed_at is not None:
                left(log)
        except zmq.ZMQError:
            pass  # the context is terminating
        finally:
            mon.close(linger=0)

    threading.Thread(target=run, name=f"zmq-monitor {endpoint}", daemon=True).start()
