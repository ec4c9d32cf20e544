"""Issue 14, observability units: the request log line and its metrics, errors and client
aborts, the health probe of the scheduler shared by callers at once, the log flags, and the
log lines of processes (whole JSON lines in a shared file, each naming its process).
Through `launch.py`: tests/e2e/test_observability.py."""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest
import structlog
from structlog.testing import capture_logs

import launcher.args
from protocol.enums import FinishReason
from protocol.messages import ReqTiming
from tests.support.clock import FakeClock
from tests.support.launcher import ROOT
from tests.support.sim_loop import gen
from tokenizer_proc.errors import APIError
from tokenizer_proc.link.metrics import RequestMetrics
from tokenizer_proc.link.request_log import MAX_LOGGED_CHARS, RequestLog


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
    assert (line["queue_s"], line["prefill_s"], line["ttft_s"], line["decode_s"], line["e2e_s"]) == (
        0.1,
        0.3,
        0.5,
        0.3,
        0.8,
    )
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
        f"... (cut; {MAX_LOGGED_CHARS + 16} characters in all)"
    )
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

    script = (
        "import sys; from protocol.process import configure_logging\n"
        "log = configure_logging('info', 'json', proc=sys.argv[1])\n"
        "for i in range(3000): log.info('x' * 200, i=i)\n"
    )
    root = ROOT
    with open(tmp_path / "shared.log", "w") as f:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", script, name],
                stderr=f,
                cwd=str(root),
                env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(root)),
            )
            for name in ("a", "b")
        ]
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

    script = (
        "import sys, time, structlog, zmq\n"
        "from protocol.process import configure_logging\n"
        "from protocol.sockets import bind_pull\n"
        "configure_logging('info', 'json', proc='probe')\n"
        "structlog.get_logger().warning('plain line', k=1)\n"
        "ctx = zmq.Context()\n"
        "pull = bind_pull(ctx, 'ipc://' + sys.argv[1])\n"
        "push = ctx.socket(zmq.PUSH); push.connect('ipc://' + sys.argv[1])\n"
        "push.send(b'x'); pull.recv(); push.close(linger=0)\n"
        "time.sleep(60)\n"
    )
    root = ROOT
    log_path = tmp_path / "probe.log"
    with open(log_path, "w") as f:
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(tmp_path / "s.sock")],
            stderr=f,
            cwd=str(root),
            env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(root)),
        )
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
