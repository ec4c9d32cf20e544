"""`Outbox`: where the scheduler's decisions go; `SocketOutbox` in the process, lists in tests."""

from __future__ import annotations

from typing import Protocol

import zmq

from protocol import codec, endpoints
from protocol.config import ServerArgs
from protocol.messages import ToDetokenizer, ToTokenizer, ToWorker


class Outbox(Protocol):
    """The three outgoing channels of the scheduler, and the links to detokenizer replicas."""

    def to_worker(self, msg: ToWorker) -> None:
        """Send one message to the worker."""

    def to_detokenizer(self, index: int, msg: ToDetokenizer) -> None:
        """Send one message to detokenizer replica `index`."""

    def to_tokenizer(self, msg: ToTokenizer) -> None:
        """Send one message to the tokenizer process."""

    def connect_detokenizer(self, index: int, endpoint: str) -> None:
        """Open the link to replica `index`, which listens on `endpoint` (replacing any old link)."""

    def disconnect_detokenizer(self, index: int, flush: bool = False) -> None:
        """Close the link to replica `index`; unsent messages are dropped unless `flush`."""


class SocketOutbox:
    """`Outbox` over ZeroMQ PUSH sockets."""

    def __init__(self, ctx: zmq.Context, args: ServerArgs) -> None:
        self.worker_endpoint = endpoints.worker(args.run_dir)
        self.worker = ctx.socket(zmq.PUSH)
        self.worker.connect(self.worker_endpoint)
        self.tokenizer = ctx.socket(zmq.PUSH)
        self.tokenizer.connect(endpoints.tokenizer(args.run_dir))
        self.ctx = ctx
        self.detoks: dict[int, zmq.Socket] = {}
        for i in range(args.detokenizers):
            self.connect_detokenizer(i, endpoints.detokenizer(args.run_dir, i))

    def to_worker(self, msg: ToWorker) -> None:
        self.worker.send(codec.encoder.encode(msg))

    def reset_worker(self) -> None:
        """Drop every message still queued for the worker and open a fresh link: the worker
        died, and its replacement must not receive what was meant for it."""
        self.worker.close(linger=0)
        self.worker = self.ctx.socket(zmq.PUSH)
        self.worker.connect(self.worker_endpoint)

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

    def close(self, linger_ms: int) -> None:
        """Close every link: the tokenizer's at once (launch stops the HTTP front first, so
        nothing queued for it can be delivered), the others once their queued messages (the
        shutdowns) are delivered or after `linger_ms` milliseconds."""
        self.tokenizer.close(linger=0)
        for sock in (self.worker, *self.detoks.values()):
            sock.close(linger=linger_ms)
