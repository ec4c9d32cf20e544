"""`TokenizerManager`: per-request state in the HTTP process and its ZeroMQ links.

Each request gets an asyncio queue; one background task receives `BatchStrOut`/`ReqError`
from the detokenizers and the scheduler and routes rows to the queues by rid. A request
whose consumer goes away (client disconnect, cancelled task) is aborted in the scheduler.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import AsyncIterator

import msgspec
import zmq
import zmq.asyncio

from protocol import codec, endpoints
from protocol.enums import FinishReason
from protocol.messages import AbortReq, BatchStrOut, GenerateReq, ReqError, ServerReady, TokenizerShutdown
from tokenizer_proc.errors import APIError


@dataclass
class Delta:
    """One step of one request: new text, the cumulative completion token count, and the
    finish reason and matched stop once it ended."""

    text: str
    completion_tokens: int
    finish_reason: FinishReason | None = None
    matched_stop: str | int | None = None
    cached_tokens: int = 0


class TokenizerManager:
    """Sends requests to the scheduler and yields their `Delta`s."""

    def __init__(self, run_dir: str, log) -> None:
        self.log = log
        self.ctx = zmq.asyncio.Context()
        self.to_scheduler = self.ctx.socket(zmq.PUSH)
        self.to_scheduler.connect(endpoints.scheduler(run_dir))
        self.inbox = self.ctx.socket(zmq.PULL)
        self.inbox.bind(endpoints.tokenizer(run_dir))
        self.queues: dict[str, asyncio.Queue] = {}
        self.ready = False
        self.stopping = False
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        """Start the receive loop on the running event loop."""
        self._task = asyncio.get_running_loop().create_task(self._recv_loop())

    async def _recv_loop(self) -> None:
        while True:
            raw = await self.inbox.recv()
            try:
                msg = codec.to_tokenizer.decode(raw)
            except msgspec.MsgspecError as e:
                self.log.error("bad message on tokenizer inbox", error=str(e))
                continue
            if isinstance(msg, BatchStrOut):
                for i, rid in enumerate(msg.rids):
                    q = self.queues.get(rid)
                    if q is not None:
                        matched = msg.matched_stop[i] if i < len(msg.matched_stop) else None
                        cached = msg.cached_tokens[i] if i < len(msg.cached_tokens) else 0
                        q.put_nowait(Delta(msg.text_deltas[i], msg.completion_tokens[i], msg.finish_reasons[i], matched,
                                           cached))
            elif isinstance(msg, ReqError):
                q = self.queues.get(msg.rid)
                if q is not None:
                    q.put_nowait(APIError(msg.message, msg.status))
            elif isinstance(msg, ServerReady):
                self.ready = True
            elif isinstance(msg, TokenizerShutdown):
                self.stopping = True

    async def generate(self, req: GenerateReq) -> AsyncIterator[Delta]:
        """Send `req` and yield its deltas until it finishes.

        Raises `APIError` when the server reports an error for it or is shutting down.
        Leaving the iteration early (disconnect) aborts the request in the scheduler.
        """
        if self.stopping:
            raise APIError("server is shutting down", 503)
        if req.rid in self.queues:
            raise APIError(f"request id {req.rid!r} is already in use", 400, "rid")
        if req.max_new_tokens == 0:
            yield Delta("", 0, FinishReason.LENGTH)
            return
        q: asyncio.Queue = asyncio.Queue()
        self.queues[req.rid] = q
        finished = False
        try:
            await self.to_scheduler.send(codec.encoder.encode(req))
            while True:
                item = await q.get()
                if isinstance(item, APIError):
                    finished = True
                    raise item
                if item.finish_reason is not None:
                    finished = True
                yield item
                if finished:
                    return
        finally:
            self.queues.pop(req.rid, None)
            if not finished:
                self.to_scheduler.send(codec.encoder.encode(AbortReq(req.rid)))

    def fail_all(self, message: str, status: int = 503) -> None:
        """Answer every request still waiting with an error (shutdown); new ones are refused."""
        self.stopping = True
        for q in self.queues.values():
            q.put_nowait(APIError(message, status))

    def close(self) -> None:
        """Stop receiving and close the sockets."""
        if self._task is not None:
            self._task.cancel()
        self.ctx.destroy(linger=0)
