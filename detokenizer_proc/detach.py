"""``python -m detokenizer_proc --detach RUN_DIR INDEX``: drain one replica and wait until it left.

It reads the replica registry from the server's status endpoint
(``GET /v1/internal/detokenizers`` at the host and port in RUN_DIR's server args, with the
server's API key when it has one), checks
that INDEX is serving, sends `DrainReplica(INDEX)` to the scheduler, then polls until the
replica is gone: it finishes the requests it holds and takes no new ones meanwhile.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request

import zmq

from protocol import codec, endpoints
from protocol.messages import DrainReplica

DETACH_WAIT_S = 600.0
POLL_S = 0.2


def _status(url: str, api_key: str) -> dict:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
        return json.loads(r.read())


def status_url(host: str, port: int) -> str:
    """The replica status endpoint of a server listening on `host` (`--host`) and `port`: a
    wildcard host is reached on loopback, an IPv6 literal in brackets."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/v1/internal/detokenizers"


def _replica(status: dict, index: int) -> dict | None:
    return next((r for r in status["replicas"] if r["index"] == index), None)


def detach(run_dir: str, index: int, wait_s: float = DETACH_WAIT_S) -> int:
    """Drain replica `index` of the server in `run_dir`; returns the exit code (0: it left;
    1: it did not leave within `wait_s`; 2: no such server or replica)."""
    from detokenizer_proc.proc import load_server_args

    args = load_server_args(run_dir)
    url = status_url(args.host, args.port)
    try:
        status = _status(url, args.api_key)
    except (OSError, urllib.error.URLError, ValueError) as e:
        print(f"lazyserve detokenizer: cannot read the replica status at {url}: {e}", file=sys.stderr)
        return 2
    rep = _replica(status, index)
    if rep is None or rep["state"] == "gone":
        live = ", ".join(str(r["index"]) for r in status["replicas"] if r["state"] != "gone") or "none"
        print(
            f"lazyserve detokenizer: no live detokenizer replica {index} in {run_dir} (live: {live})", file=sys.stderr
        )
        return 2
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(endpoints.scheduler(run_dir))
    sock.send(codec.encoder.encode(DrainReplica(index)))
    sock.close()
    ctx.term()
    print(
        f"draining detokenizer replica {index} (pid {rep['pid']}): it finishes its {rep['load']} running "
        f"requests and takes no new ones",
        flush=True,
    )
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(POLL_S)
        try:
            rep = _replica(_status(url, args.api_key), index)
        except (OSError, urllib.error.URLError, ValueError):
            continue
        if rep is None or rep["state"] == "gone":
            print(f"detokenizer replica {index} left", flush=True)
            return 0
    print(f"lazyserve detokenizer: replica {index} has not left after {wait_s:g} s", file=sys.stderr)
    return 1
