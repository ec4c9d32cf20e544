"""Surviving the death of the worker (issue 14, fault 1) on the scheduler's side: it drives
`Scheduler.worker_lost` / `worker_ready` with the fake worker; the device's requests fail and
the queue is kept. Killing the processes of a launched server: tests/e2e/test_recovery.py."""

from __future__ import annotations

import pytest

from protocol.enums import FinishReason
from protocol.messages import BatchTokenOut, DetokAbort, ReqError
from scheduler_proc.mem.kv_memory import KVMemory
from scheduler_proc.scheduler import Scheduler
from tests.support.sim_loop import gen, step
from tests.support.sim_worker import FakeWorker, ListOutbox

SHORT = 8  # tokens of the requests that wait meanwhile


# --------------------------------------------------------------------------- unit
@pytest.mark.parametrize("chunk, failed", [(0, ["a"]), (4, ["a", "b"])])
def test_worker_lost_fails_the_device_and_keeps_the_queue(chunk, failed):
    """a decodes, b outgrew the 12-slot pool and was retracted, c waits. Without chunking b
    still waits when the worker dies, with a launch of a in flight: a alone fails. With
    chunking b is being prefilled again (a chunk in flight, holding KV): both fail. Nothing
    is sent to the dead worker; what waits runs on the new worker's fresh KV memory and
    finishes with all its tokens."""
    out = ListOutbox()
    out.fake_worker = FakeWorker()
    sched = Scheduler(
        out,
        max_running_requests=3,
        max_prefill_tokens=64,
        detokenizers=1,
        chunked_prefill_size=chunk,
        memory=KVMemory(12, 4, 128, radix=False),
    )
    for msg in (gen("a", 3, 100, eos=()), gen("b", 3, 100, eos=())):
        sched.add_request(msg)
    while not sched.mem.stats.retractions:
        step(sched, out.fake_worker)
    assert sched.reqs["b"] in sched.waiting and sched.reqs["b"].output_ids
    sched.add_request(gen("c", 10, SHORT, eos=()))  # waits: the pool is full
    launched = sched.next_batch()
    out.to_worker(sched.launch(launched))  # in flight when the worker dies
    assert (sched.chunked_req is sched.reqs["b"]) == (chunk > 0)
    out.worker.clear()
    out.tokenizer.clear()

    assert sched.worker_lost("the worker was killed") == len(failed)
    assert out.worker == []
    assert sorted(out.tokenizer, key=lambda m: m.rid) == [ReqError(rid, 503, "the worker was killed") for rid in failed]
    assert sched.running == [] and sched.chunked_req is None
    assert set(sched.reqs) == {"b", "c"} - set(failed)

    out.fake_worker = FakeWorker()
    sched.worker_ready(KVMemory(256, 4, 128, radix=False))
    assert sched.mem.stats.retractions == 1  # the counters carry over
    while sched.reqs:
        assert step(sched, out.fake_worker) is not None
    sched.mem.check()
    assert sched.mem.allocator.free_count == 256
    ends = {
        rid: (n, reason)
        for msg in out.detok[0]
        if isinstance(msg, BatchTokenOut)
        for rid, n, reason in zip(msg.rids, msg.completion_tokens, msg.finish_reasons)
        if reason is not None
    }
    assert ends == {rid: (n, FinishReason.LENGTH) for rid, n in (("b", 100), ("c", SHORT)) if rid not in failed}
    assert [m.rid for m in out.detok[0] if isinstance(m, DetokAbort)] == failed
