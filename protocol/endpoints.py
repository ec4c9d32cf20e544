"""The private run directory and the `ipc://` endpoints inside it (DESIGN.md §3).

Each receiving socket binds its own endpoint; senders connect. The directory is created
with mode 0700 so no other user can connect to the server's sockets.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

SERVER_ARGS_FILE = "server_args.json"
GRAMMAR_TOKENIZER_FILE = "grammar_tokenizer.json"
"""xgrammar's TokenizerInfo (``serialize_json()``), written by the tokenizer process before
it is ready, read by the scheduler's grammar backend."""


def make_run_dir(path: str | None = None) -> Path:
    """Create the run directory (mode 0700) and return it.

    path: a directory to use (created if missing, must be empty of sockets); None makes a
    fresh one under the system temp dir. Raises `OSError` if it cannot be created.
    """
    if path is None:
        return Path(tempfile.mkdtemp(prefix="lazyserve-"))
    run_dir = Path(path).resolve()
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(run_dir, 0o700)
    return run_dir


def _ipc(run_dir: Path | str, name: str) -> str:
    return f"ipc://{Path(run_dir) / name}"


def control(run_dir: Path | str) -> str:
    """Launch's PULL endpoint for Hello/Ready/Failed."""
    return _ipc(run_dir, "control.sock")


def scheduler(run_dir: Path | str) -> str:
    """The scheduler's PULL endpoint (ToScheduler channel)."""
    return _ipc(run_dir, "scheduler.sock")


def worker(run_dir: Path | str) -> str:
    """The worker's PULL endpoint (ToWorker channel)."""
    return _ipc(run_dir, "worker.sock")


def worker_rank(run_dir: Path | str, rank: int) -> str:
    """The PULL endpoint of tensor-parallel rank `rank` > 0, fed by rank 0
    (`worker_proc.tensor_parallel.RankForwarder`)."""
    return _ipc(run_dir, f"worker-rank{rank}.sock")


def worker_results(run_dir: Path | str) -> str:
    """The scheduler's PULL endpoint for the FromWorker channel."""
    return _ipc(run_dir, "worker-results.sock")


def tokenizer(run_dir: Path | str) -> str:
    """The tokenizer's PULL endpoint (ToTokenizer channel)."""
    return _ipc(run_dir, "tokenizer.sock")


def detokenizer(run_dir: Path | str, index: int) -> str:
    """The PULL endpoint (ToDetokenizer channel) of replica `index`, one launch started."""
    return _ipc(run_dir, f"detokenizer-{index}.sock")


def attached_detokenizer(run_dir: Path | str, pid: int) -> str:
    """The PULL endpoint of an attached replica (process `pid`), which learns its index
    only once the scheduler has registered it."""
    return _ipc(run_dir, f"detokenizer-pid{pid}.sock")


def scheduler_control(run_dir: Path | str) -> str:
    """The scheduler's PULL endpoint for replica registration (Control channel: Hello, Ready)."""
    return _ipc(run_dir, "scheduler-control.sock")
