"""Receiving sockets: every process binds its PULL endpoints through `bind_pull`.

A bound socket drops frames over `MAX_FRAME_BYTES`: ZeroMQ reads the size in the frame's
header and closes that connection before allocating the frame (``ZMQ_MAXMSGSIZE``), so a
peer cannot make a process buffer an arbitrary amount of memory; a sender that reconnects
goes on. The limit is far above any message a request can produce: a `GenerateReq` is
about the size of its HTTP body (at most ``--max-request-body-bytes``, which launch keeps
under `MAX_FRAME_BYTES` / 4), a launch's result with prompt logprobs about 1 KB per prefilled
token of the launch.
"""

from __future__ import annotations

import zmq

MAX_FRAME_BYTES = 256 * 1024 * 1024
"""Frames larger than this are dropped by ZeroMQ on every bound socket."""


def bind_pull(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    """A PULL socket of `ctx` (plain or asyncio) bound at `endpoint`, dropping frames over
    `MAX_FRAME_BYTES`. Raises `zmq.ZMQError` when the endpoint cannot be bound."""
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    sock.bind(endpoint)
    return sock
