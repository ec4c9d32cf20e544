"""Issue 14, stream liveness and observability, through `launch.py` on the tiny model: one
log line per request (counts and times, no text), the request metrics in /metrics,
``--queue-timeout``, and the stall bound (``--stall-timeout``) with a worker stopped by
SIGSTOP. One server (JSON logs, one running request at a time) serves the module. The
deadlines on the scheduler driven by the fake worker: tests/sim/test_observability.py; the
request log, the health probe and log lines: tests/unit/test_observability.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.launcher import Server, stop_and_check

QUEUE_TIMEOUT_S = 1.5
STALL_TIMEOUT_S = 4.0
MARKER = "zebra-quokka-7731"
"""A word in the prompts that must never reach the log (no --log-requests)."""


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    server = Server(
        [
            "--model",
            str(tiny_model_dir),
            "--log-format",
            "json",
            "--max-running-requests",
            "1",
            "--queue-timeout",
            str(QUEUE_TIMEOUT_S),
            "--stall-timeout",
            str(STALL_TIMEOUT_S),
        ],
        tmp_path_factory.mktemp("logs") / "observe.log",
    )
    yield server
    stop_and_check(server)


def log_events(server: Server, event: str) -> list[dict]:
    """The JSON log lines of every process whose event is `event`."""
    out = []
    for line in server.log().splitlines():
        if line.startswith("{"):
            rec = json.loads(line)
            if rec.get("event") == event:
                out.append(rec)
    return out


def wait_events(server: Server, event: str, rid: str, count: int = 1, timeout: float = 10.0) -> list[dict]:
    """Poll the log until `count` lines of `event` name `rid`; returns them."""
    deadline = time.monotonic() + timeout
    while len(found := [e for e in log_events(server, event) if e.get("rid") == rid]) < count:
        assert time.monotonic() < deadline, f"no {event!r} line for {rid}:\n{server.log()[-3000:]}"
        time.sleep(0.1)
    return found


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """/metrics as {(sample name, sorted labels): value}."""
    text = httpx.get(f"{url}/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def worker_pid(server: Server) -> int:
    return next(p for p in server.children if b"lazyserve::worker" in Path(f"/proc/{p}/cmdline").read_bytes())


def sse_events(text: str) -> list:
    return [
        json.loads(line[6:]) if line != "data: [DONE]" else "[DONE]"
        for line in text.splitlines()
        if line.startswith("data: ")
    ]


def test_one_log_line_per_request_and_the_request_metrics(server):
    url = server.base_url
    before = scrape(url)
    bodies = [
        ("/v1/completions", {"prompt": f"{MARKER} one", "max_tokens": 5, "temperature": 0, "ignore_eos": True}),
        ("/v1/completions", {"prompt": f"{MARKER} two three", "max_tokens": 3, "temperature": 0, "ignore_eos": True}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": MARKER}], "max_tokens": 4, "ignore_eos": True},
        ),
    ]
    usages, outputs = {}, []
    for path, body in bodies:
        r = httpx.post(url + path, json=body, timeout=60)
        assert r.status_code == 200, r.text
        usages[r.json()["id"]] = r.json()["usage"]
        choice = r.json()["choices"][0]
        outputs.append(choice.get("text") or choice["message"]["content"])
    streamed = httpx.post(
        url + "/v1/completions",
        json={
            "prompt": f"{MARKER} four",
            "max_tokens": 6,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        },
        timeout=60,
    )
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]"
    usages[events[0]["id"]] = events[-2]["usage"]
    outputs.append("".join(e["choices"][0]["text"] for e in events[:-2] if e["choices"]))

    for rid, usage in usages.items():
        (line,) = wait_events(server, "request", rid)
        assert line["proc"] == "tokenizer" and line["finish_reason"] == "length"
        assert line["prompt_tokens"] == usage["prompt_tokens"]
        assert line["output_tokens"] == usage["completion_tokens"]
        assert line["cached_tokens"] == (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        assert line["queue_s"] >= 0 and line["prefill_s"] > 0 and line["decode_s"] >= 0
        assert 0 < line["ttft_s"] <= line["e2e_s"] and line["decode_s"] <= line["e2e_s"]
        assert "prompt" not in line and "output" not in line
    log = server.log()
    assert MARKER not in log
    assert not [o for o in outputs if len(o) >= 8 and o in log], "output text in the log"

    after = scrape(url)
    n = len(usages)
    prompt = sum(u["prompt_tokens"] for u in usages.values())
    generated = sum(u["completion_tokens"] for u in usages.values())

    def grew(name: str, **labels) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert grew("lazyserve_prompt_tokens_total") == prompt
    assert grew("lazyserve_generation_tokens_total") == generated
    assert grew("lazyserve_request_success_total", finished_reason="length") == n
    for hist in (
        "time_to_first_token",
        "e2e_request_latency",
        "request_queue_time",
        "request_prefill_time",
        "request_decode_time",
    ):
        assert grew(f"lazyserve_{hist}_seconds_count") == n, hist
        assert grew(f"lazyserve_{hist}_seconds_bucket", le="+Inf") == n, hist
    assert grew("lazyserve_inter_token_latency_seconds_count") == generated - n
    assert ("lazyserve_num_requests_running", ()) in after and ("lazyserve_num_requests_waiting", ()) in after


async def _first_chunk_then(url: str, body: dict, action, more: int | None = None) -> tuple[list, object]:
    """Stream `body`; once its first chunk arrives run `action()` (a coroutine), then read
    `more` chunks (None: to the stream's end) and close it. Returns (the stream's events,
    what action returned)."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            events, result = [], None
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    events.append("[DONE]" if line == "data: [DONE]" else json.loads(line[6:]))
                    if len(events) == 1:
                        result = await action()
                    elif more is not None and len(events) > more:
                        break
    return events, result


LONG = {"prompt": "count", "max_tokens": 1500, "ignore_eos": True, "stream": True}


def test_queue_timeout_fails_the_queued_request_while_one_runs(server):
    """With one request running (its worker stopped, so it surely outlasts the timeout) the
    queued ones fail after --queue-timeout: a 503 JSON and an SSE error then [DONE]; the
    running one goes on once the worker continues."""
    pid = worker_pid(server)

    async def queued() -> tuple[httpx.Response, httpx.Response]:
        os.kill(pid, signal.SIGSTOP)
        try:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
                body = {"prompt": "queued", "max_tokens": 2}
                t0 = time.monotonic()
                plain, streamed = await asyncio.gather(
                    client.post("/v1/completions", json=body),
                    client.post("/v1/completions", json={**body, "stream": True}),
                )
                assert QUEUE_TIMEOUT_S <= time.monotonic() - t0 < STALL_TIMEOUT_S
                return plain, streamed
        finally:
            os.kill(pid, signal.SIGCONT)

    events, (plain, streamed) = asyncio.run(_first_chunk_then(server.base_url, LONG, queued, more=5))
    assert plain.status_code == 503
    assert "timed out in the queue" in plain.json()["error"]["message"]
    sse = sse_events(streamed.text)
    assert sse[-1] == "[DONE]" and sse[-2]["error"]["code"] == 503
    assert "timed out in the queue" in sse[-2]["error"]["message"]
    assert len(events) == 6 and all(e["choices"][0]["finish_reason"] is None for e in events)  # it went on
    timed_out = [e for e in log_events(server, "request timed out in the queue; failing it")]
    assert len(timed_out) == 2 and {e["state"] for e in timed_out} == {"queued"}


def wait_health(url: str, status: int, timeout: float) -> httpx.Response:
    """Poll `url`/health until it answers `status`; returns that answer. Raises
    `AssertionError` with the last answer after `timeout` s."""
    deadline = time.monotonic() + timeout
    while (r := httpx.get(f"{url}/health", timeout=10)).status_code != status:
        assert time.monotonic() < deadline, f"/health is still {r.status_code} {r.text}, expected {status}"
        time.sleep(0.05)
    return r


def test_a_stalled_request_is_logged_everywhere_and_fails(server):
    """SIGSTOP the worker mid-stream: after --stall-timeout the stream gets an error event and
    [DONE], the scheduler, the detokenizer replica and the HTTP process log the request with
    its state, and /health is a 503 saying the worker does not answer (serving-cases.md: a
    healthy /health in front of a dead generation loop is a failure; it said 200 throughout);
    after SIGCONT /health is 200 and the server serves again."""
    pid = worker_pid(server)

    async def stop() -> float:
        os.kill(pid, signal.SIGSTOP)
        return time.monotonic()

    try:
        events, stopped_at = asyncio.run(_first_chunk_then(server.base_url, LONG, stop))
        waited = time.monotonic() - stopped_at
        down = wait_health(server.base_url, 503, 2.0)
        assert "the worker has sent no result for" in down.json()["error"]["message"], down.text
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_health(server.base_url, 200, 10.0)
    assert events[-1] == "[DONE]"
    err = events[-2]["error"]
    assert err["code"] == 503 and "no progress" in err["message"], err
    assert STALL_TIMEOUT_S - 0.5 < waited < STALL_TIMEOUT_S + 5
    rid = events[0]["id"]
    (sched,) = wait_events(server, "request stalled: no progress; failing it", rid)
    assert sched["proc"] == "scheduler" and sched["state"] == "decoding" and sched["kv_slots"] > 0
    assert sched["idle_s"] > STALL_TIMEOUT_S and sched["output_tokens"] >= 1
    (detok,) = wait_events(server, "request failed by the scheduler", rid)
    assert detok["known"] and detok["reason"] == "stalled" and detok["chars_rendered"] >= 0
    (line,) = wait_events(server, "request", rid)
    assert line["status"] == 503 and line["stage"] == "decoding" and line["since_last_output_s"] > STALL_TIMEOUT_S - 1
    r = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "again", "max_tokens": 3}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_a_stopped_scheduler_turns_health_503_naming_it(server):
    """SIGSTOP the scheduler mid-stream (its loop stops turning; the process lives): /health,
    which said 200 throughout (only the worker's silence was timed, and by the scheduler
    itself), is a 503 naming the scheduler within --stall-timeout (the HTTP process times the
    scheduler's answer to its health probe), the stream gets an error event saying so (it
    hung with keep-alives for as long as the scheduler did) and a new request a 503; after
    SIGCONT /health is 200 again and requests are served."""
    pid = server.child("scheduler")
    assert wait_health(server.base_url, 200, 10.0).json() == {"status": "ok"}

    async def stop() -> float:
        os.kill(pid, signal.SIGSTOP)
        return time.monotonic()

    try:
        events, stopped_at = asyncio.run(_first_chunk_then(server.base_url, LONG, stop))
        ended = time.monotonic() - stopped_at
        down = wait_health(server.base_url, 503, STALL_TIMEOUT_S + 5)
        waited = time.monotonic() - stopped_at
        late = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "late", "max_tokens": 3}, timeout=30)
    finally:
        os.kill(pid, signal.SIGCONT)
    err = down.json()["error"]
    assert err["code"] == 503 and "the scheduler has not answered a health probe" in err["message"], err
    assert f"--stall-timeout {STALL_TIMEOUT_S:g} s" in err["message"], err
    assert STALL_TIMEOUT_S - 0.5 < waited < STALL_TIMEOUT_S + 5
    assert events[-1] == "[DONE]" and STALL_TIMEOUT_S - 0.5 < ended < STALL_TIMEOUT_S + 5
    assert "the scheduler has not answered a health probe" in events[-2]["error"]["message"], events[-2]
    assert late.status_code == 503 and "the scheduler has not answered" in late.json()["error"]["message"]
    wait_health(server.base_url, 200, 10.0)
    r = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "again", "max_tokens": 3}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
