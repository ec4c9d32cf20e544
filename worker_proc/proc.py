"""The worker process: receives ToWorker messages and runs them on one thread.

With ``--tp N`` it is one rank of N (`worker_proc.tp.sharding` describes the design):
rank 0 takes the scheduler's messages, forwards each to the other ranks and replies; the
others take rank 0's and reply to no one."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

import msgspec
import setproctitle
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
from protocol.process import EXIT_RANK_LOST, Handshake, configure_logging, exit_now, install_stop_handlers, start_child
from protocol.sockets import bind_pull
from worker_proc.cpu import blas_threads
from worker_proc.cpu.blas import PREFILL_THREADS_VAR, is_fast, loaded_blas, preload_env, thread_report
from worker_proc.finalize_order import FinalizeOrder

RING_ERROR = "[ring]"
"""How MLX's ring backend starts the message of a failed collective (e.g. ``[ring]
connection to a peer was lost``)."""

POLL_MS = 100
PEEK_MS = 5
"""How long a ChainDecode run finalize-early waits for the Finalize the scheduler sends
right behind it (it is normally already there)."""
LINK_GRACE_S = 5.0
"""A rank started by hand whose link to rank 0 closed waits this long for the WorkerShutdown
rank 0 sent before exiting; without it, it exits 1 (`main_attached`)."""


def _title(rank: int) -> str:
    """The process title of a worker rank: ``lazyserve::worker`` for rank 0 (or no TP)."""
    return "lazyserve::worker" + (f"-rank{rank}" if rank else "")


def _reexec_with_cpu_blas(blas: str, blas_env: dict[str, str], argv: list[str]) -> None:
    """When MLX runs on the CPU, re-execute this process (same pid, ``python -m worker_proc
    *argv``) with the fast BLAS `blas` (launch found it: `ServerArgs.blas`) preloaded and its
    thread settings `blas_env`; returns when there is nothing to do: MLX runs on a GPU, or
    this is the re-execution (`worker_proc.cpu.blas.preload_env`). Raises `OSError` when the
    re-execution fails."""
    import mlx.core as mx

    env = preload_env(blas, mx.default_device() == mx.gpu, blas_env, dict(os.environ))
    if env is not None:
        os.execve(sys.executable, [sys.executable, "-m", "worker_proc", *argv], env)


def _blas_report(log, prefill: blas_threads.PrefillThreads | None) -> str:
    """``device=... blas=... blas_threads=...`` for the ready line; logs the device and the
    BLAS decision. `prefill`: the prefill thread choice the runner gets (None: prefills keep
    the decode count, so the report leaves `PREFILL_THREADS_VAR` out, with a warning when
    the environment asked for it)."""
    import mlx.core as mx

    device = str(mx.default_device())
    if mx.default_device() != mx.cpu:
        log.info("device", device=device, cpu_blas="not preloaded (MLX runs on a GPU)")
        return f"device={device} blas=none(gpu)"
    preload = os.environ.get("LD_PRELOAD", "")
    libs = loaded_blas()
    if preload and preload in libs and is_fast([preload]):
        env = dict(os.environ)
        if prefill is None and env.pop(PREFILL_THREADS_VAR, None) is not None:
            log.warning(
                "prefills keep the decode BLAS thread count: no thread-count setter in the BLAS, or no "
                "/proc/stat to measure idle cores",
                blas=preload,
            )
        threads = thread_report(preload, env)
        log.info("device", device=device, cpu_blas=preload, threads=threads)
        return f"device={device} blas={preload} {threads}"
    log.warning(
        "cpu BLAS is the slow reference one (about 30x slower matmul); install the mkl wheel "
        "or Debian's libopenblas0-pthread",
        device=device,
        libraries=libs,
    )
    return f"device={device} blas=reference"


def _decode_graph(args: ServerArgs, model, log):
    """The `DecodeGraph` decodes replay, or None when `--disable-decode-graph` is given or
    the model cannot be captured (logged)."""
    from worker_proc.model.decode_graph import DecodeGraph, default_graph_max_bs, supports

    if args.disable_decode_graph:
        log.info("decode graph off", reason="--disable-decode-graph")
        return None
    if not supports(model):
        log.warning(
            "decode graph off: this architecture is not captured; decode steps run uncompiled",
            model_type=getattr(model.args, "model_type", "?"),
        )
        return None
    return DecodeGraph(model, args.decode_graph_max_bs or default_graph_max_bs(args.max_running_requests))


def check_state_flags(args: ServerArgs, loaded) -> None:
    """Refuse the state-snapshot flags for a model without recurrent or sliding-window
    layers (DESIGN.md §4: a flag the model cannot honour is refused at start-up, never
    ignored). Raises `ValueError` naming the flag and the architecture."""
    if loaded.caches.snapshot:
        return
    for flag, given in (
        ("--enable-mamba-extra-buffer", args.enable_mamba_extra_buffer),
        ("--mamba-cache-chunk-size", args.mamba_cache_chunk_size > 0),
    ):
        if given:
            raise ValueError(
                f"{flag} is for models with recurrent or sliding-window layers; architecture "
                f"{loaded.config.get('model_type')!r} has none (its layers keep full attention KV only): "
                f"leave {flag} out"
            )


def _state_pool(args: ServerArgs, loaded, kv_tokens: int, available_bytes: int, log):
    """The snapshot pool of a model with recurrent or sliding-window layers (logged), or
    None: no such layers, or no prefix cache (``--disable-radix-cache``)."""
    from worker_proc.memory.state_pool import StatePool, size_state_pool, state_rows

    if not loaded.caches.snapshot or args.disable_radix_cache:
        return None
    rows = state_rows(loaded.model, loaded.caches)
    per_slot = StatePool.bytes_per_slot(rows)
    size = size_state_pool(kv_tokens, args.state_interval, args.max_running_requests, available_bytes, per_slot)
    pool = StatePool(loaded.caches, rows, size) if size else None
    log.info(
        "state pool",
        slots=size,
        bytes=size * per_slot,
        bytes_per_slot=per_slot,
        allocated_bytes=pool.allocated_slots() * per_slot if pool else 0,
        allocation=f"{pool.segments} segment(s) of up to {pool.segment} slots, each allocated when a snapshot "
        "is first saved into it (the first at start)"
        if pool
        else "none",
        interval=args.state_interval,
        recurrent_layers=len(loaded.caches.state),
        window_layers=len(loaded.caches.window),
        extra_buffer=args.enable_mamba_extra_buffer,
    )
    return pool


class WorkerProcess:
    """Loads the model, then serves launches until shutdown. generation: which start of the
    worker this is (launch counts restarts), sent with `WorkerReady` and every result;
    rank: this process's rank of the ``--tp`` group (0 without TP); inbox: where a rank started
    by hand (``--attach``) receives rank 0's messages (`tp.link.attach`), None otherwise."""

    forwarder = None
    """Rank 0 of a ``--tp`` group: its `tensor_parallel.RankForwarder` to the other ranks."""

    def __init__(
        self, args: ServerArgs, log, generation: int = 0, rank: int = 0, inbox: zmq.Socket | None = None
    ) -> None:
        import mlx.core as mx

        from worker_proc.cpu.activations import install as install_fast_activations
        from worker_proc.logits.custom import load_processors
        from worker_proc.memory.kv_pool import KVPool, bytes_per_token
        from worker_proc.memory.kv_sizing import memory_offered, size_pool
        from worker_proc.model.forward import head_check, prefill_step
        from worker_proc.model.fused_projections import fuse_projections
        from worker_proc.model.loader import config_value, load, parameter_bytes
        from worker_proc.model.mlx_lm_range import outside_tested
        from worker_proc.model.runner import ModelRunner
        from worker_proc.model.shape_warmup import warm_shapes
        from worker_proc.model.warmup import warm_up
        from worker_proc.spec.verify import unsupported
        from worker_proc.tp.link import RankServer
        from worker_proc.tp.setup import ranks_on_host, read_hostfile
        from worker_proc.tp.sharding import RankForwarder, agree_min, check_shardable, init_group, shard
        from worker_proc.trace import StepTrace

        self.log = log
        self.stopping = False  # read by `_rank_lost`, which `RankServer.watch` may call from here on
        self.ctx = zmq.Context()
        link = None
        if args.hostfile and not rank:  # the other ranks, started by hand, attach and get the args
            link = RankServer(self.ctx, args.dist_init_addr, args.dist_key_file)
            log.info(
                "waiting for the ranks started by hand", ranks=list(range(1, args.tp)), address=args.dist_init_addr
            )
            link.wait_ranks(range(1, args.tp), msgspec.structs.replace(args, api_key=""))
            link.watch(self._rank_lost)
        if (untested := outside_tested()) is not None:
            log.warning(untested)
        t0 = time.perf_counter()
        if args.load_format == "dummy":
            mx.random.seed(0)  # the same random weights in every run and on every --tp rank
        loaded = load(args.model, args.load_format, check=lambda config: check_shardable(config, args.tp))
        check_state_flags(args, loaded)
        if args.speculative_algorithm and (why := unsupported(loaded.caches)):
            raise ValueError(f"--speculative-algorithm {args.speculative_algorithm}: {why}")
        group = None
        if args.tp > 1:
            group = init_group(args.dist_backend, args.tp)
            shard(loaded, group)
            log.info(
                "tensor parallel",
                rank=rank,
                ranks=args.tp,
                backend=args.dist_backend,
                kv_heads=loaded.model.args.num_key_value_heads,
            )
        fused = 0 if args.disable_fused_projections else fuse_projections(loaded.model)
        fast = [] if args.disable_fast_activations else install_fast_activations(loaded.model)
        plain, why = head_check(loaded.model)  # on every --tp rank alike: the probe may be a collective call
        if not plain:
            log.warning(
                "slow path: logits for every prefill position (the LM head is not split off the model's call)",
                model_type=loaded.config.get("model_type"),
                why=why,
            )
        prefill_threads = blas_threads.from_env(dict(os.environ))
        self.info = (
            f"model={args.model.path} layers={loaded.num_layers} recurrent_layers={len(loaded.caches.state)} "
            f"window_layers={len(loaded.caches.window)} "
            f"dtype={loaded.dtype} fused_projection_groups={fused} fast_swiglu_modules={','.join(fast) or 'none'} "
            f"last_position_logits={plain} "
            f"weights={parameter_bytes(loaded.model) / 2**20:.0f}MiB load_s={time.perf_counter() - t0:.1f} "
            + _blas_report(log, prefill_threads)
        )
        if not loaded.pads_exactly:
            log.warning(
                "batched prefill without padding: this architecture's recurrent layers do not keep a "
                "right-padded row's state, so only prompts of equal length are prefilled together",
                model_type=loaded.config.get("model_type"),
            )
        context = args.context_length or int(config_value(loaded.config, "max_position_embeddings") or 8192)
        per_token = bytes_per_token(loaded.model, loaded.dtype)
        mx.clear_cache()  # what loading left in MLX's cache is free memory
        offer = memory_offered()
        here = ranks_on_host(read_hostfile(os.environ["MLX_HOSTFILE"]), rank) if args.tp > 1 else 1
        if here > 1:  # the ranks on this host share its memory
            offer = dataclasses.replace(offer, bytes=offer.bytes // here, source=f"{offer.source} / {here} ranks")
        size = size_pool(
            offer.bytes, per_token, args.max_running_requests, context, args.mem_fraction_static, args.max_total_tokens
        )
        slots = size.tokens if group is None else agree_min(size.tokens, group)  # same slot ids on every rank
        pool = KVPool(loaded.model, slots, loaded.dtype)
        log.info(
            "KV pool",
            tokens=slots,
            full_bytes=slots * per_token,
            bytes_per_token=per_token,
            bound=size.bound,
            why=size.reason,
            memory_source=offer.source,
            memory_offered=offer.bytes,
            allocated_bytes=pool.allocated_slots() * per_token,
            allocation=f"{pool.segments} segment(s) of up to {pool.segment} tokens, each allocated when the "
            f"prefix cache first stores into it (the first at start)",
        )
        states = _state_pool(args, loaded, slots, offer.bytes, log)
        processors = load_processors(args.logit_processor_module) if args.enable_custom_logit_processor else {}
        graph = _decode_graph(args, loaded.model, log)
        warmup_s = warm_up(loaded, graph, pool, states)
        log.info("warm-up done", seconds=round(warmup_s, 3))
        t1 = time.perf_counter()
        shape_calls = 0 if args.disable_shape_warmup else warm_shapes(loaded, graph, args.max_running_requests)
        if shape_calls:
            log.info("shape warm-up done", model_calls=shape_calls, seconds=round(time.perf_counter() - t1, 3))
        self.generation = generation
        self.ready_msg = WorkerReady(
            slots,
            per_token,
            context,
            loaded.vocab_size,
            sorted(processors),
            generation,
            len(loaded.caches.state),
            states.size if states else 0,
            graph.max_batch if graph else 0,
            prefill_step(),
            window_layers=len(loaded.caches.window),
        )
        self.info += (
            f" kv_pool_tokens={slots} kv_pool_bytes={slots * per_token} ({slots * per_token / 2**30:.2f} GiB)"
            f" kv_pool_bound={size.bound} memory_source={offer.source.replace(' ', '_')}"
            f" warmup_s={warmup_s:.2f} decode_graph_max_bs={graph.max_batch if graph else 0}"
            f" tp_rank={rank}/{args.tp}"
        )
        self.runner = ModelRunner(
            loaded,
            StepTrace.from_env(),
            pool,
            processors,
            graph,
            states,
            end_states=args.enable_mamba_extra_buffer,
            threads=prefill_threads,
        )
        self.inbox = inbox or bind_pull(
            self.ctx, endpoints.worker_rank(args.run_dir, rank) if rank else endpoints.worker(args.run_dir)
        )
        self.forwarder = RankForwarder(self.ctx, args.run_dir, args.tp, link) if args.tp > 1 and not rank else None
        self.results = None  # ranks > 0 reply to no one
        if not rank:
            self.results = self.ctx.socket(zmq.PUSH)
            self.results.connect(endpoints.worker_results(args.run_dir))
            self.results.send(codec.encoder.encode(self.ready_msg))
        self.order = FinalizeOrder()
        self.chain_first: tuple[int, float] | None = None  # (prev launch id, wait before the ChainDecode)

    def close(self) -> None:
        """Close every socket, the link to ranks started by hand through its own `close` (its
        monitor and ZAP threads use sockets no other thread may close); what is queued for
        the other ranks (the `WorkerShutdown` of `run`) is delivered for up to 1 s."""
        if self.forwarder is not None:
            self.forwarder.close(linger_ms=1000)
        self.ctx.destroy(linger=1000)

    def _rank_lost(self, rank: int) -> None:
        """A rank started by hand lost its link (`tp.link.RankServer.watch`): unless this is
        the shutdown, exit `EXIT_RANK_LOST` at once, from the watch thread (the main thread may be
        blocked in a collective that never returns); launch fails the requests in flight and
        starts rank 0 again, which waits for the ranks to attach again."""
        if self.stopping:
            return
        self.log.error(
            "lost a tensor-parallel rank started by hand (its link closed); exiting so that launch restarts the group",
            rank=rank,
        )
        os._exit(EXIT_RANK_LOST)

    def _group_broken(self, launch_id: int, error: Exception) -> None:
        """Rank 0 of a ``--tp`` group whose collective failed (`RING_ERROR`: a rank is gone):
        exit `EXIT_RANK_LOST` at once, without answering, as `_rank_lost` does. Launch then
        restarts the group and the scheduler fails the requests on the device with the 503
        naming the rank that died; an answer would have failed this launch's requests with
        a 500 "model execution failed" first (the group cannot run another step anyway)."""
        self.log.error(
            "a tensor-parallel collective failed (a rank is gone); exiting so that launch restarts the group",
            launch_id=launch_id,
            error=str(error),
        )
        os._exit(EXIT_RANK_LOST)

    def _launch(self, msg: Launch, waited_s: float, received: float) -> None:
        try:
            self.runner.launch(msg.launch_id, msg.mode, msg.batch)
        except Exception as e:  # kept in the pending; reported at finalize
            self.log.error("launch failed", launch_id=msg.launch_id, error=str(e))
        self._note(msg.launch_id, waited_s, received)

    def _chain(self, msg: ChainDecode, waited_s: float, received: float) -> None:
        """Chain first; or, when `FinalizeOrder` says so and the Finalize of the previous
        launch is right behind this message: build the chained graph, finalize the previous
        launch, then queue the chained one."""
        behind, self.chain_first = None, None
        early = self.order.finalize_early
        if early:
            behind, _, behind_at = self._recv(PEEK_MS)
            early = isinstance(behind, Finalize) and behind.launch_id == msg.prev_launch_id
        else:
            self.chain_first = (msg.prev_launch_id, waited_s)
        try:
            self.runner.chain_decode(msg.launch_id, msg.prev_launch_id, start=not early)
        except Exception as e:  # kept in the pending; reported at finalize
            self.log.error("chained decode failed", launch_id=msg.launch_id, error=str(e))
        self._note(msg.launch_id, waited_s, received)
        if early:
            self._finalize(behind, behind_at)
            self.runner.start(msg.launch_id)
            self.order.early_step(self.runner.last_block_s)
            behind = None
            if not self.order.finalize_early:
                self.log.debug(
                    "finalize order: chain first",
                    blocked_ms=self.runner.last_block_s * 1e3,
                    round_trip_ms=self.order.round_trip_s * 1e3,
                )
        if behind is not None:
            self._handle(behind, 0.0, behind_at)

    def _finalize(self, msg: Finalize, received: float) -> None:
        trace = self.runner.trace
        if trace is not None:
            trace.note(msg.launch_id, fin_received=received)
        try:
            rids, ids = self.runner.finalize(msg.launch_id)
            reply = LaunchResult(
                msg.launch_id,
                rids,
                ids,
                "",
                *self.runner.last_logprobs,
                self.runner.last_row_errors,
                self.generation,
                self.runner.last_more,
                self.runner.last_more_logprobs,
            )
        except KeyError:
            reply = LaunchResult(
                msg.launch_id, [], [], f"unknown launch id {msg.launch_id}", generation=self.generation
            )
        except Exception as e:
            if self.forwarder is not None and RING_ERROR in str(e) and not self.stopping:
                self._group_broken(msg.launch_id, e)
            reply = LaunchResult(msg.launch_id, [], [], f"{type(e).__name__}: {e}", generation=self.generation)
        if self.results is not None:
            encoded = codec.encoder.encode(reply)
            if trace is not None:
                sent_at = time.perf_counter()
            self.results.send(encoded)
            if trace is not None:
                trace.sent(msg.launch_id, sent_at)
        if self.chain_first is not None and self.chain_first[0] == msg.launch_id:
            self.order.chain_first_step(self.runner.last_block_s, self.chain_first[1])
            self.chain_first = None
            if self.order.finalize_early:
                self.log.debug("finalize order: finalize early", round_trip_ms=self.order.round_trip_s * 1e3)

    def _note(self, launch_id: int, waited_s: float, received: float) -> None:
        """Trace the launch just built: its wait and receive time, built now."""
        if self.runner.trace is not None:
            self.runner.trace.note(
                launch_id,
                waited=waited_s,
                finalize_early=self.order.finalize_early,
                received=received,
                built=time.perf_counter(),
            )

    def _recv(self, timeout_ms: int) -> tuple[object | None, float, float]:
        """The next inbox message (None on timeout or a bad message), the seconds the worker
        waited for it, and when it was read (perf_counter s)."""
        t0 = time.perf_counter()
        if self.forwarder is not None:
            self.forwarder.refuse_late()
        if not self.inbox.poll(timeout_ms):
            now = time.perf_counter()
            return None, now - t0, now
        raw = self.inbox.recv()
        now = time.perf_counter()
        try:
            msg = codec.to_worker.decode(raw)
        except msgspec.MsgspecError as e:
            self.log.error("bad message on worker inbox", error=str(e))
            msg = None
        if self.forwarder is not None:
            msg = self.forwarder.forward(raw, msg)
        return msg, now - t0, now

    def _handle(self, msg, waited_s: float, received: float) -> None:
        if isinstance(msg, ChainDecode):
            self._chain(msg, waited_s, received)
        elif isinstance(msg, Launch):
            self._launch(msg, waited_s, received)
        elif isinstance(msg, Finalize):
            self._finalize(msg, received)
        elif isinstance(msg, StoreKV):
            try:
                self.runner.store(msg.rids, msg.starts, msg.slots, msg.state_slots)
            except ValueError as e:
                self.log.error("StoreKV failed", error=str(e))
        elif isinstance(msg, WorkerAbort):
            self.runner.abort(msg.rids)
        elif isinstance(msg, WorkerShutdown):
            self.stopping = True

    def run(self) -> None:
        """Serve until `WorkerShutdown` or a stop signal (`install_stop_handlers`)."""
        while not self.stopping:
            msg, waited, received = self._recv(POLL_MS)
            if msg is not None:
                self._handle(msg, waited, received)
            elif self.runner.threads is not None:
                self.runner.threads.record()  # idle: keep the measure of the cores recent
        if self.forwarder is not None:  # ranks started by hand stop with rank 0 (those on this host also get SIGTERM)
            self.forwarder.forward(codec.encoder.encode(WorkerShutdown()), WorkerShutdown())
        dropped = self.runner.discard()
        if dropped:
            self.log.info("discarded in-flight launches at shutdown", count=dropped)


def main(run_dir: str, generation: int = 0) -> None:
    """Entry point: ``python -m worker_proc RUN_DIR [GENERATION]``; a ``--tp`` rank reads
    its rank from ``MLX_RANK``."""
    args = ServerArgs.load(run_dir)
    rank = int(os.environ.get("MLX_RANK", "0")) if args.tp > 1 else 0
    start_child(_title(rank))
    log = configure_logging(args.log_level, args.log_format, proc=_title(rank).split("::")[1])
    _reexec_with_cpu_blas(args.blas, args.blas_env, [run_dir, str(generation)])
    hs = Handshake(zmq.Context.instance(), run_dir, Role.WORKER, rank)
    try:
        proc = WorkerProcess(args, log, generation, rank)
    except Exception as e:
        hs.failed(e)
        hs.close()
        raise SystemExit(1) from e
    install_stop_handlers(lambda: setattr(proc, "stopping", True), log)
    hs.ready(proc.info)
    proc.run()
    proc.close()
    hs.close()
    log.info("worker stopped")
    exit_now(0)


def main_attached(argv: list[str]) -> None:
    """Entry point of a rank started by hand, on any host: ``python -m worker_proc --rank R
    --hostfile FILE [--starting-port P] --attach HOST:PORT --dist-key-file KEY``
    (`worker_proc.tp.link`). It reads the ring from the hostfile as launch does
    (`worker_proc.tp.setup.read_hostfile`, either format; exit 2 naming the file and the
    fault when it is malformed), preloads this host's fast CPU BLAS, attaches to rank 0,
    takes the server's args from it (exit 1 when rank 0 read another ring), joins the group
    (MLX reads the ring from a temporary file, removed once joined) and serves rank 0's
    messages until `WorkerShutdown` or SIGTERM (it was started by hand)."""
    import argparse
    import tempfile

    from worker_proc.cpu.blas import find_fast_blas, thread_env, usable_cores
    from worker_proc.tp.link import attach, watch_link
    from worker_proc.tp.setup import DEFAULT_STARTING_PORT, ranks_on_host, read_hostfile, write_ring

    p = argparse.ArgumentParser(prog="python -m worker_proc", description="a tensor-parallel rank started by hand")
    p.add_argument("--rank", type=int, required=True, help="this process's rank (1 .. ranks-1)")
    p.add_argument(
        "--hostfile",
        required=True,
        help="a copy of the hostfile launch.py was given (--hostfile; the hosts or the ring)",
    )
    p.add_argument(
        "--starting-port",
        type=int,
        default=None,
        help=f"with a hostfile listing hosts: the same --starting-port as launch.py's (default: "
        f"{DEFAULT_STARTING_PORT})",
    )
    p.add_argument("--attach", required=True, help="rank 0's HOST:PORT (launch.py's --dist-init-addr)")
    p.add_argument("--dist-key-file", required=True, help="a copy of the CURVE key file rank 0 uses")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    ns = p.parse_args(argv)
    try:
        hosts = read_hostfile(ns.hostfile, ns.starting_port)
    except (OSError, ValueError) as e:
        p.error(f"--hostfile: {e}")
    if not 0 < ns.rank < len(hosts):
        p.error(f"--rank must be in 1..{len(hosts) - 1} (the hostfile has {len(hosts)} ranks; rank 0 is launch's)")
    setproctitle.setproctitle(_title(ns.rank))  # not start_child: it must outlive the shell that started it
    log = configure_logging(ns.log_level, "console", proc=_title(ns.rank).split("::")[1])
    blas_env = thread_env(0, max(1, usable_cores() // ranks_on_host(hosts, ns.rank)), dict(os.environ))
    _reexec_with_cpu_blas(find_fast_blas() or "", blas_env, argv)
    log.info("attaching to rank 0", address=ns.attach, rank=ns.rank)
    ctx = zmq.Context()
    try:
        inbox, args = attach(ctx, ns.attach, ns.dist_key_file, ns.rank)
    except (RuntimeError, TimeoutError) as e:
        log.error("could not attach to rank 0", error=str(e))
        raise SystemExit(1) from None
    if args.tp != len(hosts):
        raise SystemExit(f"rank 0 runs {args.tp} ranks, the hostfile {ns.hostfile} names {len(hosts)}")
    if args.dist_ring and args.dist_ring != hosts:
        raise SystemExit(
            f"rank 0's ring is {args.dist_ring}, the hostfile {ns.hostfile} gives {hosts} here"
            + (f" with --starting-port {ns.starting_port}" if ns.starting_port is not None else "")
            + ": give every rank the same hostfile and --starting-port"
        )
    fd, ring_file = tempfile.mkstemp(prefix=f"lazyserve-ring-rank{ns.rank}-", suffix=".json")
    os.close(fd)
    os.environ.update({"MLX_RANK": str(ns.rank), "MLX_HOSTFILE": str(write_ring(Path(ring_file), hosts))})
    proc = None

    def lost() -> None:  # rank 0 sends WorkerShutdown before it exits: give this rank time to read it
        deadline = time.monotonic() + LINK_GRACE_S
        while time.monotonic() < deadline and not (proc is not None and proc.stopping):
            time.sleep(0.05)
        if proc is None or not proc.stopping:
            Path(ring_file).unlink(missing_ok=True)
            log.error(
                "lost rank 0 (it exited or its host stopped answering); exiting so that this rank can be "
                "started again for the next rank 0",
                address=ns.attach,
            )
            os._exit(1)

    watch_link(inbox, lost)
    try:
        proc = WorkerProcess(msgspec.structs.replace(args, hostfile=ns.hostfile), log, rank=ns.rank, inbox=inbox)
    finally:
        Path(ring_file).unlink(missing_ok=True)  # read by mx.distributed.init, in the constructor
    install_stop_handlers(lambda: setattr(proc, "stopping", True), log)
    log.info("rank ready", info=proc.info)
    proc.run()
    proc.close()
    log.info("worker stopped")
    exit_now(0)
