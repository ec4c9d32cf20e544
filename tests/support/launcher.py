"""Starting `launch.py` as a user would (a subprocess) and inspecting its processes.

Used by the tests and by the benchmarks in bench/; imports nothing but httpx.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """An unused TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid` (from /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


class HttpProcess:
    """A server subprocess that answers ``GET /health`` with 200 once ready. base_url:
    ``http://127.0.0.1:PORT``; log: its output file."""

    def __init__(
        self,
        cmd: list[str],
        port: int,
        log_path: Path,
        timeout: float = 300,
        env: dict[str, str] | None = None,
        new_group: bool = False,
    ) -> None:
        """Start `cmd` (which must listen on `port`; in a process group of its own with
        `new_group`, as a shell starts a job) and wait up to `timeout` s for /health.
        Raises `RuntimeError` with the log when it exits or is not healthy in time."""
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.log_file = open(log_path, "w")
        self.proc = subprocess.Popen(
            cmd, stdout=self.log_file, stderr=subprocess.STDOUT, cwd=str(ROOT), env=env, start_new_session=new_group
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{log_path.read_text()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        else:
            self.stop()
            raise RuntimeError(f"server not healthy after {timeout}s:\n{log_path.read_text()}")

    def log(self) -> str:
        """Everything the server printed so far."""
        return self.log_path.read_text()

    def wait_log(self, text: str, count: int = 1, timeout: float = 15.0) -> str:
        """Poll the log until `text` occurs `count` times (launch logs what it sees only at its
        next supervision tick); returns the log. Raises AssertionError after `timeout` s."""
        deadline = time.monotonic() + timeout
        while (log := self.log()).count(text) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not {count}× in the log:\n{log[-3000:]}")
            time.sleep(0.1)
        return log

    def stop(self) -> int:
        """SIGTERM the server and wait (SIGKILL after 30 s); returns its exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_file.close()
        return self.proc.returncode


class Server(HttpProcess):
    """A `launch.py` subprocess on a free port; children: its direct child processes at start."""

    def __init__(self, args: list[str], log_path: Path, timeout: float = 300, new_group: bool = False) -> None:
        port = free_port()
        super().__init__(
            [sys.executable, str(ROOT / "launch.py"), "--port", str(port), *args],
            port,
            log_path,
            timeout,
            new_group=new_group,
        )
        self.children = child_pids(self.proc.pid)

    def child(self, name: str) -> int:
        """The pid of launch's child titled ``lazyserve::<name>`` now (e.g. "worker").
        Raises `StopIteration` when there is none."""
        return next(p for p in child_pids(self.proc.pid) if title(p) == f"lazyserve::{name}")


def title(pid: int) -> str:
    """The process title of `pid` (lazyserve children set ``lazyserve::<role>``); "" when gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return ""


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False


def left_alive(pids: list[int], timeout_s: float = 5.0) -> list[int]:
    """The processes of `pids` still alive after polling up to `timeout_s` seconds for all of
    them to be gone (a process that exited may take a moment to be reaped)."""
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


def run_launch(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """Run `launch.py` with `args` (on a free port) to its end: the start-up errors."""
    return subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), "--port", str(free_port()), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(ROOT),
    )


def stop_and_check(server: Server) -> None:
    """Stop `server` and assert it exited 0 leaving no child process behind."""
    code = server.stop()
    left = left_alive(server.children)
    assert code == 0, server.log()[-3000:]
    assert not left, f"orphan processes after SIGTERM: {left}"
