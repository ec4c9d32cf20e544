"""The private run directory and the `ipc://` endpoints inside it (DESIGN.md §3).

Each receiving socket binds its own endpoint; senders connect. The directory is created
with mode 0700 so no other user can connect to the server's sockets.
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

import zmq

SERVER_ARGS_FILE = "server_args.json"
STOPPING_FILE = "stopping"
"""Written by launch when the server starts to stop (its drain, or its stop): from then on a
link that closes is a process stopping, and the sockets log it at debug only
(`protocol.sockets`)."""
GRAMMAR_TOKENIZER_FILE = "grammar_tokenizer.json"
"""xgrammar's TokenizerInfo (``serialize_json()``), written by the tokenizer process before
it is ready, read by the scheduler's grammar backend."""
TOKENIZER_CLASS_FILE = "tokenizer_class.json"
"""The tokenizer class transformers' ``AutoTokenizer`` chose (``{"module", "name"}``), written
by the tokenizer process once it loaded the tokenizer, read by the detokenizer replicas
(`text.hf_tokenizer.load_resolved_tokenizer`)."""


LONGEST_SOCKET_NAME = "detokenizer-pid4194304.sock"
"""The longest socket name a run directory gets (`attached_detokenizer` at Linux's largest
pid): the directory's path must leave room for it within `zmq.IPC_PATH_MAX_LEN` bytes."""


def write_run_file(run_dir: str | Path, name: str, text: str) -> Path:
    """Write `text` as ``run_dir / name`` atomically (a temporary file of this process, then a
    rename), so a process polling for the file never reads it half written; return its
    path. Raises `OSError` when it cannot be written."""
    path = Path(run_dir) / name
    tmp = path.with_name(f"{name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def _own_entry(name: str) -> bool:
    """Whether `name` is a file lazyserve writes into a run directory (one an earlier run left)."""
    return (
        name in (SERVER_ARGS_FILE, STOPPING_FILE)
        or name.startswith((GRAMMAR_TOKENIZER_FILE, TOKENIZER_CLASS_FILE))
        or name.endswith(".sock")
        or (name.startswith("tp-hostfile-") and name.endswith(".json"))
    )


def _check_socket_room(run_dir: Path) -> None:
    longest = len(os.fsencode(run_dir / LONGEST_SOCKET_NAME))
    if longest > zmq.IPC_PATH_MAX_LEN:
        room = zmq.IPC_PATH_MAX_LEN - len(LONGEST_SOCKET_NAME) - 1
        raise ValueError(
            f"the run directory {run_dir} is too long for its ipc:// sockets: a socket path holds "
            f"at most {zmq.IPC_PATH_MAX_LEN} bytes, which leaves {room} for the directory "
            f"(this one has {len(os.fsencode(run_dir))}); name a shorter one"
        )


def _check_unused(run_dir: Path) -> None:
    if not run_dir.is_dir():
        raise ValueError(f"the run directory {run_dir} exists and is not a directory")
    foreign = sorted(e.name for e in run_dir.iterdir() if not _own_entry(e.name))
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise ValueError(
            f"the run directory {run_dir} holds files lazyserve did not write ({shown}): launch "
            f"makes its run directory private (mode 0700) and binds sockets in it, so it takes "
            f"only a new, empty or earlier run directory"
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(run_dir / "control.sock"))
    except OSError:
        return  # no socket there, or one nothing listens on: an earlier run's
    finally:
        probe.close()
    raise ValueError(f"the run directory {run_dir} is in use by a running lazyserve server; name another one")


def make_run_dir(path: str | None = None) -> Path:
    """Create the run directory (mode 0700) and return it.

    path: a directory to use: created if missing; an existing one must be empty or hold
    only files lazyserve writes (an earlier run's), with no server running in it, and is
    then made mode 0700. None makes a fresh one under the system temp dir. Raises
    `ValueError` for a path that is too long for the sockets (`LONGEST_SOCKET_NAME` must
    fit in `zmq.IPC_PATH_MAX_LEN`), that is not a directory, that holds other files, or
    that a running server uses; `OSError` if it cannot be created.
    """
    if path is None:
        run_dir = Path(tempfile.mkdtemp(prefix="lazyserve-"))
        try:
            _check_socket_room(run_dir)
        except ValueError:
            run_dir.rmdir()
            raise
        return run_dir
    run_dir = Path(path).resolve()
    _check_socket_room(run_dir)
    if run_dir.exists():
        _check_unused(run_dir)
    run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(run_dir, 0o700)
    (run_dir / STOPPING_FILE).unlink(missing_ok=True)  # an earlier run's
    return run_dir


def stopping_marker(endpoint: str) -> Path | None:
    """The `STOPPING_FILE` of the run directory `endpoint` (an ``ipc://`` endpoint of it)
    lies in; None for another transport."""
    return Path(endpoint.removeprefix("ipc://")).parent / STOPPING_FILE if endpoint.startswith("ipc://") else None


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
    (`worker_proc.tp.sharding.RankForwarder`)."""
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
