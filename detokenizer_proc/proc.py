"""A detokenizer replica process: ToDetokenizer in, ToTokenizer (and stop aborts) out."""

from __future__ import annotations

import signal

import msgspec
import zmq

from protocol import codec, endpoints
from protocol.config import ServerArgs
from protocol.enums import Role
from protocol.messages import BatchTokenOut, DetokAbort, DetokSeed, DetokShutdown
from protocol.process import Handshake, configure_logging, start_child
from detokenizer_proc.manager import DetokenizerManager

POLL_MS = 100


def main(run_dir: str, index: int) -> None:
    """Entry point: ``python -m detokenizer_proc RUN_DIR INDEX``."""
    start_child(f"lazyserve::detokenizer-{index}")
    args = ServerArgs.load(run_dir)
    log = configure_logging(args.log_level, args.log_format, proc=f"detokenizer-{index}")
    ctx = zmq.Context.instance()
    hs = Handshake(ctx, run_dir, Role.DETOKENIZER, index)
    try:
        from tokenizer_proc.hf_tokenizer import load_tokenizer

        manager = DetokenizerManager(load_tokenizer(args.model))
        inbox = ctx.socket(zmq.PULL)
        inbox.bind(endpoints.detokenizer(run_dir, index))
        to_tokenizer = ctx.socket(zmq.PUSH)
        to_tokenizer.connect(endpoints.tokenizer(run_dir))
        to_scheduler = ctx.socket(zmq.PUSH)
        to_scheduler.connect(endpoints.scheduler(run_dir))
    except Exception as e:
        hs.failed(e)
        hs.close()
        raise SystemExit(1) from e
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    hs.ready()
    hs.close()
    while not stopping:
        if not inbox.poll(POLL_MS):
            continue
        try:
            msg = codec.to_detokenizer.decode(inbox.recv())
        except msgspec.MsgspecError as e:
            log.error("bad message on detokenizer inbox", error=str(e))
            continue
        if isinstance(msg, BatchTokenOut):
            out, stops = manager.tokens(msg)
            if out is not None:
                to_tokenizer.send(codec.encoder.encode(out))
            for s in stops:
                to_scheduler.send(codec.encoder.encode(s))
        elif isinstance(msg, DetokSeed):
            manager.seed(msg)
        elif isinstance(msg, DetokAbort):
            manager.abort(msg)
        elif isinstance(msg, DetokShutdown):
            break
    log.info("detokenizer stopped")
