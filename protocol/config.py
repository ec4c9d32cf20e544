"""`ServerArgs`: the configuration every process reads from the run directory."""

from __future__ import annotations

from pathlib import Path

import msgspec

from protocol.endpoints import SERVER_ARGS_FILE


class ModelSource(msgspec.Struct, frozen=True):
    """Where the model lives. kind: "gguf" (path is the .gguf file) or "hf" (a directory
    with config.json and safetensors; for load_format "dummy" config.json is enough)."""

    kind: str
    path: str
    served_name: str


class ServerArgs(msgspec.Struct, frozen=True, kw_only=True):
    """All server settings (see `launch.py --help` for each one's meaning and default).

    blas: the fast CPU BLAS launch found ("" for none); blas_env: the BLAS thread variables
    for it (`worker_proc.blas.thread_env`). The worker re-executes itself with both in its
    environment when MLX runs on the CPU, and ignores them on a GPU (`worker_proc.blas.preload_env`).
    max_total_tokens None: the worker sizes the KV pool (`worker_proc.kv_sizing.size_pool`).
    decode_graph_max_bs None: chosen by the worker (`worker_proc.decode_graph.default_graph_max_bs`)."""

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
    disable_radix_cache: bool = False
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
    blas_env: dict[str, str] = {}
    disable_decode_graph: bool = False
    decode_graph_max_bs: int | None = None
    disable_shape_warmup: bool = False

    def save(self) -> Path:
        """Write these args as JSON into the run directory and return the file's path."""
        path = Path(self.run_dir) / SERVER_ARGS_FILE
        path.write_bytes(msgspec.json.encode(self))
        return path

    @classmethod
    def load(cls, run_dir: str | Path) -> "ServerArgs":
        """Read the args launch saved in `run_dir`. Raises `FileNotFoundError` or
        `msgspec.ValidationError` when the file is missing or malformed."""
        return msgspec.json.decode((Path(run_dir) / SERVER_ARGS_FILE).read_bytes(), type=cls)
