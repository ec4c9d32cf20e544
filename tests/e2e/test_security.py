"""Security defaults and limits (issue 14) over real HTTP: one server on the tiny
random-weight model, started as a user would with the key in ``LAZYSERVE_API_KEY``, 1 running
and 1 waiting request and 64 KiB bodies. Each rule's cases in-process: tests/api/test_security.py."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import stat
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.launcher import ROOT, HttpProcess, child_pids, free_port, stop_and_check
from tests.support.security import COMPLETION, KEY, assert_error
from tokenizer_proc.link.tokenizer_manager import RETRY_AFTER_S


# ---------------------------------------------------------------- a launched server
@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    """Tiny model, key from the environment, 1 running + 1 waiting request, 64 KiB bodies,
    keep-alives after 0.2 s of silence."""
    port = free_port()
    cmd = [
        sys.executable,
        str(ROOT / "launch.py"),
        "--port",
        str(port),
        "--model",
        str(tiny_model_dir),
        "--max-running-requests",
        "1",
        "--max-queued-requests",
        "1",
        "--max-request-body-bytes",
        "65536",
        "--sse-keepalive-s",
        "0.2",
    ]
    proc = HttpProcess(
        cmd, port, tmp_path_factory.mktemp("logs") / "security.log", env={**os.environ, "LAZYSERVE_API_KEY": KEY}
    )
    proc.children = child_pids(proc.proc.pid)
    yield proc
    stop_and_check(proc)


def test_openai_client_with_right_and_wrong_key(server):
    good = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEY)
    r = good.completions.create(model=good.models.list().data[0].id, prompt="Hi", max_tokens=4, temperature=0)
    assert r.usage.completion_tokens == 4
    bad = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.completions.create(model="m", prompt="Hi", max_tokens=4)
    assert e.value.status_code == 401 and e.value.body["type"] == "authentication_error"


def test_raw_http_x_api_key_health_and_metrics(server):
    url = server.base_url
    assert httpx.get(f"{url}/health").status_code == 200
    assert_error(httpx.get(f"{url}/metrics"), 401, "authentication_error", "missing API key")
    assert "lazyserve_http_requests_in_flight" in httpx.get(f"{url}/metrics", headers={"x-api-key": KEY}).text
    r = httpx.post(f"{url}/v1/completions", json=COMPLETION, headers={"x-api-key": KEY}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_key_is_not_logged_and_args_file_is_private(server):
    log = server.log()
    assert KEY not in log
    run_dir = Path(re.search(r"run dir (\S+)\)", log).group(1))
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((run_dir / "server_args.json").stat().st_mode) == 0o600


def test_large_bodies_are_413_over_http(server):
    url, auth = server.base_url, {"x-api-key": KEY}
    r = httpx.post(f"{url}/v1/completions", json={**COMPLETION, "prompt": "x" * 70_000}, headers=auth)
    assert_error(r, 413, "invalid_request_error", "larger than 65536 bytes")
    chunks = [b'{"prompt": "'] + [b"x" * 16384] * 5 + [b'", "max_tokens": 4}']
    r = httpx.post(f"{url}/v1/completions", content=iter(chunks), headers={**auth, "content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert_error(r, 413, "invalid_request_error", "larger than 65536 bytes")


def wait_in_flight(url: str, count: int, timeout: float = 30.0) -> None:
    """Poll /metrics until the HTTP process holds `count` requests."""
    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(f"{url}/metrics", headers={"x-api-key": KEY}).text
        if f"lazyserve_http_requests_in_flight {float(count)}" in text:
            return
        assert time.monotonic() < deadline, text
        time.sleep(0.05)


def test_full_queue_is_429_with_retry_after(server):
    """With the worker stopped (SIGSTOP), one request runs and one waits; the next is a 429.
    The waiting streams get SSE keep-alive comments, then their tokens once it resumes."""
    url, auth = server.base_url, {"x-api-key": KEY}
    worker = next(p for p in server.children if b"lazyserve::worker" in Path(f"/proc/{p}/cmdline").read_bytes())
    body = {**COMPLETION, "stream": True}
    with httpx.Client(base_url=url, headers=auth, timeout=60) as c:
        os.kill(worker, signal.SIGSTOP)
        try:
            with (
                c.stream("POST", "/v1/completions", json=body) as first,
                c.stream("POST", "/v1/completions", json=body) as second,
            ):
                assert first.status_code == second.status_code == 200
                lines = first.iter_lines()
                assert next(line for line in lines if line) == ": keep-alive"  # queued, worker stopped: alive
                wait_in_flight(url, 2)
                r = c.post("/v1/completions", json=COMPLETION)
                assert_error(
                    r, 429, "rate_limit_error", "1 waiting (queued requests), and 1 more would pass the limit of 1"
                )
                assert r.headers["retry-after"] == str(RETRY_AFTER_S)
                assert c.post("/generate", json={"text": "Hi", "stream": True}).status_code == 429
                os.kill(worker, signal.SIGCONT)
                assert [line for line in lines if line][-1] == "data: [DONE]"
                assert second.read().decode().rstrip().endswith("data: [DONE]")
        finally:
            os.kill(worker, signal.SIGCONT)
        wait_in_flight(url, 0)
        r = c.post("/v1/completions", json=COMPLETION)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_a_burst_never_passes_the_queue_limit(server):
    """Requests that arrive together are counted against --max-queued-requests as each is
    accepted, not when its stream starts: with the worker stopped, of 6 streams sent at once
    (then 6 non-streamed) exactly running + waiting = 2 are accepted, the others get a 429
    with Retry-After (the streams before their 200), and the HTTP process holds 2. (Counted
    when each choice's stream started, more were accepted, and streams got a 200 then a 429
    error event.)"""
    url, auth = server.base_url, {"x-api-key": KEY}
    worker = next(p for p in server.children if b"lazyserve::worker" in Path(f"/proc/{p}/cmdline").read_bytes())
    wait_in_flight(url, 0)

    async def burst(stream: bool) -> list[tuple[int, str]]:
        go = asyncio.Event()
        answered: list[int] = []
        async with httpx.AsyncClient(base_url=url, headers=auth, timeout=60) as c:

            async def one() -> tuple[int, str]:
                if not stream:
                    r = await c.post("/v1/completions", json=COMPLETION)
                    return r.status_code, r.headers.get("retry-after", "") if r.status_code == 429 else r.text
                async with c.stream("POST", "/v1/completions", json={**COMPLETION, "stream": True}) as r:
                    answered.append(r.status_code)
                    if r.status_code != 200:
                        return r.status_code, r.headers.get("retry-after", "")
                    await go.wait()
                    return 200, (await r.aread()).decode()

            tasks = [asyncio.ensure_future(one()) for _ in range(6)]
            deadline = time.monotonic() + 30  # every stream answers its status; refused requests at once
            while (len(answered) if stream else sum(t.done() for t in tasks)) < (6 if stream else 4):
                assert time.monotonic() < deadline, answered
                await asyncio.sleep(0.05)
            await asyncio.to_thread(wait_in_flight, url, 2)
            await asyncio.sleep(0.5)  # nothing else is accepted late
            held = httpx.get(f"{url}/metrics", headers=auth).text
            assert "lazyserve_http_requests_in_flight 2.0" in held
            os.kill(worker, signal.SIGCONT)
            go.set()
            return await asyncio.gather(*tasks)

    for stream in (True, False):
        os.kill(worker, signal.SIGSTOP)
        try:
            done = asyncio.run(burst(stream))
        finally:
            os.kill(worker, signal.SIGCONT)
        assert sorted(s for s, _ in done) == [200, 200, 429, 429, 429, 429], (stream, done)
        for status, text in done:
            if status == 429:
                assert text == str(RETRY_AFTER_S)
            elif stream:
                assert text.rstrip().endswith("data: [DONE]") and '"error"' not in text, text
            else:
                assert '"completion_tokens":4' in text, text
        wait_in_flight(url, 0)
