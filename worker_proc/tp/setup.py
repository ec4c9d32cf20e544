"""What launch prepares for a one-host tensor-parallel group before any child starts: the
check that the model's heads divide by ``--tp`` (`check_heads`, from the config alone, so a
bad ``--tp`` fails in a second, not after the ranks loaded), the ring hostfile and each
rank's environment. Imports no MLX: a GGUF's head counts come from its header (`gguf_metadata`).

MLX's ring backend (``mx.distributed.init(backend="ring")``) reads the rank from
``MLX_RANK`` and the ranks' addresses from the JSON file ``MLX_HOSTFILE`` names: a list with
one entry per rank, each a list of ``"ip:port"`` strings, the format `mlx.launch` writes
(``[["127.0.0.1:5000"], ["127.0.0.1:5001"]]``). With ``--hostfile`` (several hosts),
`read_hostfile` is the one parser launch and ``python -m worker_proc --rank R`` share: it
takes that ring or the host list users write for ``mlx.launch --hostfile`` and derives the
ring the way `mlx.launch` does, so that every rank joins the same ring."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from protocol.config import ModelSource
from protocol.model_source import gguf_metadata

RING_BACKEND = "ring"
DIST_BACKENDS = (RING_BACKEND,)
"""`--dist-backend` values built here (MLX's ring over TCP: the one that runs on a Linux CPU)."""


def model_heads(source: ModelSource) -> tuple[str, int, int]:
    """(model_type, num_attention_heads, num_key_value_heads) of `source`, from its
    config.json or GGUF metadata (0 where it does not say). Raises `OSError` or
    `ValueError` for an unreadable file."""
    if source.kind == "gguf":
        metadata = gguf_metadata(Path(source.path))
        arch = str(metadata.get("general.architecture", "?"))
        heads = int(metadata.get(f"{arch}.attention.head_count", 0))
        return arch, heads, int(metadata.get(f"{arch}.attention.head_count_kv", 0)) or heads
    config = json.loads((Path(source.path) / "config.json").read_text())
    heads = int(config.get("num_attention_heads") or 0)
    return str(config.get("model_type", "?")), heads, int(config.get("num_key_value_heads") or heads)


def check_heads(model_type: str, heads: int, kv_heads: int, tp: int) -> None:
    """Raise `ValueError` naming both head counts and `tp` when they do not divide by `tp`."""
    if not heads or heads % tp or kv_heads % tp:
        raise ValueError(
            f"--tp {tp}: the heads of this {model_type} model do not divide by {tp} "
            f"(num_attention_heads={heads}, num_key_value_heads={kv_heads}); use a --tp that "
            f"divides both"
        )


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


DEFAULT_STARTING_PORT = 32323
"""`mlx.launch`'s ``--starting-port`` default: the first ring port it gives a hostfile that
lists hosts (``[{"ssh": ..., "ips": [...]}, ...]``)."""
HOST_EXAMPLE = '[{"ssh": "host1", "ips": ["10.0.0.1"]}, {"ssh": "host2", "ips": ["10.0.0.2"]}]'
RING_EXAMPLE = '[["10.0.0.1:5000"], ["10.0.0.2:5000"]]'


def read_hostfile(path: Path | str, starting_port: int | None = None) -> list[list[str]]:
    """The ring of the group described by the hostfile `path`: one list of ``"ip:port"``
    strings per rank (at least 2 ranks), what ``MLX_HOSTFILE`` gives MLX's ring backend.

    Two formats, told apart by their entries:

    - the ring hostfile that `mlx.launch` writes for its ranks, ``[["ip:port", ...], ...]``:
      returned as it is;
    - the host list a user writes for ``mlx.launch --hostfile``, one rank per entry,
      ``[{"ssh": "host", "ips": ["10.0.0.1", ...]}, ...]`` (or ``{"hosts": [...]}`` with an
      optional ``"backend": "ring"`` and empty ``"envs"``, as ``mlx.distributed_config``
      writes): rank r's addresses are its ``ips`` in order, with ports counted up by one per
      address over all ranks from `starting_port` (default `DEFAULT_STARTING_PORT`), as
      `mlx.launch` does with its default ``--connections-per-ip 1``. ``ssh`` names the host
      (a string; not used here: the ranks other than 0 are started by hand); ``rdma``
      (JACCL's) is allowed and not used.

    Every rank that reads the same file with the same `starting_port` so derives the same
    ring. Raises `OSError` when the file cannot be read and `ValueError` starting with
    ``hostfile PATH:`` and naming what is wrong: not JSON, not a list or an empty one,
    fewer than 2 ranks, entries of both formats, a ring address that is not ``ip:port`` or
    appears twice, a host entry with a missing or non-string ``ssh``, missing or empty
    ``ips``, an ip that is not a non-empty string, carries a port or repeats in its entry,
    an unknown key, ports past 65535, a backend other than ring, ``envs``; `starting_port`
    given with a ring hostfile (its ports are in the file) or outside 1..65535."""
    where = f"hostfile {path}"
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not JSON ({e})") from e
    if isinstance(data, dict):
        return _ring_of_hosts(where, _host_list_of(where, data), starting_port)
    if not isinstance(data, list) or not data:
        raise ValueError(
            f"{where}: want a list with one entry per rank (at least 2): the hosts "
            f"({HOST_EXAMPLE}, ports from --starting-port) or the ring mlx.launch writes "
            f"({RING_EXAMPLE})"
        )
    if len(data) < 2:
        raise ValueError(f"{where}: names 1 rank; tensor parallel over several hosts wants at least 2")
    if all(isinstance(entry, dict) for entry in data):
        return _ring_of_hosts(where, data, starting_port)
    if not all(isinstance(entry, list) for entry in data):
        kinds = sorted({type(entry).__name__ for entry in data})
        raise ValueError(
            f"{where}: every entry must be a host object ({HOST_EXAMPLE}) or every entry a list of "
            f'"ip:port" strings ({RING_EXAMPLE}); this file has entries of type {", ".join(kinds)}'
        )
    if starting_port is not None:
        raise ValueError(
            f"{where}: --starting-port {starting_port} goes with a hostfile listing hosts "
            f'({HOST_EXAMPLE}); this one is a ring hostfile whose "ip:port" entries give the ports'
        )
    seen: dict[str, int] = {}
    for rank, addrs in enumerate(data):
        if not addrs or not all(isinstance(a, str) for a in addrs):
            raise ValueError(f'{where}: rank {rank}: want a non-empty list of "ip:port" strings, got {addrs!r}')
        for addr in addrs:
            host, sep, port = addr.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{where}: rank {rank}: {addr!r} is not ip:port")
            if addr in seen:
                raise ValueError(
                    f"{where}: {addr!r} is given to rank {seen[addr]} and to rank {rank}; every ring "
                    f"address must be distinct"
                )
            seen[addr] = rank
    return data


def _host_list_of(where: str, data: dict) -> list:
    """The ``hosts`` list of the object form of a host-list hostfile, after refusing what this
    server cannot honour (another backend, environment variables)."""
    unknown = sorted(set(data) - {"hosts", "backend", "envs"})
    if unknown:
        raise ValueError(f'{where}: unknown key {unknown[0]!r}; the object form takes "hosts", "backend" and "envs"')
    if "hosts" not in data:
        raise ValueError(f'{where}: an object without "hosts" (want {{"hosts": {HOST_EXAMPLE}}})')
    if data.get("backend", "") not in ("", RING_BACKEND):
        raise ValueError(f'{where}: "backend" {data["backend"]!r} is not supported: only {RING_BACKEND} is built')
    if data.get("envs"):
        raise ValueError(
            f'{where}: "envs" is not supported (it would set {data["envs"]!r} only in ranks that '
            f"mlx.launch starts); set the variables in each rank's environment"
        )
    hosts = data["hosts"]
    if not isinstance(hosts, list) or len(hosts) < 2 or not all(isinstance(h, dict) for h in hosts):
        raise ValueError(f'{where}: "hosts" must be a list of at least 2 host objects ({HOST_EXAMPLE})')
    return hosts


def _ring_of_hosts(where: str, hosts: list[dict], starting_port: int | None) -> list[list[str]]:
    """The ring `mlx.launch` derives from `hosts` (one rank per entry): each entry's ``ips``
    in order, ports from `starting_port` up by one per address."""
    port = DEFAULT_STARTING_PORT if starting_port is None else starting_port
    if not 0 < port < 65536:
        raise ValueError(f"{where}: --starting-port {port} is not a TCP port (1..65535)")
    ring = []
    for rank, host in enumerate(hosts):
        unknown = sorted(set(host) - {"ssh", "ips", "rdma"})
        if unknown:
            raise ValueError(f'{where}: host {rank}: unknown key {unknown[0]!r} (a host takes "ssh", "ips" and "rdma")')
        ssh = host.get("ssh")
        if not isinstance(ssh, str) or not ssh:
            raise ValueError(f'{where}: host {rank}: want "ssh", the host\'s name (a non-empty string), got {ssh!r}')
        ips = host.get("ips")
        if not isinstance(ips, list) or not ips:
            raise ValueError(
                f'{where}: host {rank} ({ssh}): want "ips", a non-empty list of IP addresses (the '
                f"ring backend connects to IPs, not host names), got {ips!r}"
            )
        addrs = []
        for i, ip in enumerate(ips):
            if not isinstance(ip, str) or not ip:
                raise ValueError(f"{where}: host {rank} ({ssh}): ips[{i}] is {ip!r}, not an IP address string")
            if ip.count(":") == 1:
                raise ValueError(
                    f"{where}: host {rank} ({ssh}): ips[{i}] {ip!r} has a port; give the address "
                    f"alone (ports come from --starting-port, {port} here)"
                )
            if ip in ips[:i]:
                raise ValueError(f"{where}: host {rank} ({ssh}): ip {ip!r} is listed twice")
            addrs.append(f"{ip}:{port}")
            port += 1
        ring.append(addrs)
    if port - 1 > 65535:
        first = DEFAULT_STARTING_PORT if starting_port is None else starting_port
        raise ValueError(
            f"{where}: its {port - first} addresses take the ports {first}..{port - 1}, past 65535; "
            f"give a lower --starting-port"
        )
    return ring


def write_ring(path: Path, ring: list[list[str]]) -> Path:
    """Write `ring` (one list of ``"ip:port"`` per rank) as the JSON file ``MLX_HOSTFILE``
    names for MLX's ring backend, mode 0600; returns `path`."""
    path.touch(mode=0o600)
    path.write_text(json.dumps(ring))
    return path


def ranks_on_host(ring: list[list[str]], rank: int) -> int:
    """How many ranks of `ring` (`read_hostfile`'s) share the host (first IP) of rank `rank`:
    they split its memory."""
    ip = lambda r: r[0].rpartition(":")[0]  # noqa: E731
    return sum(ip(r) == ip(ring[rank]) for r in ring)


def default_init_addr(ring: list[list[str]]) -> str:
    """Where rank 0 waits for the other ranks when ``--dist-init-addr`` is not given: rank
    0's first address with the first port after its ring port that no ring address on that
    ip takes (``10.0.0.1:5001`` for ``[["10.0.0.1:5000"], ["10.0.0.2:5000"]]``;
    ``127.0.0.1:32325`` for two ranks on loopback from port 32323). Raises `ValueError` when
    there is none below 65536."""
    host, _, port = ring[0][0].rpartition(":")
    taken = {int(a.rpartition(":")[2]) for addrs in ring for a in addrs if a.rpartition(":")[0] == host}
    free = next((p for p in range(int(port) + 1, 65536) if p not in taken), None)
    if free is None:
        raise ValueError(f"no port after {port} on {host} for rank 0 to wait at; give --dist-init-addr")
    return f"{host}:{free}"
