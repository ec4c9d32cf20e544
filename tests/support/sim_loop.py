"""Driving the real `Scheduler` against `tests.support.sim_worker.FakeWorker` without
sockets: `gen` (a greedy request), `step` (one turn of the plain loop) and `Loop` (the
overlap loop of `SchedulerProcess.run`), shared by the sim tests (tests/sim/) and the
scheduler-side tests of tests/e2e/."""

from __future__ import annotations

from protocol.enums import ForwardMode
from protocol.messages import ChainDecode, DetokParams, Finalize, GenerateReq, Launch, LaunchResult, SamplingParams
from scheduler_proc.schedule_batch import ScheduleBatch
from scheduler_proc.scheduler import Scheduler
from tests.support.sim_worker import FakeWorker, ListOutbox

EOS = 2
GREEDY = SamplingParams(temperature=0.0)


def gen(rid: str, n_prompt=3, max_new=5, eos=(EOS,), stop_ids=(), stop=()) -> GenerateReq:
    return GenerateReq(
        rid,
        list(range(10, 10 + n_prompt)),
        max_new,
        GREEDY,
        DetokParams(stop=list(stop)),
        list(eos),
        list(stop_ids),
    )


def step(sched: Scheduler, worker: FakeWorker) -> ScheduleBatch | None:
    """One turn of the plain loop (overlap off): next batch, launch, finalize, process."""
    out: ListOutbox = sched.out
    batch = sched.next_batch()
    if batch is None:
        return None
    launch = sched.launch(batch)
    assert isinstance(launch, Launch)
    assert launch.launch_id == batch.launch_id and launch.mode == batch.mode
    assert launch.batch == batch.to_forward_batch()
    out.to_worker(launch)
    out.to_worker(Finalize(batch.launch_id))
    result = out.results.popleft()
    assert result.launch_id == batch.launch_id and not out.results
    sched.process_result(batch, result)
    return batch


class Loop:
    """`SchedulerProcess.run` without sockets. The caller feeds inputs (new requests,
    aborts) between iterations, which is where the real loop drains its inbox; `hook(point,
    batch)` runs at "launched", "chained" and "finalized", where only a front that delivers
    inputs at any moment could slip them in (tests of the scheduler's API contract);
    `on_result(batch, result)` runs just before `process_result`."""

    def __init__(
        self, sched: Scheduler, out: ListOutbox, worker: FakeWorker, overlap: bool = True, hook=None, on_result=None
    ) -> None:
        self.sched, self.out, self.worker, self.overlap = sched, out, worker, overlap
        self.hook = hook or (lambda point, batch: None)
        self.on_result = on_result or (lambda batch, result: None)
        self.inflight: ScheduleBatch | None = None
        self.launched = self.chained = 0
        self.history: list[ScheduleBatch] = []
        self.results: list[LaunchResult] = []

    def iterate(self) -> ScheduleBatch | None:
        """One iteration after the drain; returns the batch it processed, None when idle."""
        if self.inflight is None:
            started = self.sched.next_launch()
            if started is None:
                return None
            batch, launch = started
            self.out.to_worker(launch)
            self.inflight = batch
            self.launched += 1
            self.hook("launched", batch)
        following = None
        if self.overlap and self.sched.can_chain(self.inflight):
            # DESIGN.md §3: only a pure decode chains, and not while a prompt could be prefilled
            assert self.inflight.mode == ForwardMode.DECODE and not self.sched.wants_extend()
            following, msg = self.sched.chain(self.inflight)
            assert following.mode == ForwardMode.DECODE
            assert msg == ChainDecode(following.launch_id, self.inflight.launch_id)
            assert following.reqs == self.sched.running and following.reqs is not self.sched.running
            self.out.to_worker(msg)
            self.chained += 1
            self.hook("chained", following)
        batch = self.inflight
        self.out.to_worker(Finalize(batch.launch_id))
        result = self.out.results.popleft()
        assert result.launch_id == batch.launch_id and not self.out.results
        self.hook("finalized", batch)
        self.on_result(batch, result)
        self.sched.process_result(batch, result)
        self.history.append(batch)
        self.results.append(result)
        self.inflight = following
        return batch

    def run(self, limit: int = 1000) -> list[ScheduleBatch]:
        """Iterate until idle; returns the batches processed."""
        done = []
        for _ in range(limit):
            batch = self.iterate()
            if batch is None:
                return done
            done.append(batch)
        raise AssertionError("the loop never went idle")
