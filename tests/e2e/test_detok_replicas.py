"""Integration tests of detokenizer replicas (issue 5, DESIGN.md §7) on the tiny random
model, through `launch.py` and HTTP: the status endpoint, kill -9 of a replica under 24
streams, attaching a replica under load and detaching it, a replica of another protocol
version, and requests that wait for a replica when none is left."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from protocol import PROTOCOL_VERSION
from tests.support.launcher import ROOT, Server, alive, stop_and_check, title

WAIT_S = 2  # --detokenizer-wait-s of the server under test


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("replicas") / "run"


@pytest.fixture(scope="module")
def server(tiny_model_dir, run_dir, tmp_path_factory):
    srv = Server(
        [
            "--model",
            str(tiny_model_dir),
            "--detokenizers",
            "3",
            "--run-dir",
            str(run_dir),
            "--detokenizer-wait-s",
            str(WAIT_S),
        ],
        tmp_path_factory.mktemp("logs") / "replicas.log",
    )
    yield srv
    stop_and_check(srv)


def status(url: str) -> dict:
    r = httpx.get(f"{url}/v1/internal/detokenizers", timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def wait_status(url: str, pred, timeout: float = 30.0, what: str = "") -> dict:
    """Poll the status endpoint until `pred(status)` holds."""
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(f"{url}/v1/internal/detokenizers", timeout=10)
        st = r.json() if r.status_code == 200 else None  # 503 until the scheduler's first report
        if st is not None and pred(st):
            return st
        if time.monotonic() > deadline:
            raise AssertionError(f"status never showed {what}: {st}")
        time.sleep(0.1)


def body(prompt: str, max_tokens: int, stream: bool) -> dict:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream}


async def full_text(c: httpx.AsyncClient, url: str, prompt: str, max_tokens: int) -> str:
    r = await c.post(f"{url}/v1/completions", json=body(prompt, max_tokens, False))
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


async def stream_text(c: httpx.AsyncClient, url: str, prompt: str, max_tokens: int, chunks: list[int], i: int) -> str:
    """Stream a completion; chunks[i] counts the text events seen so far."""
    text, finish = "", None
    async with c.stream("POST", f"{url}/v1/completions", json=body(prompt, max_tokens, True)) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            text += event["choices"][0]["text"]
            finish = event["choices"][0]["finish_reason"] or finish
            chunks[i] += 1
    assert finish == "length"
    return text


async def until(pred, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def attach(run_dir: Path, *extra_python: str) -> subprocess.Popen:
    """Start ``python -m detokenizer_proc --attach RUN_DIR`` (after `extra_python` statements)."""
    code = "; ".join(
        [
            *extra_python,
            "from detokenizer_proc.__main__ import run",
            f"raise SystemExit(run(['--attach', {str(run_dir)!r}]))",
        ]
    )
    return subprocess.Popen(
        [sys.executable, "-c", code], cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def attached_index(proc: subprocess.Popen, timeout: float = 90) -> int:
    """Read the attached replica's "attached ... as replica N" line; returns N."""
    deadline = time.monotonic() + timeout
    line = ""
    while time.monotonic() < deadline and proc.poll() is None:
        line = proc.stdout.readline()
        if "as replica" in line:
            return int(line.split("as replica")[1].split()[0])
    raise AssertionError(
        f"replica did not attach: {line!r} {proc.poll()} {proc.stderr.read() if proc.poll() is not None else ''}"
    )


PROMPTS = [
    f"Story {i}: in the land of 日本語 and 🌶️🍣, a {['cat', 'dog', 'fox'][i % 3]} named {i * 7}" for i in range(24)
]


def test_status_lists_the_launched_replicas(server):
    st = wait_status(server.base_url, lambda s: all(r["pid"] for r in s["replicas"]), what="every pid")
    assert [(r["index"], r["state"], r["attached"]) for r in st["replicas"]] == [(i, "live", False) for i in range(3)]
    assert [title(r["pid"]) for r in st["replicas"]] == [f"lazyserve::detokenizer-{i}" for i in range(3)]
    assert (st["waiting"], st["failed"], st["lost"]) == (0, 0, 0)


async def test_kill_a_replica_mid_stream_loses_and_repeats_nothing(server):
    """3 replicas, 24 concurrent streams, kill -9 of the busiest replica once every stream has
    text: every stream completes and equals the same request's non-streamed text."""
    url, n, max_tokens = server.base_url, len(PROMPTS), 400
    async with httpx.AsyncClient(timeout=180) as c:
        refs = await asyncio.gather(*(full_text(c, url, p, max_tokens) for p in PROMPTS))
        chunks = [0] * n
        tasks = [asyncio.create_task(stream_text(c, url, p, max_tokens, chunks, i)) for i, p in enumerate(PROMPTS)]
        await until(lambda: min(chunks) >= 3, 60, "text on every stream")
        st = await asyncio.to_thread(
            wait_status, url, lambda s: sum(r["load"] for r in s["replicas"]) == n, 10, "every stream routed"
        )
        victim = max(st["replicas"], key=lambda r: r["load"])
        assert not any(t.done() for t in tasks), "a stream ended before the kill"
        os.kill(victim["pid"], signal.SIGKILL)
        outs = await asyncio.gather(*tasks)
    assert victim["load"] >= 4
    for i in range(n):
        assert outs[i] == refs[i], f"stream {i}: {outs[i][:120]!r} != {refs[i][:120]!r}"
    after = wait_status(
        url,
        lambda s: (
            s["replicas"][victim["index"]]["state"] == "live"
            and s["replicas"][victim["index"]]["pid"] not in (0, victim["pid"])
        ),
        60,
        "the restart",
    )
    assert after["lost"] == 1
    assert sum(r["reseeded"] for r in after["replicas"]) >= victim["load"]
    assert after["replicas"][victim["index"]]["reseeded"] == 0
    assert "detokenizer replica died; restarting it" in server.log()


async def test_attach_under_load_then_detach(server, run_dir):
    """A replica attached while streams run takes new requests (counted by the status
    endpoint); --detach drains it: its requests complete, then it exits 0."""
    url = server.base_url
    async with httpx.AsyncClient(timeout=180) as c:
        background = [asyncio.create_task(stream_text(c, url, f"Background {i}:", 1900, [0] * 6, i)) for i in range(6)]
        proc = attach(run_dir)
        try:
            index = await asyncio.to_thread(attached_index, proc)
            assert index == 3
            assert title(proc.pid) == "lazyserve::detokenizer-3"
            st = await asyncio.to_thread(
                wait_status,
                url,
                lambda s: len(s["replicas"]) == 4 and s["replicas"][3]["state"] == "live",
                10,
                "replica 3 live",
            )
            assert st["replicas"][3]["attached"] and st["replicas"][3]["pid"] == proc.pid
            assert not any(t.done() for t in background), "the load ended before the replica attached"
            chunks = [0] * 8
            new = [asyncio.create_task(stream_text(c, url, PROMPTS[i], 300, chunks, i)) for i in range(8)]
            st = await asyncio.to_thread(
                wait_status, url, lambda s: s["replicas"][3]["load"] >= 2, 20, "requests on the attached replica"
            )
            assert st["replicas"][3]["routed"] >= 2
            detach = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "detokenizer_proc",
                "--detach",
                str(run_dir),
                "3",
                cwd=str(ROOT),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            outs = await asyncio.gather(*new)
            d_out, d_err = await asyncio.wait_for(detach.communicate(), 120)
            assert detach.returncode == 0, d_err.decode()
            assert "draining detokenizer replica 3" in d_out.decode() and "replica 3 left" in d_out.decode()
            assert await asyncio.to_thread(proc.wait, 30) == 0
            for t in background:
                t.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            refs = await asyncio.gather(*(full_text(c, url, PROMPTS[i], 300) for i in range(8)))
        finally:
            if proc.poll() is None:
                proc.kill()
    assert outs == refs
    st = status(url)
    assert st["replicas"][3]["state"] == "gone" and st["lost"] == 1  # a drained replica is not lost
    assert st["replicas"][3]["routed"] >= 2


def test_wrong_protocol_version_is_refused(server, run_dir):
    proc = attach(run_dir, "import protocol", "protocol.PROTOCOL_VERSION = 99")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, (out, err)
    assert f"refused: this detokenizer speaks protocol 99, the server speaks {PROTOCOL_VERSION}" in err
    assert "run the replica from the same lazyserve version as the server" in err
    assert "refused a detokenizer replica" in server.log()
    st = status(server.base_url)
    assert len(st["replicas"]) == 4 and all(r["pid"] != proc.pid for r in st["replicas"])


def test_bad_command_lines_are_refused(tmp_path):
    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "detokenizer_proc", *args], cwd=str(ROOT), capture_output=True, text=True, timeout=60
        )

    r = run("--attach", str(tmp_path))
    assert r.returncode == 2 and f"no lazyserve server in {tmp_path}" in r.stderr
    r = run("--attach", str(tmp_path), "3")
    assert r.returncode == 2 and "--attach takes no INDEX" in r.stderr
    r = run(str(tmp_path))
    assert r.returncode == 2 and "INDEX is required" in r.stderr


def test_detach_of_an_unknown_replica_says_so(server, run_dir):
    r = subprocess.run(
        [sys.executable, "-m", "detokenizer_proc", "--detach", str(run_dir), "9"],
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert f"no live detokenizer replica 9 in {run_dir} (live: 0, 1, 2)" in r.stderr


def test_with_no_replica_left_requests_wait_then_fail_until_one_attaches(server, run_dir):
    """--detach drains the launched replicas (idle: they leave at once, and launch does not
    restart a replica that left); a request then waits --detokenizer-wait-s and fails with a
    503 that says why; once a replica attaches, requests are served again. (A SIGTERM to a
    launched replica stops the whole server instead: tests/e2e/test_shutdown.py.)"""
    url = server.base_url
    live = [r for r in status(url)["replicas"] if r["state"] == "live"]
    pids = [r["pid"] for r in live]
    assert len(pids) == 3
    for r in live:
        done = subprocess.run(
            [sys.executable, "-m", "detokenizer_proc", "--detach", str(run_dir), str(r["index"])],
            cwd=str(ROOT),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
    wait_status(url, lambda s: all(r["state"] == "gone" for r in s["replicas"]), 30, "every replica gone")
    deadline = time.monotonic() + 20
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)
    server.wait_log("detokenizer replica left (drained); not restarting it", count=3)
    assert server.proc.poll() is None
    health = httpx.get(f"{url}/health", timeout=10)
    assert health.status_code == 503 and "no detokenizer replica is live" in health.json()["error"]["message"]
    t0 = time.monotonic()
    r = httpx.post(f"{url}/v1/completions", json=body("Hi", 4, False), timeout=60)
    assert r.status_code == 503
    assert f"no detokenizer replica was available for {WAIT_S} s" in r.json()["error"]["message"]
    assert WAIT_S - 0.5 < time.monotonic() - t0 < WAIT_S + 5
    proc = attach(run_dir)
    try:
        index = attached_index(proc)
        r = httpx.post(f"{url}/v1/completions", json=body("Hi there", 6, False), timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 6
        wait_status(url, lambda s: s["replicas"][index]["state"] == "live", 5, "the attached replica live")
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        st = wait_status(url, lambda s: s["replicas"][index]["routed"] == 1, 5, "the request on the attached replica")
        assert st["replicas"][index]["state"] == "live" and st["failed"] == 1
    finally:
        proc.send_signal(signal.SIGTERM)  # drains (idle) and leaves
        assert proc.wait(30) == 0
