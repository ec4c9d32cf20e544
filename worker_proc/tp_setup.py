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


def read_hostfile(path: Path | str) -> list[list[str]]:
    """The ranks' addresses in the ring hostfile `path` (one list of ``"ip:port"`` strings per
    rank, at least 2 ranks). Raises `OSError` when it cannot be read and `ValueError` naming
    what is wrong with its content."""
    try:
        hosts = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"hostfile {path}: not JSON ({e})") from e
    if (not isinstance(hosts, list) or len(hosts) < 2
            or not all(isinstance(r, list) and r and all(isinstance(a, str) for a in r) for r in hosts)):
        raise ValueError(f"hostfile {path}: want a list with one entry per rank (at least 2), each a list of "
                         f'"ip:port" strings, e.g. [["10.0.0.1:5000"], ["10.0.0.2:5000"]]')
    for rank in hosts:
        for addr in rank:
            host, sep, port = addr.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65535:
                raise ValueError(f"hostfile {path}: {addr!r} is not ip:port")
    return hosts


def ranks_on_host(hostfile: Path | str, rank: int) -> int:
    """How many ranks of the group in `hostfile` share the host (first IP) of rank `rank`:
    they split its memory."""
    hosts = read_hostfile(hostfile)
    ip = lambda r: r[0].rpartition(":")[0]  # noqa: E731
    return sum(ip(r) == ip(hosts[rank]) for r in hosts)


def default_init_addr(hosts: list[list[str]]) -> str:
    """Where rank 0 waits for the other ranks when ``--dist-init-addr`` is not given: rank
    0's first address with the port after its ring port."""
    host, _, port = hosts[0][0].rpartition(":")
    return f"{host}:{int(port) + 1}"
