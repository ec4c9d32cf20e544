"""`ServerArgs`: the configuration every process reads from the run directory."""

from __future__ import annotations

from pathlib import Path

import msgspec

from protocol.endpoints import SERVER_ARGS_FILE

MAX_REQUEST_BODY_BYTES = 16 * 1024 * 1024
"""Default ``--max-request-body-bytes``, 16 MiB: a 128k-token prompt as JSON text (about
0.5 MB; 3 MB with every character escaped as \\uXXXX) or as token ids (about 0.8 MB), or a
logit_bias over a whole vocabulary (about 3 MB), fits with room, while one request can make
the HTTP process parse no more than that."""


class ModelSource(msgspec.Struct, frozen=True):
    """Where the model lives. kind: "gguf" (path is the .gguf file) or "hf" (a directory
    with config.json and safetensors; for load_format "dummy" config.json is enough)."""

    kind: str
    path: str
    served_name: str


class ServerArgs(msgspec.Struct, frozen=True, kw_only=True):
    """All server settings (see `launch.py --help` for each one's meaning and default).

    blas: the fast CPU BLAS launch found ("" for none); blas_env: the BLAS thread variables
    for it (`worker_proc.cpu.blas.thread_env`). The worker re-executes itself with both in its
    environment when MLX runs on the CPU, and ignores them on a GPU (`worker_proc.cpu.blas.preload_env`).
    max_total_tokens None: the worker sizes the KV pool (`worker_proc.memory.kv_sizing.size_pool`).
    decode_graph_max_bs None: chosen by the worker (`worker_proc.model.decode_graph.default_graph_max_bs`).
    api_key "": no key required; allowed_origins: the origins browsers may call from
    (`tokenizer_proc.web.cors`; "*": any, empty: CORS off); max_queued_requests None: unlimited; queue_timeout None:
    requests wait for admission as long as it takes; stall_timeout: see
    `scheduler_proc.deadlines`; log_requests: request log lines include prompt and output text.
    tool_call_parser: a `tokenizer_proc.tools.parsers` family, "auto" or "none";
    reasoning_parser: a `tokenizer_proc.output.reasoning` parser name ("" for none).
    tp: tensor-parallel worker ranks (`worker_proc.tp.sharding`); dist_backend: the
    `mx.distributed` backend joining them; hostfile: the hostfile given with ``--hostfile``
    ("" on one host: launch writes one), where ranks > 0 are started by hand and attach to
    rank 0 at dist_init_addr ("ip:port") with the CURVE key in dist_key_file
    (`worker_proc.tp.link`); dist_ring: the ring rank 0 read from the hostfile (one list of
    "ip:port" per rank, `worker_proc.tp.setup.read_hostfile`), which a rank started by hand
    checks against its own reading. mamba_cache_chunk_size: ``--mamba-cache-chunk-size`` as
    given (0: not given; `state_interval` is the interval in use).
    speculative_algorithm: "NGRAM" (prompt-lookup drafts, `scheduler_proc.spec`) or "" (off);
    speculative_num_draft_tokens: the longest draft."""

    model: ModelSource
    run_dir: str
    host: str = "127.0.0.1"
    port: int = 30000
    detokenizers: int = 1
    max_running_requests: int = 64
    max_prefill_tokens: int = 8192
    chunked_prefill_size: int = 2048
    enable_mixed_chunk: bool = False
    disable_overlap_schedule: bool = False
    speculative_algorithm: str = ""
    speculative_num_draft_tokens: int = 4
    disable_radix_cache: bool = False
    mamba_cache_chunk_size: int = 0
    enable_mamba_extra_buffer: bool = False
    max_total_tokens: int | None = None
    mem_fraction_static: float = 0.2
    context_length: int | None = None
    load_format: str = "auto"
    log_level: str = "info"
    log_format: str = "console"
    blas: str = ""
    detokenizer_wait_s: float = 30.0
    enable_custom_logit_processor: bool = False
    logit_processor_module: str = ""
    max_n: int = 16
    max_batch_choices: int = 1024
    default_max_tokens: int | None = None
    blas_env: dict[str, str] = {}
    disable_decode_graph: bool = False
    disable_fused_projections: bool = False
    disable_fast_activations: bool = False
    decode_graph_max_bs: int | None = None
    disable_shape_warmup: bool = False
    api_key: str = ""
    allowed_origins: tuple[str, ...] = ("*",)
    max_request_body_bytes: int = MAX_REQUEST_BODY_BYTES
    max_queued_requests: int | None = None
    sse_keepalive_s: float = 15.0
    queue_timeout: float | None = None
    stall_timeout: float = 300.0
    log_requests: bool = False
    tool_call_parser: str = "auto"
    reasoning_parser: str = ""
    tp: int = 1
    dist_backend: str = "ring"
    hostfile: str = ""
    dist_init_addr: str = ""
    dist_key_file: str = ""
    dist_ring: list[list[str]] = []

    @property
    def state_interval(self) -> int:
        """Prompt tokens between recurrent-state snapshots: ``--mamba-cache-chunk-size``, else
        ``--chunked-prefill-size``, else 2048 (chunking off)."""
        return self.mamba_cache_chunk_size or self.chunked_prefill_size or 2048

    def save(self) -> Path:
        """Write these args as JSON into the run directory and return the file's path. The
        file is readable by its owner only (mode 0600, inside the 0700 run directory): it
        holds the API key."""
        path = Path(self.run_dir) / SERVER_ARGS_FILE
        path.touch(mode=0o600)
        path.chmod(0o600)  # a file left by an earlier run keeps its mode otherwise
        path.write_bytes(msgspec.json.encode(self))
        return path

    @classmethod
    def load(cls, run_dir: str | Path) -> ServerArgs:
        """Read the args launch saved in `run_dir`. Raises `FileNotFoundError` or
        `msgspec.ValidationError` when the file is missing or malformed."""
        return msgspec.json.decode((Path(run_dir) / SERVER_ARGS_FILE).read_bytes(), type=cls)
