"""Receiving sockets: every process binds its PULL endpoints through `bind_pull`.

A bound socket drops frames over `MAX_FRAME_BYTES`: ZeroMQ reads the size in the frame's
header and closes that connection before allocating the frame (``ZMQ_MAXMSGSIZE``), so a
peer cannot make a process buffer an arbitrary amount of memory (the frame, and what the
sender had queued behind it, is lost; the sender reconnects). ZeroMQ says nothing to the
receiver when it does that, so each bound socket is watched (`_watch_links`): every closed
link is logged with its endpoint. Most are a peer that exited, closed its socket or detached;
one whose peer still runs is the only trace of a dropped frame (it cannot be told apart from
a peer's short-lived link: both show as a close, then a new link).
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


def _watch_links(ctx: zmq.Context, sock: zmq.Socket, endpoint: str) -> None:
    """Log each link of `sock` that closes (ZeroMQ's ``EVENT_DISCONNECTED``), from a daemon
    thread reading the socket's monitor: at info while the server runs, at debug once the run
    directory holds `endpoints.STOPPING_FILE` (the server stopping). The thread ends when the
    socket closes (its monitor stops) or its context terminates, closing its own socket so the
    context can."""
    address = f"inproc://lazyserve-monitor-{next(_monitors)}"
    sock.monitor(address, zmq.EVENT_DISCONNECTED)
    mon = zmq.Context.shadow(ctx.underlying).socket(zmq.PAIR)  # plain sockets, also for an asyncio ctx
    mon.connect(address)
    marker = stopping_marker(endpoint)

    def run() -> None:
        log = structlog.get_logger()
        try:
            while recv_monitor_message(mon)["event"] != zmq.EVENT_MONITOR_STOPPED:
                if marker is not None and marker.exists():
                    log.debug("peer connection closed", endpoint=endpoint, note="the server is stopping")
                else:
                    log.info(
                        "peer connection closed",
                        endpoint=endpoint,
                        note="a peer that exited or closed its socket (normal when a process stops or a "
                        "replica detaches)",
                    )
        except zmq.ZMQError:
            pass  # the context is terminating
        finally:
            mon.close(linger=0)

    threading.Thread(target=run, name=f"zmq-monitor {endpoint}", daemon=True).start()
