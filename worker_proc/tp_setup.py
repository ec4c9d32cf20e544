"""What launch prepares for a one-host tensor-parallel group before any child starts: the
check that the model's heads divide by ``--tp`` (`check_heads`, from the config alone, so a
bad ``--tp`` fails in a second, not after the ranks loaded), the ring hostfile and each
rank's environment. Imports no mlx-lm (slow to import); MLX only to read GGUF metadata.

MLX's ring backend (``mx.distributed.init(backend="ring")``) reads the rank from
``MLX_RANK`` and the ranks' addresses from the JSON file ``MLX_HOSTFILE`` names: a list with
one entry per rank, each a list of ``"ip:port"`` strings, the format `mlx.launch` writes
(``[["127.0.0.1:5000"], ["127.0.0.1:5001"]]``)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from protocol.config import ModelSource

RING_BACKEND = "ring"
DIST_BACKENDS = (RING_BACKEND,)
"""`--dist-backend` values built here (MLX's ring over TCP: the one that runs on a Linux CPU)."""


def model_heads(source: ModelSource) -> tuple[str, int, int]:
    """(model_type, num_attention_heads, num_key_value_heads) of `source`, from its
    config.json or GGUF metadata (0 where it does not say). Raises `OSError` or
    `ValueError` for an unreadable file."""
    if source.kind == "gguf":
        import mlx.core as mx

        _, metadata = mx.load(source.path, return_metadata=True)
        arch = str(metadata.get("general.architecture", "?"))
        value = lambda key: int(metadata[key].item()) if key in metadata else 0  # noqa: E731
        heads = value(f"{arch}.attention.head_count")
        return arch, heads, value(f"{arch}.attention.head_count_kv") or heads
    config = json.loads((Path(source.path) / "config.json").read_text())
    heads = int(config.get("num_attention_heads") or 0)
    return str(config.get("model_type", "?")), heads, int(config.get("num_key_value_heads") or heads)


def check_heads(model_type: str, heads: int, kv_heads: int, tp: int) -> None:
    """Raise `ValueError` naming both head counts and `tp` when they do not divide by `tp`."""
    if not heads or heads % tp or kv_heads % tp:
        raise ValueError(f"--tp {tp}: the heads of this {model_type} model do not divide by {tp} "
                         f"(num_attention_heads={heads}, num_key_value_heads={kv_heads}); use a --tp that "
                         f"divides both")


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct TCP ports on `host` that were free a moment ago (all bound at once, then
    released)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def write_hostfile(path: Path, ranks: int, host: str = "127.0.0.1") -> Path:
    """Write a ring hostfile for `ranks` ranks on `host`, each on a fresh free port, to
    `path` (mode 0600); returns `path`."""
    path.touch(mode=0o600)
    path.write_text(json.dumps([[f"{host}:{port}"] for port in free_ports(ranks, host)]))
    return path


def rank_env(rank: int, hostfile: Path) -> dict[str, str]:
    """The variables rank `rank` of the group in `hostfile` needs in its environment."""
    return {"MLX_RANK": str(rank), "MLX_HOSTFILE": str(hostfile)}
