"""Issue 14, stream liveness and observability, through `launch.py` on the tiny model: one
log line per request (counts and times, no text), the request metrics in /metrics,
``--queue-timeout``, and the stall bound (``--stall-timeout``) with a worker stopped by
SIGSTOP. One server (JSON logs, one running request at a time) serves the module."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest
import structlog
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

import launcher.args
from protocol.enums import FinishReason, ForwardMode
from protocol.messages import BatchTokenOut, DetokAbort, Finalize, ReqError, ReqTiming, WorkerAbort
from scheduler_proc.deadlines import Deadlines
from scheduler_proc.scheduler import Scheduler
from tests.conftest import stop_and_check
from tests.launcher import Server
from tests.sim_worker import FakeWorker, ListOutbox
from tests.test_scheduler import gen, step
from tokenizer_proc.errors import APIError
from tokenizer_proc.link.metrics import RequestMetrics
from tokenizer_proc.link.request_log import MAX_LOGGED_CHARS, RequestLog

QUEUE_TIMEOUT_S = 1.5
STALL_TIMEOUT_S = 4.0
MARKER = "zebra-quokka-7731"
"""A word in the prompts that must never reach the log (no --log-requests)."""


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    server = Server(["--model", str(tiny_model_dir), "--log-format", "json", "--max-running-requests", "1",
                     "--queue-timeout", str(QUEUE_TIMEOUT_S), "--stall-timeout", str(STALL_TIMEOUT_S)],
                    tmp_path_factory.mktemp("logs") / "observe.log")
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
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def worker_pid(server: Server) -> int:
    return next(p for p in server.children if b"lazyserve::worker" in Path(f"/proc/{p}/cmdline").read_bytes())


def sse_events(text: str) -> list:
    return [json.loads(line[6:]) if line != "data: [DONE]" else "[DONE]"
            for line in text.splitlines() if line.startswith("data: ")]


def test_one_log_line_per_request_and_the_request_metrics(server):
    url = server.base_url
    before = scrape(url)
    bodies = [
        ("/v1/completions", {"prompt": f"{MARKER} one", "max_tokens": 5, "temperature": 0, "ignore_eos": True}),
        ("/v1/completions", {"prompt": f"{MARKER} two three", "max_tokens": 3, "temperature": 0, "ignore_eos": True}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": MARKER}], "max_tokens": 4,
                                  "ignore_eos": True}),
    ]
    usages, outputs = {}, []
    for path, body in bodies:
        r = httpx.post(url + path, json=body, timeout=60)
        assert r.status_code == 200, r.text
        usages[r.json()["id"]] = r.json()["usage"]
        choice = r.json()["choices"][0]
        outputs.append(choice.get("text") or choice["message"]["content"])
    streamed = httpx.post(url + "/v1/completions", json={"prompt": f"{MARKER} four", "max_tokens": 6, "stream": True,
                                                         "ignore_eos": True, "stream_options": {"include_usage": True}},
                          timeout=60)
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
        assert 0 <= line["queue_s"] and 0 < line["prefill_s"] and 0 <= line["decode_s"]
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
    for hist in ("time_to_first_token", "e2e_request_latency", "request_queue_time", "request_prefill_time",
                 "request_decode_time"):
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
                plain, streamed = await asyncio.gather(client.post("/v1/completions", json=body),
                                                       client.post("/v1/completions", json={**body, "stream": True}))
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


def test_health_probes_the_scheduler_once_for_callers_at_once():
    """`SchedulerProbe`: callers asking at once share one probe; an answer clears it (the
    next call sends a new one); a probe unanswered past the timeout makes every caller's
    answer name the scheduler until it is answered; 0 never probes; a caller waits at most
    answer_wait_s, and a probe younger than the timeout is no stall."""
    from tokenizer_proc.link.scheduler_probe import SchedulerProbe

    async def scenario() -> None:
        sent = []

        async def send(msg) -> None:
            sent.append(msg.seq)

        probe = SchedulerProbe(send, 0.3)
        calls = [asyncio.create_task(probe.stalled()) for _ in range(3)]
        await asyncio.sleep(0.05)
        probe.answered(sent[-1])
        assert await asyncio.gather(*calls) == ["", "", ""] and sent == [1]
        t0 = time.monotonic()
        late = await asyncio.gather(probe.stalled(), probe.stalled())
        assert 0.25 < time.monotonic() - t0 < 2 and sent == [1, 2]
        assert all(m.startswith("the scheduler has not answered a health probe for 0.3") for m in late), late
        t0 = time.monotonic()
        assert (await probe.stalled()).startswith("the scheduler has not answered") and time.monotonic() - t0 < 0.1
        probe.answered(1)  # not the probe out
        assert probe.out is not None
        probe.answered(2)
        asyncio.get_running_loop().call_later(0.05, lambda: probe.answered(3))
        assert await probe.stalled() == "" and sent == [1, 2, 3]
        assert await SchedulerProbe(send, 0).stalled() == "" and sent == [1, 2, 3]
        patient = SchedulerProbe(send, 30.0, answer_wait_s=0.1)  # a caller never waits out a long timeout
        t0 = time.monotonic()
        assert await patient.stalled() == "" and time.monotonic() - t0 < 1 and patient.out is not None

    asyncio.run(scenario())


# ---------------------------------------------------------------- units: deadlines, timings, the log line
class FakeClock:
    """Monotonic seconds that the test sets."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def deadline_scheduler(queue_timeout: float | None, stall_timeout: float):
    clock = FakeClock()
    out = ListOutbox()
    worker = FakeWorker()
    out.fake_worker = worker
    sched = Scheduler(out, max_running_requests=1, max_prefill_tokens=1024, detokenizers=1,
                      deadlines=Deadlines(queue_timeout, stall_timeout), clock=clock)
    return sched, out, worker, clock


def test_queue_timeout_fails_waiting_requests_only_and_timings_ride_the_first_token():
    sched, out, worker, clock = deadline_scheduler(queue_timeout=1.5, stall_timeout=0)
    sched.add_request(gen("a", max_new=10))
    sched.add_request(gen("b", max_new=10))
    clock.t = 0.5
    batch = sched.next_batch()  # a admitted at 0.5; b waits (one running at most)
    out.to_worker(sched.launch(batch))
    out.to_worker(Finalize(batch.launch_id))
    clock.t = 0.75
    sched.process_result(batch, out.results.popleft())
    (first,) = [m for m in out.detok[0] if isinstance(m, BatchTokenOut)]
    assert first.timings == [ReqTiming(0.5, 0.25)]
    assert step(sched, worker).mode == ForwardMode.DECODE
    assert not [m for m in out.detok[0] if isinstance(m, BatchTokenOut) and m.timings][1:]  # the first token's only
    clock.t = 1.5
    sched.expire()
    assert [r.rid for r in sched.waiting] == ["b"]  # not yet past 1.5 s
    clock.t = 1.8  # expire looks at most every CHECK_INTERVAL_S (0.25 s)
    sched.expire()
    (err,) = [m for m in out.tokenizer if isinstance(m, ReqError)]
    assert err.rid == "b" and err.status == 503 and "timed out in the queue" in err.message
    assert not sched.waiting and "b" not in sched.reqs and "a" in sched.reqs
    assert not [m for m in out.worker if isinstance(m, WorkerAbort) and "b" in m.rids]  # the worker never had it
    clock.t = 100.0  # a was admitted: the queue timeout never applies to it
    sched.expire()
    assert "a" in sched.reqs


def test_stall_bound_fails_running_requests_and_waits_longer_for_queued_ones():
    sched, out, worker, clock = deadline_scheduler(queue_timeout=None, stall_timeout=4.0)
    sched.add_request(gen("a", max_new=10))
    sched.add_request(gen("b", max_new=10))
    step(sched, worker)
    step(sched, worker)
    clock.t = 3.9
    sched.expire()
    assert "a" in sched.reqs
    clock.t = 4.2  # a made no progress since 0 (its last token)
    sched.expire()
    (err,) = [m for m in out.tokenizer if isinstance(m, ReqError)]
    assert err.rid == "a" and err.status == 503 and "no progress" in err.message and "decoding" in err.message
    assert WorkerAbort(["a"]) in out.worker and DetokAbort("a", "stalled") in out.detok[0]
    assert "b" in sched.reqs and not sched.running  # queued: 4x the bound
    clock.t = 4 * 4.0 + 0.1
    sched.expire()
    assert "b" not in sched.reqs and out.tokenizer[-1].rid == "b" and "queued" in out.tokenizer[-1].message
    sched.mem.check()


def test_waiting_behind_work_the_worker_does_is_no_stall():
    """A decoding request that gets no token while the worker computes other launches (a
    long prefill) is not failed as stalled, however long that takes (it was, with "the
    server may be stuck"); once the worker returns nothing for the bound, it is."""
    sched, out, worker, clock = deadline_scheduler(queue_timeout=None, stall_timeout=4.0)
    sched.max_running = 2
    sched.add_request(gen("s", max_new=50))
    step(sched, worker)
    step(sched, worker)  # s's last token at 0
    sched.add_request(gen("x", max_new=50))
    clock.t = 3.0
    batch = sched.next_batch()  # x's prefill, computed until 3.0: s waits behind it
    assert batch.mode == ForwardMode.EXTEND and [r.rid for r in batch.reqs] == ["x"]
    launch = sched.launch(batch)
    out.to_worker(launch)
    out.to_worker(Finalize(batch.launch_id))
    sched.process_result(batch, out.results.popleft())
    clock.t = 4.5  # s: 4.5 s without a token, the worker's last result 1.5 s ago
    sched.expire()
    assert not [m for m in out.tokenizer if isinstance(m, ReqError)] and "s" in sched.reqs
    clock.t = 7.2  # nothing from the worker for 4.2 s
    sched.expire()
    failed = {m.rid: m.message for m in out.tokenizer if isinstance(m, ReqError)}
    assert set(failed) == {"s", "x"} and "the worker returned no result for 4.2 s" in failed["s"]


class Metrics:
    """Fresh request metrics and a reader of their samples."""

    def __init__(self) -> None:
        self.m = RequestMetrics(lambda: None, lambda: 0)

    def __getitem__(self, name: str) -> float:
        return self.m.registry.get_sample_value(name) or 0.0


def test_request_log_line_and_metrics_and_text_only_when_asked():
    def run(prompt_text):
        clock, metrics = FakeClock(), Metrics()
        rlog = RequestLog(structlog.get_logger(), metrics.m, prompt_text, clock)
        req = gen("r", n_prompt=4)
        with capture_logs() as logs:
            rec = rlog.start(req)
            clock.t = 0.5
            rlog.delta(rec, 1, "Hello\n", 1, ReqTiming(0.1, 0.3))
            clock.t = 0.8
            rlog.delta(rec, 4, "x" * (MAX_LOGGED_CHARS + 10), 0, None)  # 3 tokens in one step
            rlog.end(rec, FinishReason.LENGTH)
        return logs, metrics

    logs, metrics = run(None)
    (line,) = logs
    assert line["event"] == "request" and line["rid"] == "r" and line["finish_reason"] == "length"
    assert (line["prompt_tokens"], line["cached_tokens"], line["output_tokens"]) == (4, 1, 4)
    assert (line["queue_s"], line["prefill_s"], line["ttft_s"], line["decode_s"], line["e2e_s"]) == (0.1, 0.3, 0.5,
                                                                                                      0.3, 0.8)
    assert "prompt" not in line and "output" not in line
    assert metrics["lazyserve_prompt_tokens_total"] == 4 and metrics["lazyserve_generation_tokens_total"] == 4
    assert metrics["lazyserve_inter_token_latency_seconds_count"] == 3
    assert metrics["lazyserve_inter_token_latency_seconds_sum"] == pytest.approx(0.3)
    assert metrics["lazyserve_time_to_first_token_seconds_sum"] == 0.5
    assert metrics["lazyserve_request_queue_time_seconds_sum"] == 0.1
    assert metrics.m.registry.get_sample_value("lazyserve_request_success_total", {"finished_reason": "length"}) == 1

    logs, _ = run(lambda ids: " ".join(f"w{i}" for i in ids))
    (line,) = logs
    assert line["prompt"] == "w10 w11 w12 w13"
    assert line["output"].startswith("Hello\nxxx") and line["output"].endswith(
        f"... (cut; {MAX_LOGGED_CHARS + 16} characters in all)")
    assert len(line["output"]) < MAX_LOGGED_CHARS + 50


def test_request_log_error_and_client_abort():
    clock, metrics = FakeClock(), Metrics()
    rlog = RequestLog(structlog.get_logger(), metrics.m, None, clock)
    with capture_logs() as logs:
        rlog.end(rlog.start(gen("e")), None, APIError("request timed out in the queue", 503))
        rec = rlog.start(gen("c"))
        rlog.delta(rec, 1, "a", 0, None)
        rlog.end(rec, None)
    err, left = logs
    assert err["log_level"] == "warning" and err["status"] == 503 and err["stage"] == "queued or prefilling"
    assert left["finish_reason"] == "abort" and left["output_tokens"] == 1
    get = metrics.m.registry.get_sample_value
    assert get("lazyserve_request_errors_total", {"status": "503"}) == 1
    assert get("lazyserve_request_success_total", {"finished_reason": "abort"}) == 1
    assert metrics["lazyserve_e2e_request_latency_seconds_count"] == 0  # only finished requests


def test_log_flags_parse():
    ns = launcher.args.parse_args(["--log-requests", "--queue-timeout", "2.5", "--stall-timeout", "0"])
    assert ns.log_requests and ns.queue_timeout == 2.5 and ns.stall_timeout == 0
    assert launcher.args.parse_args([]).stall_timeout == 300 and launcher.args.parse_args([]).queue_timeout is None
    with pytest.raises(SystemExit):
        launcher.args.parse_args(["--queue-timeout", "0"])


def test_log_lines_of_processes_sharing_a_file_never_interleave(tmp_path):
    """Every child of launch writes its log to the same inherited file, unbuffered: each line
    must reach it in one write, or two processes' lines merge (seen in this module: a
    detokenizer line and the HTTP process's joined on one line). Two processes log 3,000 JSON
    lines each at once; every line of the file is one whole JSON object."""
    import subprocess
    import sys

    script = ("import sys; from protocol.process import configure_logging\n"
              "log = configure_logging('info', 'json', proc=sys.argv[1])\n"
              "for i in range(3000): log.info('x' * 200, i=i)\n")
    root = Path(__file__).resolve().parent.parent
    with open(tmp_path / "shared.log", "w") as f:
        procs = [subprocess.Popen([sys.executable, "-c", script, name], stderr=f, cwd=str(root),
                                  env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(root)))
                 for name in ("a", "b")]
        assert [p.wait(60) for p in procs] == [0, 0]
    lines = (tmp_path / "shared.log").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 6000 and {r["proc"] for r in records} == {"a", "b"}


def test_every_log_line_of_a_process_names_it(tmp_path):
    """Lines written through a plain ``structlog.get_logger()`` (the socket monitor's
    ``peer connection closed``, logged several times at every start, and the HTTP process's
    ``unhandled error`` handler) carried no ``proc``: in launch's shared log they could not
    be told apart. configure_logging's keys now reach every line of the process."""
    import subprocess
    import sys

    script = ("import sys, time, structlog, zmq\n"
              "from protocol.process import configure_logging\n"
              "from protocol.sockets import bind_pull\n"
              "configure_logging('info', 'json', proc='probe')\n"
              "structlog.get_logger().warning('plain line', k=1)\n"
              "ctx = zmq.Context()\n"
              "pull = bind_pull(ctx, 'ipc://' + sys.argv[1])\n"
              "push = ctx.socket(zmq.PUSH); push.connect('ipc://' + sys.argv[1])\n"
              "push.send(b'x'); pull.recv(); push.close(linger=0)\n"
              "time.sleep(60)\n")
    root = Path(__file__).resolve().parent.parent
    log_path = tmp_path / "probe.log"
    with open(log_path, "w") as f:
        proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "s.sock")], stderr=f, cwd=str(root),
                                env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(root)))
        try:
            deadline = time.monotonic() + 30
            records: list[dict] = []
            while time.monotonic() < deadline:
                records = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
                if any(r["event"] == "peer connection closed" for r in records):
                    break
                assert proc.poll() is None, log_path.read_text()
                time.sleep(0.05)
        finally:
            proc.kill()
            proc.wait(10)
    events = {r["event"]: r for r in records}
    assert events["plain line"]["proc"] == "probe" and events["plain line"]["k"] == 1
    assert events["peer connection closed"]["proc"] == "probe"
