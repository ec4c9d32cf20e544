"""The hostfile and environment of a one-host tensor-parallel group (no MLX import: launch
uses it before any child starts).

MLX's ring backend (``mx.distributed.init(backend="ring")``) reads the rank from
``MLX_RANK`` and the ranks' addresses from the JSON file ``MLX_HOSTFILE`` names: a list with
one entry per rank, each a list of ``"ip:port"`` strings, the format `mlx.launch` writes
(``[["127.0.0.1:5000"], ["127.0.0.1:5001"]]``)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

RING_BACKEND = "ring"
DIST_BACKENDS = (RING_BACKEND,)
"""`--dist-backend` values built here (MLX's ring over TCP: the one that runs on a Linux CPU)."""


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
