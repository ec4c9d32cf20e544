"""Issue 14, the scheduler's deadlines driven by the fake worker on a clock the test sets:
``--queue-timeout`` fails waiting requests only, timings ride the first token, the stall
bound fails running requests and waits longer for queued ones, and waiting behind the
worker's own work is no stall. Through `launch.py`: tests/e2e/test_observability.py."""

from __future__ import annotations

from protocol.enums import ForwardMode
from protocol.messages import BatchTokenOut, DetokAbort, Finalize, ReqError, ReqTiming, WorkerAbort
from scheduler_proc.deadlines import Deadlines
from scheduler_proc.scheduler import Scheduler
from tests.support.clock import FakeClock
from tests.support.sim_loop import gen, step
from tests.support.sim_worker import FakeWorker, ListOutbox

# ---------------------------------------------------------------- units: deadlines, timings, the log line


def deadline_scheduler(queue_timeout: float | None, stall_timeout: float):
    clock = FakeClock()
    out = ListOutbox()
    worker = FakeWorker()
    out.fake_worker = worker
    sched = Scheduler(
        out,
        max_running_requests=1,
        max_prefill_tokens=1024,
        detokenizers=1,
        deadlines=Deadlines(queue_timeout, stall_timeout),
        clock=clock,
    )
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
