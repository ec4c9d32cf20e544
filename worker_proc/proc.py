"""The worker process: receives ToWorker messages and runs them on one thread."""

from __future__ import annotations

import os
import signal
import time

import msgspec
import zmq

from protocol import codec, endpoints
from protocol.config import ServerArgs
from protocol.enums import Role
from protocol.messages import (
    ChainDecode,
    Finalize,
    Launch,
    LaunchResult,
    StoreKV,
    WorkerAbort,
    WorkerReady,
    WorkerShutdown,
)
from protocol.process import Handshake, configure_logging, start_child
from worker_proc.blas import is_fast, loaded_blas

POLL_MS = 100


def _blas_report(log) -> str:
    import mlx.core as mx

    device = str(mx.default_device())
    if mx.default_device() != mx.cpu:
        return f"device={device}"
    preload = os.environ.get("LD_PRELOAD", "")
    libs = loaded_blas()
    if preload and preload in libs and is_fast([preload]):
        log.info("cpu BLAS preloaded", library=preload)
        return f"device={device} blas={preload}"
    log.warning("cpu BLAS is the slow reference one (about 30x slower matmul); install the mkl wheel "
                "or Debian's libopenblas0-pthread", libraries=libs)
    return f"device={device} blas=reference"


class WorkerProcess:
    """Loads the model, then serves launches until shutdown."""

    def __init__(self, args: ServerArgs, log) -> None:
        from worker_proc.kv_pool import KVPool, bytes_per_token, pool_size
        from worker_proc.model_loader import load, parameter_bytes
        from worker_proc.model_runner import ModelRunner
        from worker_proc.trace import StepTrace

        self.log = log
        t0 = time.perf_counter()
        loaded = load(args.model, args.load_format)
        self.info = (
            f"model={args.model.path} layers={loaded.num_layers} dtype={loaded.dtype} "
            f"weights={parameter_bytes(loaded.model) / 2**20:.0f}MiB load_s={time.perf_counter() - t0:.1f} "
            + _blas_report(log)
        )
        slots = pool_size(loaded.model, loaded.dtype, args.max_total_tokens, args.mem_fraction_static)
        per_token = bytes_per_token(loaded.model, loaded.dtype)
        pool = KVPool(loaded.model, slots, loaded.dtype)
        context = args.context_length or int(loaded.config.get("max_position_embeddings") or 8192)
        self.ready_msg = WorkerReady(slots, per_token, context)
        self.info += f" kv_pool_tokens={slots} kv_pool_bytes={slots * per_token} ({slots * per_token / 2**30:.2f} GiB)"
        log.info("KV pool", tokens=slots, bytes=slots * per_token, bytes_per_token=per_token)
        self.runner = ModelRunner(loaded, StepTrace.from_env(), pool)
        self.ctx = zmq.Context()
        self.inbox = self.ctx.socket(zmq.PULL)
        self.inbox.bind(endpoints.worker(args.run_dir))
        self.results = self.ctx.socket(zmq.PUSH)
        self.results.connect(endpoints.worker_results(args.run_dir))
        self.results.send(codec.encoder.encode(self.ready_msg))
        self.stopping = False

    def _launch(self, msg: Launch) -> None:
        try:
            self.runner.launch(msg.launch_id, msg.mode, msg.batch)
        except Exception as e:  # kept in the pending; reported at finalize
            self.log.error("launch failed", launch_id=msg.launch_id, error=str(e))

    def _chain(self, msg: ChainDecode) -> None:
        try:
            self.runner.chain_decode(msg.launch_id, msg.prev_launch_id)
        except Exception as e:  # kept in the pending; reported at finalize
            self.log.error("chained decode failed", launch_id=msg.launch_id, error=str(e))

    def _finalize(self, msg: Finalize) -> None:
        try:
            rids, ids = self.runner.finalize(msg.launch_id)
            reply = LaunchResult(msg.launch_id, rids, ids)
        except KeyError:
            reply = LaunchResult(msg.launch_id, [], [], f"unknown launch id {msg.launch_id}")
        except Exception as e:
            reply = LaunchResult(msg.launch_id, [], [], f"{type(e).__name__}: {e}")
        self.results.send(codec.encoder.encode(reply))

    def run(self) -> None:
        """Serve until `WorkerShutdown` or SIGTERM."""
        while not self.stopping:
            if not self.inbox.poll(POLL_MS):
                continue
            try:
                msg = codec.to_worker.decode(self.inbox.recv())
            except msgspec.MsgspecError as e:
                self.log.error("bad message on worker inbox", error=str(e))
                continue
            if isinstance(msg, ChainDecode):
                self._chain(msg)
            elif isinstance(msg, Launch):
                self._launch(msg)
            elif isinstance(msg, Finalize):
                self._finalize(msg)
            elif isinstance(msg, StoreKV):
                try:
                    self.runner.store(msg.rids, msg.starts, msg.slots)
                except ValueError as e:
                    self.log.error("StoreKV failed", error=str(e))
            elif isinstance(msg, WorkerAbort):
                self.runner.abort(msg.rids)
            elif isinstance(msg, WorkerShutdown):
                self.stopping = True
        dropped = self.runner.discard()
        if dropped:
            self.log.info("discarded in-flight launches at shutdown", count=dropped)


def main(run_dir: str) -> None:
    """Entry point: ``python -m worker_proc RUN_DIR``."""
    start_child("lazyserve::worker")
    args = ServerArgs.load(run_dir)
    log = configure_logging(args.log_level, args.log_format, proc="worker")
    hs = Handshake(zmq.Context.instance(), run_dir, Role.WORKER)
    try:
        proc = WorkerProcess(args, log)
    except Exception as e:
        hs.failed(e)
        hs.close()
        raise SystemExit(1) from e
    signal.signal(signal.SIGTERM, lambda *_: setattr(proc, "stopping", True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    hs.ready(proc.info)
    hs.close()
    proc.run()
    log.info("worker stopped")
