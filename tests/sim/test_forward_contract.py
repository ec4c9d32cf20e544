"""The forward-mode contract of DESIGN.md §4 on the scheduler side: modes it refuses to
send, and flags refused at start-up with the flag's name. (The worker side is tested in
tests/unit/test_worker.py: unknown mode at launch and at finalize.)"""

from __future__ import annotations

import pytest

import scheduler_proc.scheduler as scheduler_mod
from protocol.enums import ForwardMode
from protocol.messages import DetokParams, GenerateReq, Launch, SamplingParams
from scheduler_proc.schedule_batch import ScheduleBatch
from scheduler_proc.scheduler import Scheduler


class NullOutbox:
    def to_worker(self, msg) -> None:
        pass

    def to_detokenizer(self, index, msg) -> None:
        pass

    def to_tokenizer(self, msg) -> None:
        pass


def make(**kw) -> Scheduler:
    return Scheduler(NullOutbox(), max_running_requests=4, max_prefill_tokens=64, detokenizers=1, **kw)


@pytest.mark.parametrize("mode", [ForwardMode.IDLE, 7])
def test_scheduler_refuses_to_send_an_unsupported_mode(mode):
    sched = make()
    sched.add_request(GenerateReq("a", [1, 2, 3], 4, SamplingParams(temperature=0), DetokParams(), [2]))
    batch = sched.next_batch()
    bad = ScheduleBatch(mode, batch.reqs, batch.chunks)
    name = "IDLE" if mode == ForwardMode.IDLE else "7"
    with pytest.raises(
        ValueError,
        match=f"scheduler will not send forward mode {name}; worker supports: DECODE, EXTEND, MIXED, TARGET_VERIFY",
    ):
        sched.launch(bad)
    assert sched.launch(batch).mode == ForwardMode.EXTEND  # the batch itself still goes


def test_flag_needing_an_unsupported_mode_is_refused_at_startup(monkeypatch):
    monkeypatch.setattr(scheduler_mod, "WORKER_FORWARD_MODES", frozenset({ForwardMode.DECODE, ForwardMode.EXTEND}))
    with pytest.raises(
        NotImplementedError, match="--enable-mixed-chunk needs forward mode MIXED; worker supports: DECODE, EXTEND"
    ):
        make(enable_mixed_chunk=True)
    assert make(enable_mixed_chunk=False).enable_mixed_chunk is False


def test_speculation_needs_target_verify(monkeypatch):
    from scheduler_proc.spec.speculator import Speculator

    monkeypatch.setattr(scheduler_mod, "WORKER_FORWARD_MODES", frozenset({ForwardMode.DECODE, ForwardMode.EXTEND}))
    with pytest.raises(NotImplementedError, match="--speculative-algorithm needs forward mode TARGET_VERIFY"):
        make(speculator=Speculator(4))


def test_a_batch_in_an_unsupported_mode_fails_its_requests_and_the_server_keeps_serving(monkeypatch):
    """DESIGN.md §4: the scheduler's refusal reaches the affected requests as a clear HTTP
    error and the server stays up. `SchedulerProcess.run` sent `sched.launch(batch)`
    unguarded, so the refusal's ValueError ended the scheduler process (and the server)."""
    from protocol.messages import BatchTokenOut, ReqError
    from tests.support.sim_loop import Loop
    from tests.support.sim_worker import FakeWorker, ListOutbox

    out = ListOutbox()
    out.fake_worker = worker = FakeWorker()
    sched = Scheduler(out, max_running_requests=4, max_prefill_tokens=64, detokenizers=1)
    loop = Loop(sched, out, worker)
    monkeypatch.setattr(scheduler_mod, "WORKER_FORWARD_MODES", frozenset({ForwardMode.DECODE, ForwardMode.MIXED}))
    sched.add_request(GenerateReq("a", [10, 11, 12], 3, SamplingParams(temperature=0), DetokParams(), [2]))
    assert loop.run() == []
    assert not [m for m in out.worker if isinstance(m, Launch)]  # nothing was launched
    errors = [m for m in out.tokenizer if isinstance(m, ReqError)]
    assert [(e.rid, e.status, e.message) for e in errors] == [
        ("a", 500, "scheduler will not send forward mode EXTEND; worker supports: DECODE, MIXED")
    ]
    assert "a" not in sched.reqs and not sched.waiting and not sched.running
    sched.mem.check()  # its KV slots went back
    free = sched.mem.available

    monkeypatch.setattr(
        scheduler_mod, "WORKER_FORWARD_MODES", scheduler_mod.WORKER_FORWARD_MODES | {ForwardMode.EXTEND}
    )
    sched.add_request(GenerateReq("b", [10, 11, 12], 3, SamplingParams(temperature=0), DetokParams(), [2]))
    modes = [b.mode for b in loop.run()]
    assert modes[:3] == [ForwardMode.EXTEND, ForwardMode.DECODE, ForwardMode.DECODE] and set(modes[3:]) <= {
        ForwardMode.DECODE
    }
    tokens = [
        t
        for m in out.detok[0]
        if isinstance(m, BatchTokenOut)
        for r, ids in zip(m.rids, m.new_token_ids)
        if r == "b"
        for t in ids
    ]
    assert len(tokens) == 3 and sched.mem.available == free
