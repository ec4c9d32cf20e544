"""Surviving the death of a process (issue 14, faults 1-3): the worker is restarted while the
server keeps its queue; the scheduler, the tokenizer or launch itself dying stops the whole
server with no orphan process left.

Each test runs `launch.py` on the tiny model and kills -9 one of its processes, and prints
a ``RECOVERY`` line with its numbers (requests sent, errors, completed, lost, hung, seconds).
`Scheduler.worker_lost` / `worker_ready` with the fake worker: tests/sim/test_recovery.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time

import httpx
import pytest

from tests.support.launcher import Server, alive, child_pids
from tests.support.pool_state import metrics, wait_idle
from tests.support.stream_faults import body, health_until_back, stream, until

LONG = 2000  # tokens of the requests that are on the device when the worker dies
SHORT = 8  # tokens of the requests that wait meanwhile
EXIT_DEADLINE_S = 20.0  # launch must have exited, and every child with it, within this


# --------------------------------------------------------------------------- processes
@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    """Two requests run at most, so the others wait; it dies in the scheduler test."""
    run_dir = tmp_path_factory.mktemp("recovery") / "run"
    srv = Server(
        ["--model", str(tiny_model_dir), "--max-running-requests", "2", "--run-dir", str(run_dir)],
        tmp_path_factory.mktemp("logs") / "recovery.log",
    )
    srv.run_dir = run_dir
    yield srv
    srv.stop()


async def kill_worker_under_load(server: Server) -> dict:
    """Two long requests decode (one streamed, one not) and four short ones wait (two of
    each) when the worker is killed; returns what happened to them."""
    url = server.base_url
    async with httpx.AsyncClient(timeout=httpx.Timeout(10, read=120)) as c:

        async def scheduler_has(running: int, waiting: int) -> bool:
            m = metrics(url)
            return (
                m.get("lazyserve_num_requests_running") == running
                and m.get("lazyserve_num_requests_waiting") == waiting
            )

        long_events: list = []
        long_stream = asyncio.create_task(stream(c, url, LONG, long_events))
        long_plain = asyncio.create_task(c.post(f"{url}/v1/completions", json=body(LONG, False)))
        await until(lambda: scheduler_has(2, 0), 30, "2 running requests")
        short_events: list[list] = [[], []]
        short_streams = [asyncio.create_task(stream(c, url, SHORT, ev)) for ev in short_events]
        short_plain = [asyncio.create_task(c.post(f"{url}/v1/completions", json=body(SHORT, False))) for _ in range(2)]
        await until(lambda: scheduler_has(2, 4), 30, "4 waiting requests")
        assert len(long_events) >= 1 and not long_stream.done() and not long_plain.done()
        worker = server.child("worker")
        seen: list[tuple[int, str]] = []
        os.kill(worker, signal.SIGKILL)
        killed = time.monotonic()
        await asyncio.wait_for(health_until_back(c, url, seen), 120)
        recovery_s = time.monotonic() - killed
        tasks = [long_stream, long_plain, *short_streams, *short_plain]
        _, hung = await asyncio.wait(tasks, timeout=60)
        fresh = await c.post(f"{url}/v1/completions", json=body(SHORT, False))
    assert not hung, f"{len(hung)} requests hung"
    assert server.child("worker") != worker
    return {
        "events": long_events,
        "plain": long_plain.result(),
        "short_events": short_events,
        "short_plain": [t.result() for t in short_plain],
        "health": seen,
        "recovery_s": recovery_s,
        "fresh": fresh,
        "hung": len(hung),
    }


def test_worker_killed_mid_decode_twice(server):
    """kill -9 of the worker, twice: the requests on the device get a 503 (an SSE error event
    then [DONE] when streamed), the waiting ones complete once the restarted worker is ready,
    /health is 503 meanwhile, and the server serves again with its KV pool back to idle."""
    for round_ in (1, 2):
        r = asyncio.run(kill_worker_under_load(server))
        events = r["events"]
        assert events[-1] == "[DONE]", events[-3:]
        error = events[-2]["error"]
        assert error["code"] == 503 and "worker was killed by SIGKILL" in error["message"], error
        assert r["plain"].status_code == 503, r["plain"].text
        assert "worker was killed by SIGKILL" in r["plain"].json()["error"]["message"]
        for ev in r["short_events"]:
            assert ev[-1] == "[DONE]" and not any("error" in e for e in ev[:-1]), ev
            assert ev[-2]["choices"][0]["finish_reason"] == "length"
        for resp in r["short_plain"]:
            assert resp.status_code == 200, resp.text
            assert resp.json()["usage"]["completion_tokens"] == SHORT
        down = [message for status, message in r["health"] if status == 503]
        assert down and "recovering: the worker was killed by SIGKILL" in down[0] and r["health"][-1][0] == 200
        assert r["fresh"].status_code == 200 and r["fresh"].json()["usage"]["completion_tokens"] == SHORT
        wait_idle(server.base_url, timeout=5.0)
        server.wait_log("worker replaced; serving again", round_)
        print(
            f"\nRECOVERY worker kill {round_}: sent 7 (2 on the device, 4 waiting, 1 after), errors 2 (503), "
            f"completed 5, lost 0, hung {r['hung']}, recovery_s {r['recovery_s']:.1f}"
        )


def wait_gone(pids: list[int], timeout: float = EXIT_DEADLINE_S) -> float:
    """Poll until none of `pids` is alive; returns the seconds it took."""
    t0 = time.monotonic()
    while left := [p for p in pids if alive(p)]:
        assert time.monotonic() - t0 < timeout, f"still alive after {timeout} s: {left}"
        time.sleep(0.05)
    return time.monotonic() - t0


def kill_child(server: Server, name: str) -> tuple[list[int], float]:
    """kill -9 launch's child `name`; returns launch's children before, and when."""
    pids = child_pids(server.proc.pid)
    os.kill(server.child(name), signal.SIGKILL)
    return pids, time.monotonic()


def check_exit(server: Server, name: str, pids: list[int], killed: float) -> float:
    """Launch exits 1 within `EXIT_DEADLINE_S` of `killed`, naming child `name`, leaving none
    of `pids` alive and no run directory. Returns the seconds until launch exited."""
    code = server.proc.wait(max(0.0, killed + EXIT_DEADLINE_S - time.monotonic()))
    exit_s = time.monotonic() - killed
    assert code == 1
    log = server.log()
    line = next((ln for ln in log.splitlines() if "child process exited; shutting down" in ln), "")
    assert f"proc={name}" in line and "was killed by SIGKILL" in line, log[-2000:]
    wait_gone(pids)
    assert not server.run_dir.exists()
    return exit_s


def test_scheduler_killed_stops_the_server(server):
    """kill -9 of the scheduler (which holds every request's state, so it is not restarted):
    a stream in flight ends with an error event naming the scheduler's death and [DONE],
    launch exits 1 within seconds,
    and nothing is left behind."""
    events: list[str] = []
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body(LONG, True), timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 1:
                    pids, killed = kill_child(server, "scheduler")
    exit_s = check_exit(server, "scheduler", pids, killed)
    assert events[-1] == "[DONE]", events[-3:]
    error = json.loads(events[-2])["error"]
    assert error["code"] == 503 and "the scheduler was killed by SIGKILL" in error["message"], error
    print(f"\nRECOVERY scheduler kill: sent 1, errors 1 (503), lost 0, hung 0, launch exited 1 after {exit_s:.1f} s")


def test_tokenizer_killed_stops_the_server(tiny_model_dir, tmp_path):
    """kill -9 of the HTTP process: launch exits 1, the others stop, nothing is left behind."""
    server = Server(["--model", str(tiny_model_dir), "--run-dir", str(tmp_path / "run")], tmp_path / "log.txt")
    server.run_dir = tmp_path / "run"
    try:
        exit_s = check_exit(server, "tokenizer", *kill_child(server, "tokenizer"))
    finally:
        server.stop()
    print(f"\nRECOVERY tokenizer kill: launch exited 1 after {exit_s:.1f} s")


def test_launch_killed_leaves_no_orphans(tiny_model_dir, tmp_path):
    """kill -9 of launch itself: every child gets SIGTERM from the kernel (PR_SET_PDEATHSIG)
    and exits."""
    server = Server(["--model", str(tiny_model_dir)], tmp_path / "log.txt")
    pids = child_pids(server.proc.pid)
    assert len(pids) == 4
    try:
        os.kill(server.proc.pid, signal.SIGKILL)
        gone_s = wait_gone(pids)
    finally:
        server.stop()
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)
    print(f"\nRECOVERY launch kill: all {len(pids)} children gone after {gone_s:.1f} s")


def test_run_directory_removed_stops_the_server(tiny_model_dir, tmp_path):
    """The run directory removed while serving (a /tmp cleaner): launch exits 1 within
    seconds saying why, the others stop, nothing is left behind (it stayed up answering 503
    'no detokenizer replica is live' for ever, its replicas gone and never restarted)."""
    import shutil

    run_dir = tmp_path / "run"
    server = Server(["--model", str(tiny_model_dir), "--run-dir", str(run_dir)], tmp_path / "log.txt")
    try:
        pids = child_pids(server.proc.pid)
        removed = time.monotonic()
        shutil.rmtree(run_dir)
        code = server.proc.wait(EXIT_DEADLINE_S)
        exit_s = time.monotonic() - removed
        assert code == 1
        assert "the run directory was removed while serving" in server.log(), server.log()[-2000:]
        wait_gone(pids)
    finally:
        server.stop()
    print(f"\nRECOVERY run directory removed: launch exited 1 after {exit_s:.1f} s")
