"""SIGTERM/SIGINT under load: launch drains (new requests get a 503, those in flight finish)
for up to ``--shutdown-timeout`` seconds, then fails what is left with a clear error and
exits 0 with no orphan process and its run directory removed."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import zmq

from tests.support.launcher import ROOT, Server, alive, child_pids, free_port, title
from tokenizer_proc.errors import SERVER_ERROR

DEADLINE_S = 60


@dataclass
class Outcome:
    """What one client saw: status, the JSON body (non-streamed) or the SSE data lines
    (streamed), when it ended, and the transport error that cut it (None: it ended cleanly)."""

    status: int = 0
    body: dict = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    ended: float = 0.0
    broken: str | None = None


class Client(threading.Thread):
    """Sends `body` to ``/v1/completions`` in a thread; `outcome` holds the answer."""

    def __init__(self, base_url: str, body: dict) -> None:
        super().__init__(daemon=True)
        self.base_url, self.body, self.outcome = base_url, body, Outcome()

    def run(self) -> None:
        out = self.outcome
        try:
            if self.body.get("stream"):
                with httpx.stream("POST", f"{self.base_url}/v1/completions", json=self.body, timeout=DEADLINE_S) as r:
                    out.status = r.status_code
                    out.events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
            else:
                r = httpx.post(f"{self.base_url}/v1/completions", json=self.body, timeout=DEADLINE_S)
                out.status, out.body = r.status_code, r.json()
        except httpx.HTTPError as e:
            out.broken = f"{type(e).__name__}: {e}"
        out.ended = time.monotonic()


def start_clients(server: Server, bodies: list[dict], before: int = 0) -> list[Client]:
    """Start one client per body; returns once the HTTP process holds them all in flight
    (plus the `before` requests it held already)."""
    clients = [Client(server.base_url, b) for b in bodies]
    for c in clients:
        c.start()
    poll(lambda: in_flight(server) == before + len(bodies), f"{before + len(bodies)} requests in flight")
    return clients


def in_flight(server: Server) -> int:
    """The HTTP process's gauge of requests (choices) in flight."""
    text = httpx.get(f"{server.base_url}/metrics", timeout=5).text
    return int(float(re.search(r"^lazyserve_http_requests_in_flight (\S+)$", text, re.M).group(1)))


def poll(cond, what: str, timeout: float = 15.0) -> None:
    """Wait until `cond()` is true; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def health_status(server: Server) -> int:
    try:
        return httpx.get(f"{server.base_url}/health", timeout=5).status_code
    except httpx.HTTPError:
        return 0


def worker_pid(server: Server) -> int | None:
    """The pid of launch's worker now; None while there is none."""
    try:
        return server.child("worker")
    except StopIteration:
        return None


def finish_all(clients: list[Client]) -> list[Client]:
    """Join the clients (each within the deadline); returns those still hanging."""
    for c in clients:
        c.join(DEADLINE_S)
    return [c for c in clients if c.is_alive()]


def run_dir_of(server: Server) -> Path:
    return Path(re.search(r"run dir (\S+)\)", server.log()).group(1))


def assert_stopped_cleanly(server: Server, run_dir: Path, timeout: float) -> float:
    """launch exits 0 within `timeout` s, leaving no child and no run directory; returns when
    it exited (time.monotonic)."""
    code = server.proc.wait(timeout)
    exited = time.monotonic()
    assert code == 0, server.log()[-3000:]
    assert not [p for p in server.children if alive(p)], "orphan processes"
    assert not run_dir.exists()
    return exited


def completed(c: Client, max_tokens: int) -> bool:
    """The request ended normally: its finish reason, every token, and [DONE] on a stream."""
    out = c.outcome
    if out.broken or out.status != 200:
        return False
    if c.body.get("stream"):
        if not out.events or out.events[-1] != "[DONE]":
            return False
        chunks = [json.loads(e) for e in out.events[:-1]]
        if any("error" in ch for ch in chunks):
            return False
        reasons = [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"]]
        return reasons[-1] == "length" and chunks[-1]["usage"]["completion_tokens"] == max_tokens
    return out.body["choices"][0]["finish_reason"] == "length" and out.body["usage"]["completion_tokens"] == max_tokens


def failed_with_503(c: Client) -> bool:
    """The request got the shutdown error: a 503 JSON body, or an SSE error event then [DONE]."""
    out = c.outcome
    if out.broken:
        return False
    if c.body.get("stream"):
        if out.status != 200 or len(out.events) < 2 or out.events[-1] != "[DONE]":
            return False
        err = json.loads(out.events[-2]).get("error", {})
    else:
        err = out.body.get("error", {})
        if out.status != 503:
            return False
    return err.get("code") == 503 and err.get("type") == SERVER_ERROR and "shutting down" in err.get("message", "")


LATE = {
    "/v1/completions": {"prompt": "late", "max_tokens": 4},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "late"}], "max_tokens": 4},
    "/v1/responses": {"input": "late", "max_output_tokens": 16},
    "/generate": {"text": "late", "sampling_params": {"max_new_tokens": 4}},
}
"""A new request for each OpenAI-style route (and the native one, which shares its errors)."""


def refusals_while_draining(server: Server) -> list[tuple[str, int, str, bool]]:
    """(what was asked, status, error type, whether the message says the server is shutting
    down) of /health and of a new request, streamed and not, on each route of `LATE`."""
    out = []
    r = httpx.get(f"{server.base_url}/health", timeout=10)
    out.append(
        ("GET /health", r.status_code, r.json()["error"]["type"], "shutting down" in r.json()["error"]["message"])
    )
    for path, body in LATE.items():
        for stream in (False, True):
            r = httpx.post(f"{server.base_url}{path}", json={**body, "stream": stream}, timeout=10)
            err = r.json()["error"]
            out.append((f"POST {path} stream={stream}", r.status_code, err["type"], "shutting down" in err["message"]))
    return out


def test_sigterm_drains_requests_in_flight(tiny_model_dir, tmp_path):
    """6 requests in flight (2 running, 4 queued), SIGTERM: /health and new requests on every
    OpenAI-style route, streamed or not, get a 503 at once, each with the one error type of
    that family (/health said "unavailable", the routes "server_error"), while all 6 finish
    normally; then launch exits 0, no orphans, run dir gone. (500 tokens: with 200 the drain had
    ended, and launch exited, before the last refusal was asked for on a loaded machine.)"""
    max_tokens = 500
    server = Server(["--model", str(tiny_model_dir), "--max-running-requests", "2"], tmp_path / "log.txt")
    try:
        run_dir = run_dir_of(server)
        bodies = [
            {"prompt": f"Tell me {i}", "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0} for i in range(6)
        ]
        for b in bodies[::2]:
            b.update(stream=True, stream_options={"include_usage": True})
        clients = start_clients(server, bodies)
        signalled = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        poll(lambda: health_status(server) == 503, "/health 503")
        refused_at = time.monotonic()
        refusals = refusals_while_draining(server)
        hung = finish_all(clients)
        exited = assert_stopped_cleanly(server, run_dir, DEADLINE_S)
    finally:
        server.stop()
    assert not hung
    assert {(status, type_, said) for _, status, type_, said in refusals} == {(503, SERVER_ERROR, True)}, refusals
    done = [c for c in clients if completed(c, max_tokens)]
    assert len(done) == len(clients), [c.outcome for c in clients if c not in done]
    after = sum(c.outcome.ended > refused_at for c in clients)
    drain = re.search(r"drained\s+proc=launch seconds=(\S+)", server.log())
    assert drain is not None, server.log()[-3000:]
    print(
        f"\ndrain: in flight {len(clients)}, completed {len(done)} ({after} after /health turned 503), errored 0, "
        f"lost/hung 0; drain {drain.group(1)} s, SIGTERM to exit {exited - signalled:.2f} s"
    )


def test_sigterm_to_the_process_group_drains(tiny_model_dir, tmp_path):
    """SIGTERM to launch's whole process group (what `timeout`, `kill -- -PGID` or a terminal
    send) drains as one to launch does: the children, in sessions of their own, do not get it,
    so the 3 streams in flight finish with every token instead of a 503, and launch exits 0."""
    max_tokens = 150
    server = Server(["--model", str(tiny_model_dir)], tmp_path / "log.txt", new_group=True)
    try:
        run_dir = run_dir_of(server)
        bodies = [
            {
                "prompt": f"Tell me {i}",
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            for i in range(3)
        ]
        clients = start_clients(server, bodies)
        os.killpg(server.proc.pid, signal.SIGTERM)
        hung = finish_all(clients)
        assert_stopped_cleanly(server, run_dir, DEADLINE_S)
    finally:
        server.stop()
    assert not hung
    assert [completed(c, max_tokens) for c in clients] == [True] * 3, [c.outcome.events[-2:] for c in clients]
    assert "child process exited; shutting down" not in server.log()


@pytest.mark.parametrize("targets", ["every process", "one replica"])
def test_sigterm_to_the_processes_of_the_server_drains(targets, tiny_model_dir, tmp_path):
    """SIGTERM to launch and each of its children at once (what systemd's default
    KillMode=control-group or ``killall`` send) or to one replica drains as one to launch
    does: every child passes it on to launch and keeps serving (a replica that drained on it
    left the requests queued without one), so 2 running and 3 queued streams finish with
    every token; launch then stops the children and exits 0, with no orphans and its run dir
    removed. A SIGUSR2 (launch's drain signal) sent to a child by hand changes nothing. (The
    children alone, ``pkill lazyserve``, whose titles match where ``python launch.py`` does
    not: the first case's pass-on from every child, the second's drain on a pass-on alone.)
    (200 tokens: the tiny model decodes 60 in a quarter of a second, and the first requests
    had finished before the last one was in flight.)"""
    max_tokens = 200
    server = Server(
        ["--model", str(tiny_model_dir), "--max-running-requests", "2", "--detokenizers", "2"], tmp_path / "log.txt"
    )
    try:
        run_dir = run_dir_of(server)
        bodies = [
            {
                "prompt": f"Tell me {i}",
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            for i in range(5)
        ]
        clients = start_clients(server, bodies)
        assert len(server.children) == 5, server.children  # tokenizer, scheduler, worker, 2 replicas
        os.kill(server.child("tokenizer"), signal.SIGUSR2)
        targets = {
            "every process": [server.proc.pid, *server.children],
            "one replica": [server.child("detokenizer-1")],
        }[targets]
        for pid in targets:
            os.kill(pid, signal.SIGTERM)
        hung = finish_all(clients)
        assert_stopped_cleanly(server, run_dir, DEADLINE_S)
    finally:
        server.stop()
    assert not hung
    assert [completed(c, max_tokens) for c in clients] == [True] * 5, [c.outcome.events[-2:] for c in clients]
    log = server.log()
    assert log.count("SIGTERM: launch drains the server") == len(targets) - (server.proc.pid in targets), log[-3000:]
    assert re.search(r"drained\s+proc=launch", log) and "second signal" not in log
    assert "child process exited; shutting down" not in log and "did not stop" not in log


def test_sigterm_to_a_child_during_start_up_stops_the_server_cleanly(tiny_model_dir, tmp_path):
    """A SIGTERM to the scheduler before the server is ready (the stop handlers were installed
    only once a child served, so it died and launch failed the start with exit 1): launch
    stops the start-up and exits 0, with no orphans."""
    log = (tmp_path / "log.txt").open("w")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "launch.py"), "--model", str(tiny_model_dir), "--port", str(free_port())],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=str(ROOT),
    )
    try:
        poll(lambda: any(title(c) == "lazyserve::scheduler" for c in child_pids(proc.pid)), "a scheduler", 60)
        children = child_pids(proc.pid)
        scheduler = next(c for c in children if title(c) == "lazyserve::scheduler")
        os.kill(scheduler, signal.SIGTERM)
        assert proc.wait(DEADLINE_S) == 0, (tmp_path / "log.txt").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    text = (tmp_path / "log.txt").read_text()
    assert "start-up failed" not in text and "lazyserve ready" not in text
    poll(lambda: not [c for c in children if alive(c)], "no orphans", 20)


@pytest.mark.parametrize("case", ["timeout", "second-signal"])
def test_requests_left_after_the_drain_get_an_error(case, tiny_model_dir, tmp_path):
    """Long requests that cannot finish: after --shutdown-timeout 1 s (or a SIGINT during a
    60 s drain) each gets a 503 or an SSE error event then [DONE], never a cut connection;
    launch exits 0 within seconds (stopping the processes takes 1-9 s on 2 busy cores), no
    orphans, run dir gone."""
    timeout = 1.0 if case == "timeout" else 60.0
    server = Server(
        ["--model", str(tiny_model_dir), "--max-running-requests", "2", "--shutdown-timeout", str(timeout)],
        tmp_path / "log.txt",
    )
    try:
        run_dir = run_dir_of(server)
        bodies = [
            {"prompt": f"Go {i}", "max_tokens": 1900, "ignore_eos": True, "temperature": 0, "stream": i % 2 == 0}
            for i in range(4)
        ]
        clients = start_clients(server, bodies)
        signalled = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        poll(lambda: health_status(server) == 503, "/health 503")
        if case == "second-signal":  # the drain has begun: the HTTP process refuses new requests
            server.proc.send_signal(signal.SIGINT)
        exited = assert_stopped_cleanly(server, run_dir, (timeout if case == "timeout" else 0) + 20)
        hung = finish_all(clients)
    finally:
        server.stop()
    assert not hung
    errored = [c for c in clients if failed_with_503(c)]
    assert len(errored) == len(clients), [c.outcome.broken or c.outcome.status for c in clients]
    expected = "shutdown timeout passed" if case == "timeout" else "second signal: stopping at once"
    assert expected in server.log()
    print(
        f"\n{case}: in flight {len(clients)}, completed 0, errored {len(errored)}, lost/hung 0; SIGTERM to "
        f"last error {max(c.outcome.ended for c in clients) - signalled:.2f} s, to exit {exited - signalled:.2f} s"
    )


def test_worker_killed_during_the_drain_is_restarted_and_the_queue_finishes(tiny_model_dir, tmp_path):
    """SIGTERM with 2 long requests running and 4 short ones queued, then kill -9 of the
    worker during the drain: the 2 running ones get the worker's 503, launch restarts the
    worker as while serving, and the 4 queued ones finish normally; launch exits 0 (before,
    the drain ended at the worker's death: exit 1, the queued requests got 'shutting down')."""
    short = 8
    server = Server(["--model", str(tiny_model_dir), "--max-running-requests", "2"], tmp_path / "log.txt")
    try:
        run_dir = run_dir_of(server)
        bodies = [
            {"prompt": f"Go {i}", "max_tokens": 1900 if i < 2 else short, "ignore_eos": True, "temperature": 0}
            for i in range(6)
        ]
        for b in bodies[::2]:
            b.update(stream=True, stream_options={"include_usage": True})
        clients = start_clients(server, bodies[:2])
        clients += start_clients(server, bodies[2:], before=2)
        worker = server.child("worker")
        server.proc.send_signal(signal.SIGTERM)
        poll(lambda: health_status(server) == 503, "/health 503")
        os.kill(worker, signal.SIGKILL)
        killed = time.monotonic()
        poll(lambda: worker_pid(server) not in (None, worker), "the restarted worker", timeout=DEADLINE_S)
        restarted = worker_pid(server)
        exited = assert_stopped_cleanly(server, run_dir, DEADLINE_S)
        hung = finish_all(clients)
    finally:
        server.stop()
    assert not hung
    assert not alive(restarted)
    for c in clients[:2]:
        out = c.outcome
        err = json.loads(out.events[-2])["error"] if c.body.get("stream") else out.body["error"]
        assert err["code"] == 503 and "worker was killed by SIGKILL" in err["message"], out
    done = [c for c in clients[2:] if completed(c, short)]
    assert len(done) == 4, [c.outcome for c in clients[2:]]
    print(
        f"\nworker killed in the drain: running 2 (errored 503), queued 4 (completed {len(done)}), lost/hung 0; "
        f"kill to exit {exited - killed:.2f} s"
    )


class _Log:
    """A log that keeps nothing (the manager logs the drain and each request's end)."""

    def info(self, *args, **kwargs) -> None:
        pass

    warning = info


def test_a_stream_accepted_before_the_drain_still_runs(tmp_path):
    """A stream answered 200 just before SIGTERM (accepted, its room held) whose request
    starts once the drain has begun is sent to the scheduler like those in flight, and the
    drain waits for it; a request arriving during the drain gets the 503, and so does the
    accepted one once the manager fails everything. (Before, the accepted stream got a 200
    and then a 503 error event, and the drain did not wait for it.)"""
    from protocol import codec, endpoints
    from protocol.messages import GenerateReq
    from tokenizer_proc.errors import APIError
    from tokenizer_proc.link.tokenizer_manager import TokenizerManager
    from tokenizer_proc.request.choices import check_can_start

    async def run() -> None:
        mgr = TokenizerManager(str(tmp_path), log=_Log())
        scheduler = mgr.ctx.socket(zmq.PULL)
        scheduler.bind(endpoints.scheduler(tmp_path))  # where the manager sends requests
        try:
            reqs = [GenerateReq("accepted", [1, 2, 3], 4)]
            hold = check_can_start(mgr, reqs)  # the 200 goes out here
            drain = asyncio.create_task(mgr._drain())
            await asyncio.sleep(0.1)
            assert mgr.stopping and not drain.done() and mgr.in_flight == 1
            with pytest.raises(APIError) as late:
                check_can_start(mgr, [GenerateReq("late", [1], 4)])
            assert late.value.status == 503
            stream = mgr.generate(reqs[0], hold=hold)
            first = asyncio.create_task(stream.__anext__())
            sent = codec.to_scheduler.decode(await asyncio.wait_for(scheduler.recv(), 5))
            assert isinstance(sent, GenerateReq) and sent.rid == "accepted"
            assert mgr.in_flight == 1 and mgr.held == 0 and not drain.done()
            mgr.fail_all("stopping")
            with pytest.raises(APIError):
                await first
            await stream.aclose()
            assert mgr.in_flight == 0
            with pytest.raises(APIError):  # accepted, but starting only after everything failed
                await mgr.generate(GenerateReq("held late", [1], 4), hold=mgr.hold(1)).__anext__()
            assert drain.cancelled() or (await asyncio.gather(drain, return_exceptions=True))
        finally:
            mgr.close()

    asyncio.run(run())


def test_launch_children_start_with_no_signal_ignored():
    """A child of launch inherits its signal dispositions until `start_child` sets its own,
    which takes seconds of imports on a busy machine. Launch ignored `STOP_SIGNAL`, an ignored
    signal stays ignored across exec, and a tokenizer still importing when a worker failed
    the start dropped launch's stop and ran on until killed ('child did not stop')."""
    script = (
        "import subprocess, sys, types, launcher.supervisor\n"
        "launcher.supervisor.install_signal_handlers(types.SimpleNamespace(stop_requested=False, signals=0))\n"
        "subprocess.run([sys.executable, '-c', "
        '\'print(next(l for l in open("/proc/self/status") if l.startswith("SigIgn:")))\'], check=True)\n'
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=str(ROOT), timeout=60
    ).stdout
    ignored = int(out.split()[1], 16)
    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        assert not ignored & (1 << (sig - 1)), f"{sig.name} is ignored in launch's children: {out}"


def test_a_normal_stop_logs_no_line_that_reads_like_a_fault(tiny_model_dir, tmp_path):
    """Ctrl-C of a server that served a request logs its stop at info and debug only: every
    closed link of the stop used to log 'peer connection closed ... or one that sent a frame
    over 268435456 bytes (dropped)' (four lines at every Ctrl-C), read as a fault. A replica
    detached before it (a normal act) logs its closed links without that note either."""
    server = Server(["--model", str(tiny_model_dir), "--detokenizers", "2"], tmp_path / "log.txt")
    try:
        run_dir = run_dir_of(server)
        r = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "Hi", "max_tokens": 4}, timeout=60)
        assert r.status_code == 200
        detach = subprocess.run(
            [sys.executable, "-m", "detokenizer_proc", "--detach", str(run_dir), "1"],
            cwd=str(ROOT),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert detach.returncode == 0, detach.stderr
        before = len(server.log())
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(60) == 0
    finally:
        server.stop()
    log = server.log()
    stop = log[before:]
    assert "stopped" in stop and "draining" in stop, stop
    faults = [
        line
        for line in stop.splitlines()
        if re.search(r"\[(warning|error|critical)", line) or "peer connection closed" in line
    ]
    assert not faults, "\n".join(faults)
    assert "frame over" not in log and "(dropped)" not in log
