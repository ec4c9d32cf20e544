"""Unit and simulation tests of `scheduler_proc.scheduler.Scheduler` (DESIGN.md §6, §8),
driven without sockets: a list outbox and a fake worker that keeps its own row list and
answers `LaunchResult`s the way the real worker does."""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from protocol.enums import FinishReason, ForwardMode
from protocol.messages import (
    AbortReq,
    BatchTokenOut,
    DetokAbort,
    DetokParams,
    DetokSeed,
    Finalize,
    ForwardBatch,
    GenerateReq,
    Launch,
    LaunchResult,
    ReqError,
    SamplingParams,
    WorkerAbort,
)
from scheduler_proc.schedule_batch import ScheduleBatch
from scheduler_proc.scheduler import Scheduler

EOS = 2
STOP_ID = 7


class ListOutbox:
    """Collects everything the scheduler sends; forwards worker messages to a fake worker."""

    def __init__(self) -> None:
        self.worker: list = []
        self.detok: dict[int, list] = defaultdict(list)
        self.tokenizer: list = []
        self.log: list[tuple[str, int | None, object]] = []
        self.fake_worker: FakeWorker | None = None

    def to_worker(self, msg) -> None:
        self.worker.append(msg)
        self.log.append(("worker", None, msg))
        if self.fake_worker is not None:
            self.fake_worker.handle(msg)

    def to_detokenizer(self, index: int, msg) -> None:
        self.detok[index].append(msg)
        self.log.append(("detok", index, msg))

    def to_tokenizer(self, msg) -> None:
        self.tokenizer.append(msg)
        self.log.append(("tokenizer", None, msg))

    def take(self) -> list[tuple[str, int | None, object]]:
        """The messages sent since the last take."""
        out, self.log = self.log, []
        return out


class FakeWorker:
    """Keeps the running rows in order, as the real worker does.

    EXTEND appends the batch's rows; a DECODE must name exactly the rows, in order;
    WorkerAbort drops rows. `choose(rid, n)` picks the token for a row's n-th output token.
    """

    def __init__(self, choose=None) -> None:
        self.rows: list[str] = []
        self.pending: dict[int, LaunchResult] = {}
        self.sampled: dict[str, list[int]] = defaultdict(list)
        self.choose = choose or (lambda rid, n: 100 + n)
        self.fail_next = ""
        self.launches: list[Launch] = []

    def handle(self, msg):
        if isinstance(msg, Launch):
            self.launches.append(msg)
            rids = msg.batch.rids
            if msg.mode == ForwardMode.EXTEND:
                assert len(msg.batch.input_ids) == len(msg.batch.sampling) == len(rids)
                for rid in rids:
                    assert rid not in self.rows, f"{rid} prefilled twice"
                    self.rows.append(rid)
            else:
                assert msg.mode == ForwardMode.DECODE
                assert rids == self.rows, f"decode rows {rids} != worker rows {self.rows}"
                assert msg.batch.input_ids == [] and msg.batch.sampling == []
            if self.fail_next:
                result = LaunchResult(msg.launch_id, list(rids), [], self.fail_next)
                self.fail_next = ""
            else:
                tokens = []
                for rid in rids:
                    t = self.choose(rid, len(self.sampled[rid]))
                    self.sampled[rid].append(t)
                    tokens.append(t)
                result = LaunchResult(msg.launch_id, list(rids), tokens)
            self.pending[msg.launch_id] = result
            return None
        if isinstance(msg, Finalize):
            return self.pending.pop(msg.launch_id)
        if isinstance(msg, WorkerAbort):
            for rid in msg.rids:
                assert rid in self.rows, f"WorkerAbort of {rid}, which the worker does not hold"
                self.rows.remove(rid)
            return None
        raise AssertionError(f"unexpected message to worker: {msg!r}")


def make(max_running=8, max_prefill=1024, detokenizers=1, choose=None):
    out = ListOutbox()
    worker = FakeWorker(choose)
    out.fake_worker = worker
    sched = Scheduler(out, max_running_requests=max_running, max_prefill_tokens=max_prefill, detokenizers=detokenizers)
    return sched, out, worker


def gen(rid: str, n_prompt=3, max_new=5, eos=(EOS,), stop_ids=(), stop=()) -> GenerateReq:
    return GenerateReq(
        rid, list(range(10, 10 + n_prompt)), max_new, SamplingParams(temperature=0.0),
        DetokParams(stop=list(stop)), list(eos), list(stop_ids),
    )


def step(sched: Scheduler, worker: FakeWorker) -> ScheduleBatch | None:
    """One turn of the plain loop: next batch, launch, finalize, process the result."""
    batch = sched.next_batch()
    if batch is None:
        return None
    launch, finalize = sched.launch(batch)
    assert isinstance(launch, Launch) and isinstance(finalize, Finalize)
    assert launch.launch_id == finalize.launch_id == batch.launch_id
    worker.handle(launch)
    result = worker.handle(finalize)
    sched.process_result(batch, result)
    return batch


def token_rows(msgs, rid: str) -> list[tuple[list[int], int, FinishReason | None, int | None]]:
    rows = []
    for msg in msgs:
        if isinstance(msg, BatchTokenOut):
            for i, r in enumerate(msg.rids):
                if r == rid:
                    ms = msg.matched_stop[i] if i < len(msg.matched_stop) else None
                    rows.append((msg.new_token_ids[i], msg.completion_tokens[i], msg.finish_reasons[i], ms))
    return rows


# ---------------------------------------------------------------- basic lifecycle
def test_prefill_then_decode_until_length():
    sched, out, worker = make()
    sched.add_request(gen("a", n_prompt=4, max_new=3))
    assert [r.rid for r in sched.waiting] == ["a"]
    assert out.detok[0] == []  # not routed before it is scheduled

    b1 = step(sched, worker)
    assert b1.mode == ForwardMode.EXTEND and [r.rid for r in b1.reqs] == ["a"]
    launch = worker.launches[-1]
    assert launch.batch == ForwardBatch(["a"], [[10, 11, 12, 13]], [SamplingParams(temperature=0.0)])
    assert [r.rid for r in sched.running] == ["a"] and not sched.waiting
    assert out.detok[0][0] == DetokSeed("a", DetokParams(), 4)

    b2 = step(sched, worker)
    assert b2.mode == ForwardMode.DECODE and worker.launches[-1].batch == ForwardBatch(["a"])
    assert b2.launch_id == b1.launch_id + 1
    b3 = step(sched, worker)
    assert b3.mode == ForwardMode.DECODE
    assert step(sched, worker) is None  # finished: nothing left to run

    assert token_rows(out.detok[0], "a") == [
        ([100], 1, None, None),
        ([101], 2, None, None),
        ([102], 3, FinishReason.LENGTH, None),
    ]
    assert out.worker[-1] == WorkerAbort(["a"])  # the worker frees its state
    assert worker.rows == [] and sched.running == [] and sched.reqs == {}
    assert sched.detok_load == [0]
    assert sched.finished_count == 1
    assert out.tokenizer == []


def test_continuous_batching_new_request_joins_at_next_step():
    sched, out, worker = make()
    sched.add_request(gen("a", max_new=10))
    step(sched, worker)
    step(sched, worker)  # a decodes
    sched.add_request(gen("b", max_new=10))
    b = step(sched, worker)
    assert b.mode == ForwardMode.EXTEND and [r.rid for r in b.reqs] == ["b"]
    assert [r.rid for r in sched.running] == ["a", "b"] == worker.rows
    b = step(sched, worker)
    assert b.mode == ForwardMode.DECODE and worker.launches[-1].batch.rids == ["a", "b"]
    assert worker.sampled["a"] == [100, 101, 102] and worker.sampled["b"] == [100, 101]


def test_several_waiting_requests_prefill_together():
    sched, out, worker = make()
    for rid in "abc":
        sched.add_request(gen(rid))
    b = step(sched, worker)
    assert b.mode == ForwardMode.EXTEND and [r.rid for r in b.reqs] == ["a", "b", "c"]
    assert worker.rows == ["a", "b", "c"]


def test_prefill_token_budget_splits_extend_batches():
    sched, out, worker = make(max_prefill=10)
    sched.add_request(gen("a", n_prompt=6))
    sched.add_request(gen("b", n_prompt=4))
    sched.add_request(gen("c", n_prompt=1))
    sched.add_request(gen("d", n_prompt=30))
    b = step(sched, worker)
    assert [r.rid for r in b.reqs] == ["a", "b"]
    b = step(sched, worker)
    assert [r.rid for r in b.reqs] == ["c"]  # d does not fit beside c
    b = step(sched, worker)
    assert [r.rid for r in b.reqs] == ["d"]  # a long prompt still runs alone
    assert [r.rid for r in sched.running] == ["a", "b", "c", "d"] == worker.rows


# ---------------------------------------------------------------- finishing
def test_finish_on_eos_token():
    sched, out, worker = make(choose=lambda rid, n: EOS if n == 2 else 50 + n)
    sched.add_request(gen("a", max_new=10))
    while step(sched, worker):
        pass
    rows = token_rows(out.detok[0], "a")
    assert rows == [([50], 1, None, None), ([51], 2, None, None), ([], 3, FinishReason.STOP, EOS)]
    # EOS is counted in completion_tokens but never rendered
    assert all(EOS not in ids for ids, *_ in rows)
    assert worker.rows == [] and sched.reqs == {} and sched.detok_load == [0]


def test_finish_on_eos_at_prefill():
    sched, out, worker = make(choose=lambda rid, n: EOS)
    sched.add_request(gen("a", max_new=10))
    assert step(sched, worker).mode == ForwardMode.EXTEND
    assert token_rows(out.detok[0], "a") == [([], 1, FinishReason.STOP, EOS)]
    assert sched.running == [] and worker.rows == []
    assert step(sched, worker) is None


def test_finish_on_stop_token_ids():
    sched, out, worker = make(choose=lambda rid, n: STOP_ID if n == 1 else 60)
    sched.add_request(gen("a", max_new=10, stop_ids=[STOP_ID]))
    sched.add_request(gen("b", max_new=3, eos=()))  # STOP_ID is not a stop for b
    while step(sched, worker):
        pass
    assert token_rows(out.detok[0], "a") == [([60], 1, None, None), ([], 2, FinishReason.STOP, STOP_ID)]
    assert token_rows(out.detok[0], "b") == [
        ([60], 1, None, None), ([STOP_ID], 2, None, None), ([60], 3, FinishReason.LENGTH, None),
    ]


def test_ignore_eos_when_no_eos_ids():
    sched, out, worker = make(choose=lambda rid, n: EOS)
    sched.add_request(gen("a", max_new=2, eos=()))
    while step(sched, worker):
        pass
    assert token_rows(out.detok[0], "a") == [([EOS], 1, None, None), ([EOS], 2, FinishReason.LENGTH, None)]


def test_eos_on_last_allowed_token_is_stop():
    sched, out, worker = make(choose=lambda rid, n: EOS if n == 1 else 70)
    sched.add_request(gen("a", max_new=2))
    while step(sched, worker):
        pass
    assert token_rows(out.detok[0], "a")[-1] == ([], 2, FinishReason.STOP, EOS)


def test_max_new_tokens_one_finishes_after_prefill():
    sched, out, worker = make()
    sched.add_request(gen("a", max_new=1))
    assert step(sched, worker).mode == ForwardMode.EXTEND
    assert token_rows(out.detok[0], "a") == [([100], 1, FinishReason.LENGTH, None)]
    assert step(sched, worker) is None


def test_max_new_tokens_zero_finishes_without_launch():
    sched, out, worker = make()
    sched.add_request(gen("a", n_prompt=5, max_new=0))
    assert sched.next_batch() is None
    assert worker.launches == [] and out.worker == []
    assert out.detok[0] == [
        DetokSeed("a", DetokParams(), 5),
        BatchTokenOut(["a"], [[]], [0], [FinishReason.LENGTH]),
    ]
    assert sched.reqs == {} and sched.detok_load == [0] and sched.finished_count == 1
    # the rid is free again afterwards
    sched.add_request(gen("a", max_new=1))
    assert out.tokenizer == []
    assert step(sched, worker).mode == ForwardMode.EXTEND


def test_finishing_request_leaves_others_in_order():
    sched, out, worker = make(choose=lambda rid, n: EOS if (rid, n) == ("b", 1) else 80)
    for rid in "abc":
        sched.add_request(gen(rid, max_new=4))
    step(sched, worker)
    step(sched, worker)  # b ends on EOS here
    assert [r.rid for r in sched.running] == ["a", "c"] == worker.rows
    step(sched, worker)
    assert worker.launches[-1].batch.rids == ["a", "c"]


# ---------------------------------------------------------------- aborts
def test_abort_waiting_request():
    sched, out, worker = make(max_running=1)
    sched.add_request(gen("a", max_new=10))
    sched.add_request(gen("b", max_new=10))
    step(sched, worker)  # a prefilled; b waits (max_running=1)
    assert [r.rid for r in sched.waiting] == ["b"]
    out.take()
    sched.abort(AbortReq("b"))
    assert out.take() == []  # never reached the worker nor a replica: nothing to tell
    assert not sched.waiting and "b" not in sched.reqs
    assert sched.detok_load == [1]  # only a
    assert step(sched, worker).mode == ForwardMode.DECODE
    assert worker.rows == ["a"]


def test_abort_running_request():
    sched, out, worker = make(detokenizers=2)
    sched.add_request(gen("a", max_new=10))
    sched.add_request(gen("b", max_new=10))
    step(sched, worker)
    step(sched, worker)
    assert sched.detok_load == [1, 1]
    b_replica = sched.reqs["b"].detokenizer
    out.take()
    sched.abort(AbortReq("b"))
    sent = out.take()
    assert ("worker", None, WorkerAbort(["b"])) in sent
    assert ("detok", b_replica, DetokAbort("b")) in sent
    assert len(sent) == 2
    assert [r.rid for r in sched.running] == ["a"] == worker.rows
    assert "b" not in sched.reqs
    assert sorted(sched.detok_load) == [0, 1]
    sched.abort(AbortReq("b"))  # idempotent
    sched.abort(AbortReq("nobody"))
    assert out.take() == []
    sched.abort(AbortReq("a"))
    assert sched.detok_load == [0, 0] and sched.running == [] and worker.rows == []
    assert sched.finished_count == 2
    assert step(sched, worker) is None


def test_abort_with_reason_stop_sends_no_detok_abort():
    sched, out, worker = make()
    sched.add_request(gen("a", max_new=10))
    step(sched, worker)
    out.take()
    sched.abort(AbortReq("a", FinishReason.STOP))
    assert out.take() == [("worker", None, WorkerAbort(["a"]))]
    assert sched.detok_load == [0] and sched.reqs == {} and worker.rows == []


def test_abort_after_finish_is_ignored():
    sched, out, worker = make()
    sched.add_request(gen("a", max_new=1))
    step(sched, worker)
    out.take()
    sched.abort(AbortReq("a", FinishReason.STOP))  # the detokenizer's late stop request
    assert out.take() == []
    assert sched.finished_count == 1


def test_abort_while_extend_in_flight():
    sched, out, worker = make()
    sched.add_request(gen("a", max_new=10))
    step(sched, worker)
    sched.add_request(gen("b", max_new=10))
    batch = sched.next_batch()
    assert batch.mode == ForwardMode.EXTEND
    launch, finalize = sched.launch(batch)
    worker.handle(launch)
    result = worker.handle(finalize)
    out.take()
    sched.abort(AbortReq("b"))
    assert [m for _, _, m in out.take()] == [WorkerAbort(["b"]), DetokAbort("b")]
    sched.process_result(batch, result)
    assert out.take() == []  # its token is never shown
    assert [r.rid for r in sched.running] == ["a"] == worker.rows
    assert sched.detok_load == [1]
    assert step(sched, worker).mode == ForwardMode.DECODE


def test_abort_while_decode_in_flight():
    sched, out, worker = make()
    sched.add_request(gen("a", max_new=10))
    sched.add_request(gen("b", max_new=10))
    step(sched, worker)
    batch = sched.next_batch()
    launch, finalize = sched.launch(batch)
    worker.handle(launch)
    result = worker.handle(finalize)
    sched.abort(AbortReq("a"))
    out.take()
    sched.process_result(batch, result)
    rows = [(m.rids, m.new_token_ids) for _, _, m in out.take()]
    assert rows == [(["b"], [[101]])]
    assert [r.rid for r in sched.running] == ["b"] == worker.rows


# ---------------------------------------------------------------- errors
def test_duplicate_rid_is_refused():
    sched, out, worker = make()
    sched.add_request(gen("a", max_new=5))
    sched.add_request(gen("a", max_new=7))
    assert len(out.tokenizer) == 1
    err = out.tokenizer[0]
    assert isinstance(err, ReqError) and err.rid == "a" and err.status == 400
    assert "already in use" in err.message
    assert len(sched.waiting) == 1 and sched.reqs["a"].max_new_tokens == 5
    step(sched, worker)
    sched.add_request(gen("a"))  # still running: still refused
    assert [e.status for e in out.tokenizer] == [400, 400]
    assert [r.rid for r in sched.running] == ["a"]


def test_launch_error_fails_live_requests():
    sched, out, worker = make(detokenizers=2)
    sched.add_request(gen("a", max_new=10))
    sched.add_request(gen("b", max_new=10))
    step(sched, worker)
    out.take()
    worker.fail_next = "Metal out of memory"
    step(sched, worker)
    sent = out.take()
    errors = [m for kind, _, m in sent if kind == "tokenizer"]
    assert sorted(e.rid for e in errors) == ["a", "b"]
    assert all(e.status == 500 and "Metal out of memory" in e.message for e in errors)
    assert ("worker", None, WorkerAbort(["a", "b"])) in sent
    assert {(i, m.rid) for kind, i, m in sent if kind == "detok"} == {(0, "a"), (1, "b")}
    assert sched.running == [] and worker.rows == [] and sched.reqs == {}
    assert sched.detok_load == [0, 0]
    assert step(sched, worker) is None
    # the server stays up: a new request runs
    sched.add_request(gen("c", max_new=1))
    assert step(sched, worker).mode == ForwardMode.EXTEND
    assert token_rows(out.detok[0], "c")[-1][2] == FinishReason.LENGTH


def test_extend_error_leaves_decoding_requests_alone():
    sched, out, worker = make()
    sched.add_request(gen("a", max_new=10))
    step(sched, worker)
    sched.add_request(gen("b", max_new=10))
    worker.fail_next = "bad prompt"
    out.take()
    b = step(sched, worker)
    assert b.mode == ForwardMode.EXTEND
    assert [e.rid for e in out.tokenizer] == ["b"]
    assert [r.rid for r in sched.running] == ["a"] == worker.rows
    assert sched.detok_load == [1]
    assert step(sched, worker).mode == ForwardMode.DECODE


def test_launch_refuses_unsupported_mode():
    sched, out, worker = make()
    sched.add_request(gen("a"))
    batch = sched.next_batch()
    for mode in (ForwardMode.MIXED, ForwardMode.IDLE):
        with pytest.raises(ValueError, match=f"forward mode {mode.name}.*DECODE, EXTEND"):
            sched.launch(ScheduleBatch(mode, batch.reqs))
    assert sched.next_launch_id == 1  # nothing was assigned


def test_fail_all_fails_held_requests():
    sched, out, worker = make(max_running=1)
    sched.add_request(gen("a"))
    sched.add_request(gen("b"))
    step(sched, worker)
    out.take()
    sched.fail_all("server is shutting down")
    sent = out.take()
    assert sorted(m.rid for kind, _, m in sent if kind == "tokenizer") == ["a", "b"]
    assert all(m.status == 503 for kind, _, m in sent if kind == "tokenizer")
    assert [m for kind, _, m in sent if kind == "detok"] == [DetokAbort("a")]  # b was never routed
    assert sched.reqs == {} and sched.detok_load == [0] and not sched.waiting and not sched.running


def test_fail_all_covers_requests_with_extend_in_flight():
    sched, out, worker = make()
    sched.add_request(gen("a"))
    batch = sched.next_batch()
    sched.launch(batch)
    out.take()
    sched.fail_all("server is shutting down")
    assert [m.rid for kind, _, m in out.take() if kind == "tokenizer"] == ["a"]
    assert sched.reqs == {} and sched.detok_load == [0]


# ---------------------------------------------------------------- capacity and routing
def test_max_running_requests_respected():
    sched, out, worker = make(max_running=3)
    for i in range(7):
        sched.add_request(gen(f"r{i}", max_new=3))
    sizes = []
    while (b := step(sched, worker)) is not None:
        assert len(sched.running) <= 3
        if b.mode == ForwardMode.EXTEND:
            sizes.append(len(b.reqs))
        assert len(worker.rows) <= 3
    assert sizes[0] == 3
    assert sum(sizes) == 7
    assert sched.finished_count == 7 and sched.reqs == {}


def test_detokenizer_routing_least_loaded_and_sticky():
    sched, out, worker = make(detokenizers=3, choose=lambda rid, n: EOS if (rid, n) == ("r1", 1) else 90)
    for i in range(3):
        sched.add_request(gen(f"r{i}", max_new=6))
    step(sched, worker)
    replica = {rid: req.detokenizer for rid, req in sched.reqs.items()}
    assert sorted(replica.values()) == [0, 1, 2]  # spread over the replicas
    assert sched.detok_load == [1, 1, 1]
    step(sched, worker)  # r1 ends on EOS
    assert sched.detok_load[replica["r1"]] == 0
    sched.add_request(gen("r3", max_new=6))
    sched.add_request(gen("r4", max_new=6))
    step(sched, worker)
    replica.update({rid: req.detokenizer for rid, req in sched.reqs.items() if rid in ("r3", "r4")})
    assert replica["r3"] == replica["r1"]  # the least loaded one
    assert sched.detok_load[replica["r3"]] == 1
    assert sorted(sched.detok_load) == [1, 1, 2]
    while step(sched, worker):
        pass
    # every message about a request went to its own replica, seed first
    for index, msgs in out.detok.items():
        for msg in msgs:
            rids = msg.rids if isinstance(msg, BatchTokenOut) else [msg.rid]
            assert all(replica[r] == index for r in rids)
    for rid, index in replica.items():
        first = next(m for m in out.detok[index] if rid in (m.rids if isinstance(m, BatchTokenOut) else [m.rid]))
        assert first == DetokSeed(rid, DetokParams(), 3)
        assert sum(isinstance(m, DetokSeed) and m.rid == rid for ms in out.detok.values() for m in ms) == 1
    assert sched.detok_load == [0, 0, 0]


# ---------------------------------------------------------------- randomized simulation
class Model:
    """The test's own account of every request, checked against the scheduler's."""

    def __init__(self, replicas: int) -> None:
        self.load = [0] * replicas  # live routed requests per detokenizer replica
        self.submitted: dict[str, GenerateReq] = {}
        self.ends: dict[str, list[str]] = defaultdict(list)
        self.replica: dict[str, int] = {}
        self.shown: dict[str, list[int]] = defaultdict(list)
        self.live: set[str] = set()

    def submit(self, req: GenerateReq) -> None:
        assert req.rid not in self.submitted
        self.submitted[req.rid] = req
        self.live.add(req.rid)

    def end(self, rid: str, how: str) -> None:
        assert not self.ends[rid], f"{rid} ends as {how} after {self.ends[rid]}"
        self.ends[rid].append(how)
        self.live.discard(rid)
        if rid in self.replica:
            self.load[self.replica[rid]] -= 1


def check_sent(model: Model, worker: FakeWorker, sent) -> None:
    """Apply the messages the scheduler sent this step to the model, checking each."""
    for kind, index, msg in sent:
        if kind == "detok":
            if isinstance(msg, DetokSeed):
                assert msg.rid not in model.replica, f"{msg.rid} seeded twice"
                assert not model.ends[msg.rid]
                assert model.load[index] == min(model.load), f"{msg.rid} routed to busier replica {index}: {model.load}"
                model.replica[msg.rid] = index
                model.load[index] += 1
                continue
            rids = msg.rids if isinstance(msg, BatchTokenOut) else [msg.rid]
            for r in rids:
                assert model.replica.get(r) == index, f"{r} sent to replica {index}, seeded on {model.replica.get(r)}"
            if isinstance(msg, BatchTokenOut):
                assert len(set(msg.rids)) == len(msg.rids)
                for i, rid in enumerate(msg.rids):
                    assert not model.ends[rid], f"tokens for {rid} after its end {model.ends[rid]}"
                    model.shown[rid] += msg.new_token_ids[i]
                    assert msg.completion_tokens[i] == len(worker.sampled[rid])
                    reason = msg.finish_reasons[i]
                    if reason is not None:
                        model.end(rid, f"finish:{reason.name}")
                        sampled = worker.sampled[rid]
                        assert msg.completion_tokens[i] == len(sampled)
                        req = model.submitted[rid]
                        stops = set(req.eos_token_ids) | set(req.stop_token_ids)
                        if reason == FinishReason.STOP:
                            assert sampled[-1] in stops and msg.matched_stop[i] == sampled[-1]
                            assert model.shown[rid] == sampled[:-1]
                        else:
                            assert reason == FinishReason.LENGTH
                            assert len(sampled) == req.max_new_tokens
                            assert model.shown[rid] == sampled
                    else:
                        assert model.shown[rid] == worker.sampled[rid]
        elif kind == "tokenizer":
            assert isinstance(msg, ReqError)
            if msg.status == 500:
                assert not model.ends[msg.rid]
                model.end(msg.rid, "error")


def test_randomized_simulation(capsys):
    rng = random.Random(20240601)
    total_steps = 0
    kinds: dict[str, int] = defaultdict(int)
    in_flight_aborts: dict[ForwardMode, int] = defaultdict(int)
    duplicates = 0
    trials = [(1, 1, 0.1, 8), (3, 2, 0.3, 64), (8, 3, 0.02, 4096), (16, 2, 0.1, 64), (5, 3, 0.1, 8)]
    for trial, (max_running, replicas, eos_p, max_prefill) in enumerate(trials):
        out = ListOutbox()

        def choose(rid, n, _rng=rng, _p=eos_p):
            r = _rng.random()
            if r < _p:
                return EOS
            if r < _p * 1.5:
                return STOP_ID
            return _rng.randrange(20, 1000)

        worker = FakeWorker(choose)
        out.fake_worker = worker
        sched = Scheduler(out, max_running_requests=max_running, max_prefill_tokens=max_prefill,
                          detokenizers=replicas)
        model = Model(replicas)
        next_id = 0
        steps = 2500
        i = 0
        drain_budget = None
        arrival_p = min(0.9, max_running / 10)
        while True:
            draining = i >= steps
            if draining and not sched.reqs:
                break
            if draining and drain_budget is None:
                # each launch moves at least one request on by one token
                drain_budget = i + sum(r.max_new_tokens + 1 for r in sched.reqs.values()) + 1
            assert drain_budget is None or i <= drain_budget, "requests never drained"
            i += 1
            total_steps += 1
            if not draining:
                for _ in range(rng.choice([1, 1, 2, 3]) if rng.random() < arrival_p else 0):
                    rid = f"t{trial}-r{next_id}"
                    next_id += 1
                    req = GenerateReq(
                        rid, [rng.randrange(20, 1000) for _ in range(rng.randint(1, 40))], rng.choice([0, 1, 2, 5, 20, 60]),
                        eos_token_ids=[EOS] if rng.random() < 0.9 else [],
                        stop_token_ids=[STOP_ID] if rng.random() < 0.3 else [],
                    )
                    model.submit(req)
                    sched.add_request(req)
                    if rid in sched.reqs and rng.random() < 0.05:  # a duplicate rid while the first is live
                        sched.add_request(req)
                        assert out.tokenizer[-1] == ReqError(rid, 400, f"request id {rid!r} is already in use")
                        duplicates += 1
                # aborts of waiting / running / finished requests
                for _ in range(rng.choice([0, 0, 0, 0, 1, 2])):
                    candidates = list(model.submitted)
                    if not candidates:
                        break
                    rid = rng.choice(candidates[-60:])
                    do_abort(sched, out, worker, model, rid, rng)
            check_sent(model, worker, out.take())

            batch = sched.next_batch()
            if batch is not None:
                assert batch.mode in (ForwardMode.EXTEND, ForwardMode.DECODE)
                if batch.mode == ForwardMode.EXTEND:
                    assert 0 < len(batch.reqs) <= max_running - len(sched.running)
                launch, finalize = sched.launch(batch)
                worker.handle(launch)
                # aborts while the launch is in flight (including just-prefilled requests),
                # before or after the worker finalized it
                in_flight_abort = not draining and rng.random() < 0.15
                abort_before_finalize = rng.random() < 0.5
                if in_flight_abort and abort_before_finalize:
                    in_flight_aborts[batch.mode] += in_flight_abort_of(sched, out, worker, model, batch, rng)
                result = worker.handle(finalize)
                if in_flight_abort and not abort_before_finalize:
                    in_flight_aborts[batch.mode] += in_flight_abort_of(sched, out, worker, model, batch, rng)
                if not draining and rng.random() < 0.005:
                    worker.fail_next = "simulated failure"  # the next launch fails
                sched.process_result(batch, result)
            check_sent(model, worker, out.take())

            # invariants after every step
            assert [r.rid for r in sched.running] == worker.rows
            assert len(sched.running) <= max_running
            live = model.live
            assert set(sched.reqs) == live
            routed = [rid for rid in live if rid in model.replica]
            assert sum(sched.detok_load) == len(routed)
            per = [0] * replicas
            for rid in routed:
                per[model.replica[rid]] += 1
            assert sched.detok_load == per == model.load
            assert all(sched.reqs[rid].detokenizer == model.replica[rid] for rid in routed)
            waiting = {r.rid for r in sched.waiting}
            assert all(rid not in model.replica for rid in waiting)

        # drained: every submitted request ended exactly once, nothing is held anywhere
        assert model.submitted and all(len(model.ends[rid]) == 1 for rid in model.submitted)
        assert sched.reqs == {} and not sched.waiting and not sched.running
        assert worker.rows == [] and sched.detok_load == [0] * replicas
        assert sched.finished_count == len(model.submitted)
        for ends in model.ends.values():
            kinds[ends[0]] += 1
    with capsys.disabled():
        print(f"\nscheduler simulation: {total_steps} steps over {len(trials)} trials, {sum(kinds.values())} requests, "
              f"ends: {dict(sorted(kinds.items()))}, duplicate rids refused: {duplicates}, "
              f"aborts in flight: EXTEND {in_flight_aborts[ForwardMode.EXTEND]}, DECODE {in_flight_aborts[ForwardMode.DECODE]}")
    assert total_steps >= 5 * 2500
    for end in ("finish:STOP", "finish:LENGTH", "abort:ABORT", "abort:STOP", "error"):
        assert kinds[end] > 0, f"the simulation never produced {end}"
    assert duplicates > 0
    assert in_flight_aborts[ForwardMode.EXTEND] > 0 and in_flight_aborts[ForwardMode.DECODE] > 0


def in_flight_abort_of(sched, out, worker, model, batch, rng) -> int:
    """Abort one request of the launch in flight; returns 1 if it was still live."""
    rid = rng.choice([r.rid for r in batch.reqs])
    live = not model.ends[rid]
    do_abort(sched, out, worker, model, rid, rng)
    check_sent(model, worker, out.take())
    return int(live)


def do_abort(sched: Scheduler, out: ListOutbox, worker: FakeWorker, model: Model, rid: str, rng: random.Random) -> None:
    """Abort `rid` and check what the scheduler sent for it."""
    check_sent(model, worker, out.take())
    reason = FinishReason.STOP if rng.random() < 0.3 else FinishReason.ABORT
    was_live = not model.ends[rid]
    was_waiting = any(r.rid == rid for r in sched.waiting)
    sched.abort(AbortReq(rid, reason))
    sent = out.take()
    if not was_live:
        assert sent == [], f"abort of ended {rid} sent {sent}"
        return
    model.end(rid, f"abort:{reason.name}")
    if was_waiting:
        assert sent == []
        return
    expected = [("worker", None, WorkerAbort([rid]))]
    if reason == FinishReason.ABORT:
        expected.append(("detok", model.replica[rid], DetokAbort(rid)))
    assert sent == expected
