"""Unit and simulation tests of `scheduler_proc.scheduler.Scheduler` (DESIGN.md §3, §4, §6,
§8), driven without sockets: a list outbox and a fake worker (`tests/support/sim_worker.py`) that
mirrors the real worker's routing of EXTEND / MIXED rows, chained decodes and aborts, and
a `Loop` that calls the scheduler exactly as `SchedulerProcess.run` does (the overlap loop,
or the plain one with overlap off)."""

from __future__ import annotations

import random
from collections import Counter, defaultdict

import msgspec
import pytest

from protocol.enums import FinishReason, ForwardMode, GrammarKind, ReqField
from protocol.messages import (
    AbortReq,
    BatchTokenOut,
    ChainDecode,
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
    TokenLogprobs,
    WorkerAbort,
)
from scheduler_proc.schedule_batch import ScheduleBatch
from scheduler_proc.scheduler import Scheduler
from tests.support.sim_loop import EOS, GREEDY, Loop, gen, step
from tests.support.sim_worker import FakeWorker, ListOutbox

STOP_ID = 7
C = 4  # the chunked_prefill_size of the chunking unit tests


def make(max_running=8, max_prefill=1024, detokenizers=1, choose=None, chunk=0, mixed=False, pool=None):
    """(scheduler, its outbox, a fake worker); pool: (KV slots, page size) of a small
    radix-less KV memory (default: the scheduler's own)."""
    from scheduler_proc.mem.kv_memory import KVMemory

    out = ListOutbox()
    worker = FakeWorker(choose)
    out.fake_worker = worker
    memory = {} if pool is None else {"memory": KVMemory(*pool, 128, radix=False)}
    sched = Scheduler(
        out,
        max_running_requests=max_running,
        max_prefill_tokens=max_prefill,
        detokenizers=detokenizers,
        chunked_prefill_size=chunk,
        enable_mixed_chunk=mixed,
        **memory,
    )
    return sched, out, worker


def token_rows(msgs, rid: str) -> list[tuple[list[int], int, FinishReason | None, int | None]]:
    rows = []
    for msg in msgs:
        if isinstance(msg, BatchTokenOut):
            for i, r in enumerate(msg.rids):
                if r == rid:
                    ms = msg.matched_stop[i] if i < len(msg.matched_stop) else None
                    rows.append((msg.new_token_ids[i], msg.completion_tokens[i], msg.finish_reasons[i], ms))
    return rows


def worker_aborts_of(out: ListOutbox, rid: str) -> int:
    return sum(rid in m.rids for m in out.worker if isinstance(m, WorkerAbort))


def rids(reqs) -> list[str]:
    return [r.rid for r in reqs]


# ---------------------------------------------------------------- basic lifecycle
def test_prefill_then_decode_until_length():
    sched, out, worker = make()
    sched.add_request(gen("a", n_prompt=4, max_new=3))
    assert [r.rid for r in sched.waiting] == ["a"]
    assert out.detok[0] == []  # not routed before it is scheduled

    b1 = step(sched, worker)
    assert b1.mode == ForwardMode.EXTEND and [r.rid for r in b1.reqs] == ["a"]
    launch = worker.launches[-1]
    assert launch.batch == ForwardBatch(["a"], [[10, 11, 12, 13]], [SamplingParams(temperature=0.0)], [True])
    assert b1.chunks == [(0, 4)] and sched.reqs["a"].prefilled == 4
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
    b = step(sched, worker)  # that extend ran while a and b decoded: they get their turn
    assert b.mode == ForwardMode.DECODE and [r.rid for r in b.reqs] == ["a", "b", "c"]
    b = step(sched, worker)
    assert [r.rid for r in b.reqs] == ["d"]  # a long prompt still runs alone
    assert [r.rid for r in sched.running] == ["a", "b", "c", "d"] == worker.rows


def test_prompts_that_keep_coming_never_starve_the_decoding_requests():
    """Prefill first, but an extend launched while requests decode is followed by their
    decode: with a prompt arriving before every launch, the stream still gets a token after
    each extend (prefill first starved it for as long as prompts came)."""
    sched, out, worker = make(max_prefill=10)
    sched.add_request(gen("s", n_prompt=4, max_new=50))
    step(sched, worker)
    modes = []
    for i in range(6):
        sched.add_request(gen(f"p{i}", n_prompt=8, max_new=50))
        modes.append(step(sched, worker).mode)
    assert modes == [ForwardMode.EXTEND, ForwardMode.DECODE] * 3
    assert len(worker.sampled["s"]) == 1 + 3


# ---------------------------------------------------------------- finishing
def test_finish_on_eos_token():
    sched, out, worker = make(choose=lambda rid, n: EOS if n == 2 else 50 + n)
    sched.add_request(gen("a", max_new=10))
    while step(sched, worker):
        pass
    rows = token_rows(out.detok[0], "a")
    assert rows == [([50], 1, None, None), ([51], 2, None, None), ([], 3, FinishReason.STOP, None)]
    # EOS is counted in completion_tokens but never rendered
    assert all(EOS not in ids for ids, *_ in rows)
    assert worker.rows == [] and sched.reqs == {} and sched.detok_load == [0]


def test_finish_on_eos_at_prefill():
    sched, out, worker = make(choose=lambda rid, n: EOS)
    sched.add_request(gen("a", max_new=10))
    assert step(sched, worker).mode == ForwardMode.EXTEND
    assert token_rows(out.detok[0], "a") == [([], 1, FinishReason.STOP, None)]
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
        ([60], 1, None, None),
        ([STOP_ID], 2, None, None),
        ([60], 3, FinishReason.LENGTH, None),
    ]


@pytest.mark.parametrize("end", [EOS, STOP_ID])
def test_include_stop_str_in_output_renders_the_stop_token_that_ended_it(end):
    """As vLLM: with include_stop_str_in_output the EOS or stop token that ends a request
    is rendered too (it was always dropped, so stop_token_ids [" of"] lost " of")."""
    sched, out, worker = make(choose=lambda rid, n: end if n == 2 else 60)
    req = gen("a", max_new=10, stop_ids=[STOP_ID])
    sched.add_request(msgspec.structs.replace(req, detok=DetokParams(include_stop_str_in_output=True)))
    while step(sched, worker):
        pass
    assert token_rows(out.detok[0], "a") == [
        ([60], 1, None, None),
        ([60], 2, None, None),
        ([end], 3, FinishReason.STOP, STOP_ID if end == STOP_ID else None),
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
    assert token_rows(out.detok[0], "a")[-1] == ([], 2, FinishReason.STOP, None)


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
        BatchTokenOut(["a"], [[]], [0], [FinishReason.LENGTH], [None]),
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


def test_abort_of_a_retracted_request_tells_its_replica():
    """A retracted request waits in the queue again, but its replica holds its text so far:
    a client leaving then must make the replica forget it (it would keep the state forever:
    no final token ever comes)."""
    sched, out, worker = make(max_running=3, max_prefill=64, pool=(12, 4))
    sched.add_request(gen("a", 3, 100, eos=()))
    sched.add_request(gen("b", 3, 100, eos=()))
    while not sched.mem.stats.retractions:
        step(sched, worker)
    assert sched.reqs["b"] in sched.waiting and sched.reqs["b"].output_ids  # routed, retracted
    out.take()
    sched.abort(AbortReq("b"))
    assert ("detok", 0, DetokAbort("b")) in out.take()
    assert "b" not in sched.reqs and "b" not in sched.detok.records and sched.detok_load == [1]
    sched.detok.check()


def test_a_chunked_prompt_filling_the_pool_is_retracted_before_a_decode_is_cut_short():
    """a decodes (3 + 30 tokens fit the 40-slot pool); b's chunked prompt takes the free slots
    chunk by chunk until a has none left to decode into. The newest request (b, mid-prefill)
    must give its slots back and wait: a gets all 30 tokens (it was cut with finish LENGTH
    after 22, as if it alone filled the pool), and b answers after it."""
    sched, out, worker = make(max_running=4, max_prefill=64, chunk=C, pool=(40, 5))
    sched.add_request(gen("a", 3, 30, eos=()))
    while len(sched.reqs["a"].output_ids) < 20:
        step(sched, worker)
    sched.add_request(
        msgspec.structs.replace(gen("b", 30, 3, eos=()), sampling=SamplingParams(temperature=0.0, logprob_start_len=0))
    )

    process = sched.process_result

    def with_prompt_logprobs(batch, result):  # each of b's chunks scores its positions, marked by their index
        process(
            batch,
            msgspec.structs.replace(
                result,
                prompt_logprobs=[
                    TokenLogprobs(list(range(*c)), [-1.0] * (c[1] - c[0])) if r.rid == "b" and c else None
                    for r, c in zip(batch.reqs, batch.chunks or [None] * len(batch.reqs))
                ],
            ),
        )

    sched.process_result = with_prompt_logprobs
    Loop(sched, out, worker, overlap=False).run()
    a = token_rows(out.detok[0], "a")
    assert sum(len(ids) for ids, *_ in a) == 30 and a[-1][1:3] == (30, FinishReason.LENGTH)
    b = token_rows(out.detok[0], "b")
    assert sum(len(ids) for ids, *_ in b) == 3 and b[-1][1:3] == (3, FinishReason.LENGTH)
    sent = [
        m.prompt_logprobs[m.rids.index("b")]
        for m in out.detok[0]
        if isinstance(m, BatchTokenOut)
        and "b" in m.rids
        and m.prompt_logprobs
        and m.prompt_logprobs[m.rids.index("b")] is not None
    ]
    assert [p.token_ids for p in sent] == [list(range(30))]  # the retracted chunks' logprobs are not sent twice
    assert sched.mem.stats.retractions >= 1 and sched.reqs == {} and worker.holds() == set()


def test_admission_counters_count_admissions_not_attempts():
    """b is retracted and waits while a fills the pool: every step the scheduler tries b
    again and gives its table row back. /metrics' admitted prompt tokens count each real
    admission once (a's prompt, b's, b's again with its output after the retraction); they
    counted every attempt, which also inflated the prefix-cache hit rate."""
    sched, out, worker = make(max_running=3, max_prefill=64, pool=(20, 4))
    sched.add_request(gen("a", 3, 12, eos=()))
    sched.add_request(gen("b", 3, 12, eos=()))
    b = sched.reqs["b"]
    Loop(sched, out, worker, overlap=False).run()
    assert sched.mem.stats.retractions == 1 and len(b.fill_ids) > 3 and len(b.output_ids) == 12
    assert sched.stats().prompt_tokens_total == 3 + 3 + len(b.fill_ids)


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
    launch = sched.launch(batch)
    finalize = Finalize(batch.launch_id)
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
    launch = sched.launch(batch)
    finalize = Finalize(batch.launch_id)
    worker.handle(launch)
    result = worker.handle(finalize)
    sched.abort(AbortReq("a"))
    out.take()
    sched.process_result(batch, result)
    rows = [(m.rids, m.new_token_ids) for _, _, m in out.take()]
    assert rows == [(["b"], [[101]])]
    assert [r.rid for r in sched.running] == ["b"] == worker.rows


# ---------------------------------------------------------------- errors
def test_every_refusal_of_a_request_names_its_field():
    """Each 4xx the scheduler answers for a request says which field it is about (`ReqField`),
    for the HTTP process to name as the route's body has it (each had no field but the rid's
    and the logit processor's)."""
    from protocol.messages import GrammarSpec, ReasoningBudget

    sched, out, _ = make(pool=(64, 1))
    json_object = GrammarSpec(GrammarKind.JSON_OBJECT)
    budget = ReasoningBudget(4, [5], [6])
    cases = [
        (
            gen("long", n_prompt=64),
            ReqField.PROMPT,
            "the prompt has 64 tokens; the KV cache can ever hold 64, the "
            "prompt and at least one generated token: send at most 63 prompt tokens (the server's --max-total-tokens and "
            "--mem-fraction-static size the cache)",
        ),
        (
            msgspec.structs.replace(gen("g"), grammar=json_object),
            ReqField.GRAMMAR,
            "structured output is not available",
        ),
        (msgspec.structs.replace(gen("b"), reasoning_budget=budget), ReqField.REASONING_BUDGET, "tag ids must lie in"),
        (
            msgspec.structs.replace(gen("p"), sampling=msgspec.structs.replace(GREEDY, logit_processor="x")),
            ReqField.LOGIT_PROCESSOR,
            "unknown custom logit processor 'x'",
        ),
    ]
    for req, field, says in cases:
        sched.add_request(req)
        err = out.tokenizer[-1]
        assert isinstance(err, ReqError) and (err.rid, err.status, err.field) == (req.rid, 400, field), err
        assert says in err.message and req.rid not in sched.reqs
    sched.add_request(gen("a"))
    sched.add_request(gen("a"))
    assert out.tokenizer[-1] == ReqError("a", 400, "request id 'a' is already in use", ReqField.RID)
    assert len(out.tokenizer) == len(cases) + 1
    # with structured output served: a budget under a grammar is the budget's fault
    out = ListOutbox()
    sched = Scheduler(out, max_running_requests=8, max_prefill_tokens=1024, detokenizers=1, grammar=object())
    sched.add_request(msgspec.structs.replace(gen("gb"), grammar=json_object, reasoning_budget=budget))
    (err,) = out.tokenizer
    assert err.field == ReqField.REASONING_BUDGET and "cannot be combined with structured output" in err.message


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
    with pytest.raises(
        ValueError,
        match="scheduler will not send forward mode IDLE; worker supports: DECODE, EXTEND, MIXED, TARGET_VERIFY",
    ):
        sched.launch(ScheduleBatch(ForwardMode.IDLE, batch.reqs, batch.chunks))
    assert sched.next_launch_id == 1  # nothing was assigned
    assert out.worker == []
    # the same batch in a supported mode goes out with the first id
    assert sched.launch(batch).launch_id == 1 and sched.next_launch_id == 2


def test_mixed_flag_refused_when_worker_cannot_run_mixed(monkeypatch):
    import scheduler_proc.scheduler as scheduler_module

    monkeypatch.setattr(scheduler_module, "WORKER_FORWARD_MODES", frozenset({ForwardMode.DECODE, ForwardMode.EXTEND}))
    with pytest.raises(
        NotImplementedError, match="--enable-mixed-chunk needs forward mode MIXED; worker supports: DECODE, EXTEND"
    ):
        make(mixed=True)
    sched, _, _ = make(mixed=False)  # without the flag the scheduler starts
    assert sched.enable_mixed_chunk is False


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


# ---------------------------------------------------------------- the fake worker's contract
def test_fake_worker_mirrors_real_worker_routing_and_rejections():
    """The fake answers as ModelRunner does: routing by state, -1 for non-final chunks,
    errors kept for Finalize, chains only on the latest pending launch."""
    w = FakeWorker()
    w.handle(Launch(1, ForwardMode.EXTEND, ForwardBatch(["a", "b"], [[1, 2], [3]], [GREEDY, GREEDY], [True, False])))
    assert w.handle(Finalize(1)) == LaunchResult(1, ["a", "b"], [100, -1])
    assert w.rows == ["a"] and w.partial == {"b": [3]}
    # MIXED: decode row a, continuation of b (final, one token): b joins after a
    w.handle(Launch(2, ForwardMode.MIXED, ForwardBatch(["a", "b"], [[], [4]], [None, None], [True, True])))
    assert w.handle(Finalize(2)) == LaunchResult(2, ["a", "b"], [101, 100])
    assert w.rows == ["a", "b"] and w.partial == {} and w.prompts["b"] == [3, 4]
    assert [(lid, r, k) for lid, r, k in w.routes if lid == 2] == [(2, "a", "decode"), (2, "b", "continuation")]
    # chained decode on the latest pending launch, then a rejected one
    w.handle(Launch(3, ForwardMode.DECODE, ForwardBatch(["a", "b"])))
    w.handle(ChainDecode(4, 3))
    w.handle(WorkerAbort(["a"]))  # processed before chain 5: chain 5 decodes b only
    w.handle(ChainDecode(5, 4))
    assert w.handle(Finalize(3)) == LaunchResult(3, ["a", "b"], [102, 101])
    assert w.handle(Finalize(4)) == LaunchResult(4, ["a", "b"], [103, 102])
    assert w.handle(Finalize(5)) == LaunchResult(5, ["b"], [103])
    w.handle(ChainDecode(6, 4))  # 4 is not the latest launch (and is finalized)
    assert (
        w.handle(Finalize(6)).error
        == "RuntimeError: ValueError: ChainDecode 6 must follow the latest pending launch, got prev=4"
    )
    assert w.handle(Finalize(5)).error == "unknown launch id 5"
    # EXTEND with a decoding rid, MIXED without every running row, unseen rid without sampling
    w.handle(Launch(7, ForwardMode.EXTEND, ForwardBatch(["b"], [[]], [None], [True])))
    assert "only MIXED batches hold decode rows" in w.handle(Finalize(7)).error
    w.handle(Launch(8, ForwardMode.EXTEND, ForwardBatch(["c"], [[5]], [None], [True])))
    assert "is unseen but came without sampling parameters" in w.handle(Finalize(8)).error
    w.handle(Launch(9, ForwardMode.DECODE, ForwardBatch(["a"])))
    assert "do not match the worker's running batch" in w.handle(Finalize(9)).error
    w.handle(Launch(10, ForwardMode.EXTEND, ForwardBatch(["c"], [[5, 6]], [GREEDY], [False])))
    w.handle(Finalize(10))
    w.handle(WorkerAbort(["c", "b", "nobody"]))  # drops a partial prefill and a row
    for lid, mode in ((11, ForwardMode.IDLE), (12, 9)):  # unsupported modes fail loudly at launch and finalize
        w.handle(Launch(lid, mode, ForwardBatch(["z"], [[1]], [GREEDY], [True])))
    assert w.errors[-2:] == [
        (11, "ValueError: worker cannot launch forward mode IDLE; supported: DECODE, EXTEND, MIXED, TARGET_VERIFY"),
        (12, "ValueError: worker cannot launch forward mode 9; supported: DECODE, EXTEND, MIXED, TARGET_VERIFY"),
    ]
    assert (
        w.handle(Finalize(12)).error
        == "ValueError: cannot finalize launch in mode 9; supported: DECODE, EXTEND, MIXED, TARGET_VERIFY"
    )
    assert w.rows == [] and w.partial == {} and w.unknown_aborts == ["nobody"]
    assert w.violations == []


def test_rejected_chain_fails_its_requests_and_the_server_stays_up():
    """A ChainDecode the worker rejects (prev already finalized) comes back as an error;
    the scheduler fails those requests with a 500 and keeps serving."""
    sched, out, worker = make()
    sched.add_request(gen("a", max_new=10))
    step(sched, worker)
    b1 = sched.next_batch()
    out.to_worker(sched.launch(b1))
    out.to_worker(Finalize(b1.launch_id))  # finalized before the chain: a wrong order
    r1 = out.results.popleft()
    b2, chain = sched.chain(b1)
    out.to_worker(chain)
    out.to_worker(Finalize(b2.launch_id))
    r2 = out.results.popleft()
    assert "must follow the latest pending launch" in r2.error
    sched.process_result(b1, r1)
    out.take()
    sched.process_result(b2, r2)
    sent = out.take()
    assert [(k, m.rid, m.status) for k, _, m in sent if k == "tokenizer"] == [("tokenizer", "a", 500)]
    assert "must follow the latest pending launch" in out.tokenizer[-1].message
    assert ("worker", None, WorkerAbort(["a"])) in sent and ("detok", 0, DetokAbort("a")) in sent
    assert sched.reqs == {} and sched.running == [] and worker.rows == [] and sched.detok_load == [0]
    sched.add_request(gen("b", max_new=2))
    loop = Loop(sched, out, worker)
    # b ends by length at the first decode; the decode chained on it is processed and skipped
    assert [b.mode for b in loop.run()] == [ForwardMode.EXTEND, ForwardMode.DECODE, ForwardMode.DECODE]
    assert loop.chained == 1
    assert token_rows(out.detok[0], "b")[-1] == ([101], 2, FinishReason.LENGTH, None)


# ---------------------------------------------------------------- chunked prefill
def expected_chunks(n: int) -> list[tuple[int, int]]:
    return [(s, min(s + C, n)) for s in range(0, n, C)]


def first_token_index(out: ListOutbox, rid: str) -> int:
    return next(i for i, (_, _, m) in enumerate(out.sent) if isinstance(m, BatchTokenOut) and rid in m.rids)


def final_finalize_index(out: ListOutbox, loop: Loop, rid: str) -> int:
    """Where the Finalize of the launch holding `rid`'s final chunk was sent."""
    lid = next(
        b.launch_id
        for b in loop.history
        for i, r in enumerate(b.reqs)
        if r.rid == rid and b.chunks and b.chunks[i] is not None and b.is_final(i)
    )
    return next(i for i, (_, _, m) in enumerate(out.sent) if m == Finalize(lid))


@pytest.mark.parametrize("overlap", [False, True], ids=["plain", "overlap"])
@pytest.mark.parametrize("n", [C - 1, C, C + 1, 2 * C - 1, 2 * C, 2 * C + 1])
def test_chunk_boundaries_one_prompt(n, overlap):
    sched, out, worker = make(chunk=C)
    sched.add_request(gen("x", n_prompt=n, max_new=3))
    req = sched.reqs["x"]
    prompt = list(range(10, 10 + n))
    loop = Loop(sched, out, worker, overlap)
    chunks = expected_chunks(n)
    for s, e in chunks:
        b = loop.iterate()
        assert b.mode == ForwardMode.EXTEND and b.chunks == [(s, e)] and req.prefilled == e
        assert worker.launches[-1] == Launch(
            b.launch_id, ForwardMode.EXTEND, ForwardBatch(["x"], [prompt[s:e]], [GREEDY if s == 0 else None], [e == n])
        )
        assert loop.results[-1].next_token_ids == ([100] if e == n else [-1])
        if e < n:  # still being chunked: no token, no row, one partial prefill
            assert sched.chunked_req is req and sched.running == [] and worker.rows == []
            assert worker.partial == {"x": prompt[:e]}
            assert token_rows(out.detok[0], "x") == []
        else:
            assert sched.chunked_req is None and sched.running == [req] and worker.rows == ["x"]
            assert worker.partial == {}
    loop.run()
    assert [kind for _, _, kind in worker.routes if kind != "decode"] == ["prefill"] + ["continuation"] * (
        len(chunks) - 1
    )
    assert worker.prompts["x"] == prompt  # every prompt token once, in order
    assert token_rows(out.detok[0], "x") == [
        ([100], 1, None, None),
        ([101], 2, None, None),
        ([102], 3, FinishReason.LENGTH, None),
    ]
    assert first_token_index(out, "x") > final_finalize_index(out, loop, "x")
    assert worker.max_partials <= 1 and worker.violations == [] and worker.errors == []
    assert sched.reqs == {} and worker.holds() == set() and sched.detok_load == [0]


@pytest.mark.parametrize("mixed", [False, True], ids=["extend", "mixed"])
def test_chunk_boundaries_many_prompts_one_chunked_at_a_time(mixed):
    """Prompts of C-1 .. 2C+1 tokens arriving together: each launch takes at most C prompt
    tokens, at most one request is partly prefilled at any time, each prompt is covered
    once and in order, and each first token comes after its final chunk."""
    lengths = [C - 1, C, C + 1, 2 * C - 1, 2 * C, 2 * C + 1]
    sched, out, worker = make(chunk=C, mixed=mixed)
    for n in lengths:
        sched.add_request(gen(f"r{n}", n_prompt=n, max_new=3))
    loop = Loop(sched, out, worker)
    while loop.iterate() is not None:
        assert len(worker.partial) <= 1
        chunked = sched.chunked_req
        assert set(worker.partial) == ({chunked.rid} if chunked else set())
        if chunked:
            assert worker.partial[chunked.rid] == chunked.input_ids[: chunked.prefilled]
    schedule = [
        [(r.rid, c) for r, c in zip(b.reqs, b.chunks) if c is not None]
        for b in loop.history
        if b.mode != ForwardMode.DECODE
    ]
    assert schedule == [
        [("r3", (0, 3)), ("r4", (0, 1))],
        [("r4", (1, 4)), ("r5", (0, 1))],
        [("r5", (1, 5))],
        [("r7", (0, 4))],
        [("r7", (4, 7)), ("r8", (0, 1))],
        [("r8", (1, 5))],
        [("r8", (5, 8)), ("r9", (0, 1))],
        [("r9", (1, 5))],
        [("r9", (5, 9))],
    ]
    for b in loop.history:
        if b.mode != ForwardMode.DECODE:
            assert sum(e - s for c in b.chunks if c is not None for s, e in [c]) <= C
            assert sum(c is not None and not b.is_final(i) for i, c in enumerate(b.chunks)) <= 1
            assert (b.mode == ForwardMode.MIXED) == (mixed and any(c is None for c in b.chunks))
    for n in lengths:
        rid = f"r{n}"
        assert worker.prompts[rid] == list(range(10, 10 + n))
        assert first_token_index(out, rid) > final_finalize_index(out, loop, rid)
        assert [t for t, *_ in token_rows(out.detok[0], rid)] == [[100], [101], [102]]
    assert worker.max_partials == 1 and worker.violations == [] and worker.errors == []
    assert sched.reqs == {} and worker.holds() == set() and sched.finished_count == 6


@pytest.mark.parametrize("mixed", [False, True], ids=["extend", "mixed"])
def test_final_chunk_of_one_token_is_a_continuation(mixed):
    sched, out, worker = make(chunk=C, mixed=mixed)
    sched.add_request(gen("a", n_prompt=2, max_new=20))
    step(sched, worker)  # a decodes beside the chunked prompt when mixed
    sched.add_request(gen("x", n_prompt=C + 1, max_new=20))
    b1 = step(sched, worker)
    if not mixed:  # the extend of x's first chunk owes a its turn
        assert step(sched, worker).mode == ForwardMode.DECODE
    b2 = step(sched, worker)
    row = [r.rid for r in b2.reqs].index("x")
    assert b2.chunks[row] == (C, C + 1) and b2.is_final(row)
    fb = worker.launches[-1].batch
    assert (fb.input_ids[row], fb.sampling[row], fb.final[row]) == ([10 + C], None, True)
    assert (b2.launch_id, "x", "continuation") in worker.routes
    assert (b2.launch_id, "x", "decode") not in worker.routes
    if mixed:
        assert b1.mode == b2.mode == ForwardMode.MIXED and rids(b2.reqs) == ["a", "x"]
        assert fb.input_ids[0] == [] and fb.sampling[0] is None and fb.final[0]
    else:
        assert b1.mode == b2.mode == ForwardMode.EXTEND and rids(b2.reqs) == ["x"]
    assert token_rows(out.detok[0], "x") == [([100], 1, None, None)]
    assert rids(sched.running) == ["a", "x"] == worker.rows and worker.partial == {}
    assert step(sched, worker).mode == ForwardMode.DECODE and worker.launches[-1].batch.rids == ["a", "x"]


# ---------------------------------------------------------------- MIXED
def test_mixed_batch_holds_every_running_request_first_in_order():
    sched, out, worker = make(mixed=True, choose=lambda rid, n: EOS if (rid, n) == ("b", 2) else 100 + n)
    for rid in "abc":
        sched.add_request(gen(rid, max_new=20))
    assert step(sched, worker).mode == ForwardMode.EXTEND  # nothing running yet: a plain EXTEND
    step(sched, worker)  # DECODE
    sched.add_request(gen("d", n_prompt=2, max_new=20))
    sched.add_request(gen("e", n_prompt=5, max_new=20))
    b = step(sched, worker)
    assert b.mode == ForwardMode.MIXED
    assert rids(b.reqs) == ["a", "b", "c", "d", "e"] and b.chunks == [None, None, None, (0, 2), (0, 5)]
    assert worker.launches[-1].batch == ForwardBatch(
        ["a", "b", "c", "d", "e"],
        [[], [], [], [10, 11], [10, 11, 12, 13, 14]],
        [None, None, None, GREEDY, GREEDY],
        [True] * 5,
    )
    assert [(r, k) for lid, r, k in worker.routes if lid == b.launch_id] == [
        ("a", "decode"),
        ("b", "decode"),
        ("c", "decode"),
        ("d", "prefill"),
        ("e", "prefill"),
    ]
    # b ended on EOS in this MIXED step; the others decoded, d and e joined at the end
    assert token_rows(out.detok[0], "b")[-1] == ([], 3, FinishReason.STOP, None)
    assert [token_rows(out.detok[0], r)[-1][0] for r in "acde"] == [[102], [102], [100], [100]]
    assert rids(sched.running) == ["a", "c", "d", "e"] == worker.rows
    sched.add_request(gen("f", n_prompt=2 * C, max_new=20))
    b = step(sched, worker)
    assert b.mode == ForwardMode.MIXED and rids(b.reqs) == ["a", "c", "d", "e", "f"]
    assert worker.violations == [] and worker.errors == []


def test_mixed_chunked_prefill_decodes_running_requests_every_step():
    sched, out, worker = make(chunk=C, mixed=True)
    sched.add_request(gen("a", n_prompt=2, max_new=50))
    sched.add_request(gen("b", n_prompt=2, max_new=50))
    assert step(sched, worker).chunks == [(0, 2), (0, 2)]
    sched.add_request(gen("x", n_prompt=3 * C, max_new=50))
    for k in range(3):
        b = step(sched, worker)
        assert b.mode == ForwardMode.MIXED and rids(b.reqs) == ["a", "b", "x"]
        assert b.chunks == [None, None, (k * C, (k + 1) * C)]
        assert not out.results  # every reply consumed
        assert [(r, k2) for lid, r, k2 in worker.routes if lid == b.launch_id] == [
            ("a", "decode"),
            ("b", "decode"),
            ("x", "prefill" if k == 0 else "continuation"),
        ]
        assert worker.rows == ["a", "b"] + (["x"] if k == 2 else [])
    assert [t for t, *_ in token_rows(out.detok[0], "a")] == [[100], [101], [102], [103]]
    assert token_rows(out.detok[0], "x") == [([100], 1, None, None)]  # no -1 ever shown
    assert rids(sched.running) == ["a", "b", "x"] == worker.rows


# ---------------------------------------------------------------- overlap: when a chain is allowed
def launch_decode(sched, out) -> ScheduleBatch:
    b = sched.next_batch()
    assert b.mode == ForwardMode.DECODE
    out.to_worker(sched.launch(b))
    return b


def test_can_chain_a_pure_decode_of_the_running_requests():
    sched, out, worker = make()
    sched.add_request(gen("a", max_new=10))
    sched.add_request(gen("b", max_new=10))
    step(sched, worker)
    b = launch_decode(sched, out)
    assert sched.can_chain(b) and not sched.wants_extend()
    nb, msg = sched.chain(b)
    assert msg == ChainDecode(b.launch_id + 1, b.launch_id) and nb.launch_id == b.launch_id + 1
    assert nb.mode == ForwardMode.DECODE and nb.reqs == sched.running == b.reqs


def test_cannot_chain_after_a_finish():
    sched, out, worker = make(choose=lambda rid, n: EOS if (rid, n) == ("b", 1) else 100 + n)
    sched.add_request(gen("a", max_new=10))
    sched.add_request(gen("b", max_new=10))
    step(sched, worker)
    b = launch_decode(sched, out)
    nb, msg = sched.chain(b)
    out.to_worker(msg)
    out.to_worker(Finalize(b.launch_id))
    sched.process_result(b, out.results.popleft())  # b ends on EOS at this step
    assert rids(sched.running) == ["a"]
    assert not sched.can_chain(nb)


def test_cannot_chain_after_an_abort():
    sched, out, worker = make()
    sched.add_request(gen("a", max_new=10))
    sched.add_request(gen("b", max_new=10))
    step(sched, worker)
    b = launch_decode(sched, out)
    sched.abort(AbortReq("a"))
    assert not sched.can_chain(b)
    # and mid-chain: chain, then an abort before the chained launch is finalized
    out.to_worker(Finalize(b.launch_id))
    sched.process_result(b, out.results.popleft())
    b = launch_decode(sched, out)
    assert sched.can_chain(b)
    nb, msg = sched.chain(b)
    out.to_worker(msg)
    out.to_worker(Finalize(b.launch_id))
    sched.process_result(b, out.results.popleft())
    assert sched.can_chain(nb)
    sched.abort(AbortReq("b", FinishReason.STOP))
    assert not sched.can_chain(nb)


def test_cannot_chain_while_a_request_waits_with_room():
    sched, out, worker = make(max_running=2)
    sched.add_request(gen("a", max_new=10))
    step(sched, worker)
    b = launch_decode(sched, out)
    sched.add_request(gen("b", max_new=10))
    assert sched.wants_extend() and not sched.can_chain(b)
    out.to_worker(Finalize(b.launch_id))
    sched.process_result(b, out.results.popleft())
    assert step(sched, worker).mode == ForwardMode.EXTEND
    # with no room left, a waiting request cannot be prefilled, so it does not break the chain
    sched.add_request(gen("c", max_new=10))
    b = launch_decode(sched, out)
    assert not sched.wants_extend() and sched.can_chain(b)


@pytest.mark.parametrize("mixed", [False, True], ids=["extend", "mixed"])
def test_cannot_chain_an_extend_or_mixed_batch(mixed):
    sched, out, _ = make(mixed=mixed, chunk=C)
    sched.add_request(gen("a", max_new=10))
    b = sched.next_batch()
    out.to_worker(sched.launch(b))
    assert b.mode == ForwardMode.EXTEND and not sched.can_chain(b)
    out.to_worker(Finalize(b.launch_id))
    sched.process_result(b, out.results.popleft())
    sched.add_request(gen("x", n_prompt=2 * C, max_new=10))
    b = sched.next_batch()
    out.to_worker(sched.launch(b))
    assert b.mode == (ForwardMode.MIXED if mixed else ForwardMode.EXTEND) and not sched.can_chain(b)
    out.to_worker(Finalize(b.launch_id))
    sched.process_result(b, out.results.popleft())
    assert sched.chunked_req is not None and sched.wants_extend()


# ---------------------------------------------------------------- overlap: finishes and aborts mid-chain
@pytest.mark.parametrize("how", ["eos", "length"])
def test_finish_at_step_n_while_n_plus_1_in_flight(how):
    """a ends at decode N while N+1 (chained) already computes a token for it: that token
    is never shown, WorkerAbort(a) goes out once, and afterwards the worker's rows equal the
    scheduler's running list; the chain resumes with a fresh decode of the rest."""
    if how == "eos":
        sched, out, worker = make(choose=lambda rid, n: EOS if (rid, n) == ("a", 1) else 100 + n)
        sched.add_request(gen("a", max_new=10))
    else:
        sched, out, worker = make()
        sched.add_request(gen("a", max_new=2))
    sched.add_request(gen("b", max_new=10))
    loop = Loop(sched, out, worker)
    assert loop.iterate().mode == ForwardMode.EXTEND and loop.inflight is None
    n = loop.iterate()  # launch N, chain N+1, finalize and process N: a ends
    assert n.mode == ForwardMode.DECODE and loop.chained == 1
    n1 = loop.inflight
    assert n1.launch_id == n.launch_id + 1 and rids(n1.reqs) == ["a", "b"]
    assert sched.reqs.get("a") is None and rids(sched.running) == ["b"] == worker.rows
    assert len(worker.sampled["a"]) == 3  # the worker did compute a's N+1 token
    assert worker_aborts_of(out, "a") == 1
    end = ([], 2, FinishReason.STOP, None) if how == "eos" else ([101], 2, FinishReason.LENGTH, None)
    assert token_rows(out.detok[0], "a") == [([100], 1, None, None), end]
    out.take()
    assert loop.iterate() is n1  # N+1: not chained again (a finished), its a row skipped
    sent = out.take()
    assert [m for _, _, m in sent if isinstance(m, ChainDecode)] == []
    assert [(m.rids, m.new_token_ids) for _, _, m in sent if isinstance(m, BatchTokenOut)] == [(["b"], [[102]])]
    assert worker_aborts_of(out, "a") == 1
    assert loop.inflight is None and worker.pending == {}
    assert rids(sched.running) == ["b"] == worker.rows and worker.holds() == {"b"}
    nxt = loop.iterate()  # a fresh launch of the rest, chained again
    assert nxt.mode == ForwardMode.DECODE and rids(nxt.reqs) == ["b"]
    assert isinstance(out.worker[-3], Launch) and out.worker[-2] == ChainDecode(nxt.launch_id + 1, nxt.launch_id)
    assert worker.errors == [] and worker.violations == []


def test_abort_mid_chain_never_shows_a_later_token():
    sched, out, worker = make(detokenizers=2)
    sched.add_request(gen("a", max_new=20))
    sched.add_request(gen("b", max_new=20))
    loop = Loop(sched, out, worker)
    loop.iterate()
    loop.iterate()  # N processed, N+1 in flight
    assert loop.inflight is not None
    b_replica = sched.reqs["b"].detokenizer
    out.take()
    sched.abort(AbortReq("b"))  # drained while N+1 is in flight
    assert [(k, m) for k, _, m in out.take()] == [("worker", WorkerAbort(["b"])), ("detok", DetokAbort("b"))]
    assert worker.rows == ["a"] and len(worker.pending) == 1
    loop.iterate()
    assert token_rows(out.detok[b_replica], "b") == [([100], 1, None, None), ([101], 2, None, None)]
    assert worker_aborts_of(out, "b") == 1
    assert rids(sched.running) == ["a"] == worker.rows
    assert sched.detok_load[b_replica] == 0 and sum(sched.detok_load) == 1
    loop.run(limit=40)
    assert sched.reqs == {} and worker.holds() == set() and worker.errors == []


@pytest.mark.parametrize("in_flight", [False, True], ids=["between-chunks", "chunk-in-flight"])
def test_abort_of_the_chunked_request_mid_prefill(in_flight):
    sched, out, worker = make(chunk=C, detokenizers=2)
    sched.add_request(gen("x", n_prompt=3 * C, max_new=5))
    sched.add_request(gen("y", n_prompt=2, max_new=2))
    b = step(sched, worker)
    assert (
        b.chunks == [(0, C)]
        and sched.chunked_req is sched.reqs["x"]
        and worker.partial == {"x": list(range(10, 10 + C))}
    )
    x_replica = sched.reqs["x"].detokenizer
    if in_flight:  # its second chunk launched, not yet processed
        b = sched.next_batch()
        assert b.chunks == [(C, 2 * C)]
        out.to_worker(sched.launch(b))
        out.to_worker(Finalize(b.launch_id))
        result = out.results.popleft()
        assert result.next_token_ids == [-1]
    out.take()
    assert (sched.stats().num_running, sched.stats().num_waiting) == (1, 1)  # x prefilling counts as running
    sched.abort(AbortReq("x"))
    assert [(k, i, m) for k, i, m in out.take()] == [
        ("worker", None, WorkerAbort(["x"])),
        ("detok", x_replica, DetokAbort("x")),
    ]
    assert sched.chunked_req is None and "x" not in sched.reqs and worker.partial == {}
    assert (sched.stats().num_running, sched.stats().kv_held_tokens) == (0, 0)
    assert sched.detok_load == [0, 0]
    if in_flight:
        sched.process_result(b, result)
        assert out.take() == []
    b = step(sched, worker)  # y proceeds: a fresh prefill with its sampling parameters
    assert b.mode == ForwardMode.EXTEND and rids(b.reqs) == ["y"] and b.chunks == [(0, 2)]
    assert worker.launches[-1].batch == ForwardBatch(["y"], [[10, 11]], [GREEDY], [True])
    assert Loop(sched, out, worker).run()[-1].mode == ForwardMode.DECODE
    assert token_rows(out.detok[0] + out.detok[1], "y") == [
        ([100], 1, None, None),
        ([101], 2, FinishReason.LENGTH, None),
    ]
    assert worker_aborts_of(out, "x") == 1 and token_rows(out.detok[x_replica], "x") == []
    assert all("x" not in m.batch.rids for m in worker.launches[2 if in_flight else 1 :] if isinstance(m, Launch))
    assert sched.reqs == {} and worker.holds() == set() and sched.detok_load == [0, 0]


def test_rid_reused_while_the_old_request_rides_in_a_chained_decode():
    """a ends at N; its rid comes back while N+1 (holding the old a) is in flight: the old
    row is skipped by identity, the new a is a fresh prefill and gets its own tokens."""
    sched, out, worker = make(choose=lambda rid, n: EOS if (rid, n) == ("a", 1) else 100 + n)
    sched.add_request(gen("a", max_new=10))
    sched.add_request(gen("b", max_new=10))
    loop = Loop(sched, out, worker)
    loop.iterate()
    loop.iterate()  # a ends on EOS at N; N+1 in flight
    assert "a" not in sched.reqs and loop.inflight is not None
    sched.add_request(gen("a", n_prompt=2, max_new=2))  # drained while N+1 is in flight
    assert out.tokenizer == [] and rids(sched.waiting) == ["a"]
    assert loop.iterate() is not None and loop.inflight is None  # N+1: not chained, old a skipped
    b = loop.iterate()
    assert b.mode == ForwardMode.EXTEND and worker.launches[-1].batch == ForwardBatch(
        ["a"], [[10, 11]], [GREEDY], [True]
    )
    loop.run()
    rows = token_rows(out.detok[0], "a")
    assert rows == [
        ([100], 1, None, None),
        ([], 2, FinishReason.STOP, None),  # the first a
        ([100], 1, None, None),
        ([], 2, FinishReason.STOP, None),
    ]  # the second (same choose)
    assert worker_aborts_of(out, "a") == 2 and sched.finished_count == 3
    assert sched.reqs == {} and worker.holds() == set() and worker.errors == []


# ---------------------------------------------------------------- randomized simulation
class Model:
    """The test's own account of every request, checked against what the scheduler sends.

    A request is keyed by (rid, incarnation): a rid may be used again once it ended."""

    def __init__(self, replicas: int, chunk: int) -> None:
        self.chunk = chunk
        self.load = [0] * replicas  # live routed requests per detokenizer replica
        self.cur: dict[str, tuple[str, int]] = {}
        self.req: dict[tuple[str, int], GenerateReq] = {}
        self.ends: dict[tuple[str, int], list[str]] = defaultdict(list)
        self.replica: dict[tuple[str, int], int] = {}
        self.shown: dict[tuple[str, int], list[int]] = defaultdict(list)
        self.delivered: dict[tuple[str, int], list[int]] = defaultdict(list)  # tokens handed to the scheduler
        self.received: dict[tuple[str, int], list[int]] = defaultdict(list)  # prompt tokens sent to the worker
        self.launched: set[tuple[str, int]] = set()
        self.worker_aborts: Counter = Counter()
        self.detok_aborts: Counter = Counter()
        self.live: dict[str, tuple[str, int]] = {}  # rid -> key of its live request
        self.partly: set[tuple[str, int]] = set()  # live requests with part of the prompt sent
        self.order: list[str] = []  # rids in order of submission (a reused rid again)
        self.ended_rids: list[str] = []
        self.empty_worker_aborts = 0

    def submit(self, req: GenerateReq) -> tuple[str, int]:
        old = self.cur.get(req.rid)
        assert old is None or self.ends[old], f"{req.rid} submitted while live"
        key = (req.rid, 0 if old is None else old[1] + 1)
        self.cur[req.rid] = key
        self.req[key] = req
        self.live[req.rid] = key
        self.order.append(req.rid)
        return key

    def end(self, key, how: str) -> None:
        assert not self.ends[key], f"{key} ends as {how} after {self.ends[key]}"
        self.ends[key].append(how)
        del self.live[key[0]]
        self.partly.discard(key)
        self.ended_rids.append(key[0])
        if key in self.replica:
            self.load[self.replica[key]] -= 1


def check_sent(model: Model, sent) -> None:
    """Apply the messages the scheduler sent to the model, checking each."""
    for kind, index, msg in sent:
        if kind == "worker":
            if isinstance(msg, Launch):
                check_launch(model, msg)
            elif isinstance(msg, WorkerAbort):
                model.empty_worker_aborts += not msg.rids
                for rid in msg.rids:
                    key = model.cur[rid]
                    model.worker_aborts[key] += 1
                    assert model.worker_aborts[key] == 1, f"WorkerAbort of {key} sent twice"
            else:
                assert isinstance(msg, (ChainDecode, Finalize))
        elif kind == "detok":
            if isinstance(msg, DetokSeed):
                key = model.cur[msg.rid]
                assert key not in model.replica, f"{key} seeded twice"
                assert not model.ends[key] and not model.received[key]
                assert model.load[index] == min(model.load), f"{key} routed to busier replica {index}: {model.load}"
                assert msg.prompt_tokens == len(model.req[key].input_ids)
                model.replica[key] = index
                model.load[index] += 1
                continue
            rids_ = msg.rids if isinstance(msg, BatchTokenOut) else [msg.rid]
            for r in rids_:
                assert model.replica.get(model.cur[r]) == index, f"{r} sent to replica {index}"
            if isinstance(msg, DetokAbort):
                key = model.cur[msg.rid]
                model.detok_aborts[key] += 1
                assert model.detok_aborts[key] == 1
                continue
            assert isinstance(msg, BatchTokenOut) and len(set(msg.rids)) == len(msg.rids)
            for i, rid in enumerate(msg.rids):
                key = model.cur[rid]
                req = model.req[key]
                delivered = model.delivered[key]
                assert not model.ends[key], f"tokens for {key} after its end {model.ends[key]}"
                assert -1 not in msg.new_token_ids[i]
                if delivered:  # a first token only after the final chunk
                    assert model.received[key] == req.input_ids
                model.shown[key] += msg.new_token_ids[i]
                assert msg.completion_tokens[i] == len(delivered)
                reason = msg.finish_reasons[i]
                if reason is None:
                    assert model.shown[key] == delivered
                    continue
                model.end(key, f"finish:{reason.name}")
                stops = set(req.eos_token_ids) | set(req.stop_token_ids)
                if reason == FinishReason.STOP:
                    expect = delivered[-1] if delivered[-1] in req.stop_token_ids else None
                    assert delivered[-1] in stops and msg.matched_stop[i] == expect
                    assert model.shown[key] == delivered[:-1]
                else:
                    assert reason == FinishReason.LENGTH and len(delivered) == req.max_new_tokens
                    assert model.shown[key] == delivered
                    assert not stops & set(delivered)
        else:
            assert kind == "tokenizer" and isinstance(msg, ReqError)
            if msg.status == 500:
                key = model.cur[msg.rid]
                assert not model.ends[key]
                model.end(key, "error")
            else:
                assert msg.status == 400  # duplicate rids, checked where they are submitted


def check_launch(model: Model, msg: Launch) -> None:
    """Every row of a launch is live; its chunks extend the prompt in order, within budget,
    one request partly prefilled at a time."""
    fb = msg.batch
    total = 0
    for i, rid in enumerate(fb.rids):
        key = model.cur[rid]
        assert model.live.get(rid) == key, f"launch {msg.launch_id} holds ended {key}"
        model.launched.add(key)
        prompt = model.req[key].input_ids
        if msg.mode == ForwardMode.DECODE or not fb.input_ids[i]:  # a decode row
            assert msg.mode in (ForwardMode.DECODE, ForwardMode.MIXED) and model.received[key] == prompt
            continue
        got = model.received[key]
        assert fb.sampling[i] == (model.req[key].sampling if not got else None)
        got += fb.input_ids[i]
        assert got == prompt[: len(got)], f"{key}: chunks do not follow the prompt"
        assert fb.final[i] == (len(got) == len(prompt))
        if fb.final[i]:
            model.partly.discard(key)
        else:
            model.partly.add(key)
        total += len(fb.input_ids[i])
    if msg.mode != ForwardMode.DECODE and model.chunk:
        assert total <= model.chunk
    assert len(model.partly) <= 1, f"several requests chunked at once: {model.partly}"


class Sim:
    """One randomized trial: the overlap (or plain) loop over a scheduler and a fake worker,
    with random arrivals, EOS, aborts and launch failures, checked after every step."""

    def __init__(
        self,
        rng: random.Random,
        trial: int,
        *,
        overlap: bool,
        mixed: bool,
        chunk: int,
        max_running: int,
        replicas: int,
        eos_p: float,
        max_prefill: int,
        eager: bool,
    ) -> None:
        self.rng, self.trial, self.eager = rng, trial, eager
        self.max_running, self.replicas, self.mixed = max_running, replicas, mixed
        self.out = ListOutbox()

        def choose(rid, n, _rng=rng, _p=eos_p):
            r = _rng.random()
            if r < _p:
                return EOS
            if r < _p * 1.5:
                return STOP_ID
            return _rng.randrange(20, 1000)

        self.worker = FakeWorker(choose)
        self.out.fake_worker = self.worker
        self.sched = Scheduler(
            self.out,
            max_running_requests=max_running,
            max_prefill_tokens=max_prefill,
            detokenizers=replicas,
            chunked_prefill_size=chunk,
            enable_mixed_chunk=mixed,
        )
        self.model = Model(replicas, chunk)
        self.loop = Loop(self.sched, self.out, self.worker, overlap, hook=self.hook, on_result=self.on_result)
        self.next_id = 0
        self.draining = False
        self.busy = True
        # arrivals while busy: about what the trial's prefill budget can take
        self.busy_p = min(0.9, max_running / 10, chunk / 40 if chunk else 0.9)
        self.stats: Counter = Counter()

    # ------------------------------------------------------------ inputs
    def arrive(self) -> None:
        rng = self.rng
        ended = self.model.ended_rids
        if ended and rng.random() < 0.03 and self.model.ends[self.model.cur[rid := rng.choice(ended[-50:])]]:
            self.stats["rid reused"] += 1  # a rid used again after its request ended
        else:
            rid = f"t{self.trial}-r{self.next_id}"
            self.next_id += 1
        n = rng.randint(1, 24) if rng.random() < 0.8 else rng.randint(25, 70)
        req = GenerateReq(
            rid,
            [rng.randrange(20, 1000) for _ in range(n)],
            rng.choice([0, 1, 2, 3, 5, 20, 60]),
            SamplingParams(temperature=rng.choice([0.0, 0.7]), seed=rng.randrange(100)),
            eos_token_ids=[EOS] if rng.random() < 0.9 else [],
            stop_token_ids=[STOP_ID] if rng.random() < 0.3 else [],
        )
        self.model.submit(req)
        self.sched.add_request(req)
        if rid in self.sched.reqs and rng.random() < 0.05:  # a duplicate rid while the first is live
            self.sched.add_request(req)
            assert self.out.tokenizer[-1] == ReqError(rid, 400, f"request id {rid!r} is already in use", ReqField.RID)
            self.stats["duplicates refused"] += 1
        self.flush()

    def abort(self, rid: str, where: str) -> None:
        """Abort `rid` and check exactly what the scheduler sent for it."""
        self.flush()
        sched, model = self.sched, self.model
        reason = FinishReason.STOP if self.rng.random() < 0.3 else FinishReason.ABORT
        key = model.cur[rid]
        live = not model.ends[key]
        was_waiting = any(r.rid == rid for r in sched.waiting)
        was_chunked = sched.chunked_req is not None and sched.chunked_req.rid == rid
        sched.abort(AbortReq(rid, reason))
        sent = self.out.take()
        if not live:
            assert sent == [], f"abort of ended {key} sent {sent}"
            return
        self.stats[f"aborts {where}"] += 1
        self.stats["aborts of chunked requests"] += was_chunked
        if was_waiting:
            assert sent == []
        else:
            expected = [("worker", None, WorkerAbort([rid]))]
            if reason == FinishReason.ABORT:
                expected.append(("detok", model.replica[key], DetokAbort(rid)))
            assert sent == expected
        model.end(key, f"abort:{reason.name}")
        check_sent(model, sent)

    def random_abort(self, where: str, batch: ScheduleBatch | None = None) -> None:
        rng = self.rng
        if batch is not None:
            pool = [r.rid for r in batch.reqs]
        else:
            pool = self.model.order[-40:]
            if self.sched.chunked_req is not None and rng.random() < 0.5:
                pool = [self.sched.chunked_req.rid]
        if pool:
            self.abort(rng.choice(pool), where)

    def drain_inputs(self) -> None:
        """The top of the loop: what the inbox holds now."""
        rng = self.rng
        if self.draining:
            return
        if rng.random() < 0.01:  # bursts of arrivals, then quiet spells where decodes chain
            self.busy = not self.busy
        p = self.busy_p if self.busy else 0.02
        for _ in range(rng.choice([1, 1, 2, 3]) if rng.random() < p else 0):
            self.arrive()
        where = "mid-chain" if self.loop.inflight is not None else "idle"
        p = 0.15 if self.busy or self.loop.inflight is not None else 0.05
        for _ in range(rng.choice([1, 1, 2]) if rng.random() < p else 0):
            self.random_abort(where)
        if rng.random() < 0.004:
            self.worker.fail_next = "simulated device failure"  # the next launch that starts fails

    def hook(self, point: str, batch: ScheduleBatch) -> None:
        """Inputs slipped in between launch and finalize (eager trials only)."""
        if not self.eager or self.draining:
            return
        if self.rng.random() < 0.06:
            self.random_abort(f"after {point} ({batch.mode.name})", batch)
        if self.rng.random() < 0.03:
            self.arrive()

    def on_result(self, batch: ScheduleBatch, result: LaunchResult) -> None:
        self.flush()
        self.stats[f"launches {batch.mode.name}"] += 1
        if result.error:
            self.stats["failed launches"] += 1
            return
        assert result.rids == [r.rid for r in batch.reqs]
        for i, (req, token) in enumerate(zip(batch.reqs, result.next_token_ids)):
            final = batch.is_final(i)
            assert (token == -1) == (not final)
            if not final:
                self.stats["non-final chunks"] += 1
            elif req.finished:
                self.stats["tokens of ended requests skipped"] += 1
            else:
                self.model.delivered[self.model.cur[req.rid]].append(token)

    def flush(self) -> None:
        check_sent(self.model, self.out.take())

    # ------------------------------------------------------------ invariants
    def check_state(self) -> None:
        sched, worker, model, loop = self.sched, self.worker, self.model, self.loop
        assert worker.errors == [] and worker.violations == []
        inflight = loop.inflight
        assert [r.rid for r in sched.running] == worker.rows
        if inflight is None:
            assert worker.pending == {}
        else:
            assert inflight.mode == ForwardMode.DECODE and set(worker.pending) == {inflight.launch_id}
        chunked = sched.chunked_req
        assert set(worker.partial) == ({chunked.rid} if chunked else set())
        if chunked is not None:
            assert worker.partial[chunked.rid] == chunked.input_ids[: chunked.prefilled]
            assert 0 < chunked.prefilled < len(chunked.input_ids)
        assert worker.holds() <= model.live.keys()
        assert len(sched.running) + (chunked is not None) <= self.max_running
        assert sched.reqs.keys() == model.live.keys()
        routed = [k for k in model.live.values() if k in model.replica]
        per = [0] * self.replicas
        for k in routed:
            per[model.replica[k]] += 1
        assert sched.detok_load == per == model.load
        assert all(sched.reqs[k[0]].detokenizer == model.replica[k] for k in routed)
        assert all(model.cur[r.rid] not in model.replica for r in sched.waiting)

    # ------------------------------------------------------------ run
    def run(self, steps: int) -> int:
        i = 0
        budget = None
        while True:
            self.draining = i >= steps
            if self.draining and not self.sched.reqs and self.loop.inflight is None:
                break
            if self.draining and budget is None:
                budget = i + sum(len(r.input_ids) + r.max_new_tokens + 2 for r in self.sched.reqs.values()) + 2
            assert budget is None or i <= budget, "requests never drained"
            i += 1
            self.drain_inputs()
            self.flush()
            chained_before = self.loop.inflight is not None
            batch = self.loop.iterate()
            self.flush()
            if batch is not None:
                self.stats["chained launches processed"] += chained_before
                if self.loop.inflight is not None and any(r.finished for r in self.loop.inflight.reqs):
                    self.stats["ended while the next decode was in flight"] += 1
            self.check_state()
        self.check_drained()
        return i

    def check_drained(self) -> None:
        sched, worker, model = self.sched, self.worker, self.model
        assert model.req and all(len(model.ends[k]) == 1 for k in model.req), "a request was lost"
        assert sched.reqs == {} and not sched.waiting and not sched.running and sched.chunked_req is None
        assert worker.holds() == set() and worker.pending == {} and not self.out.results
        assert sched.detok_load == [0] * self.replicas
        assert sched.finished_count == len(model.req)
        for key in model.req:
            assert model.worker_aborts[key] == (key in model.launched), key
            how = model.ends[key][0]
            assert model.detok_aborts[key] == (how in ("abort:ABORT", "error") and key in model.replica), (key, how)
            self.stats[how] += 1
        self.stats["requests"] += len(model.req)
        self.stats["fresh launches"] += self.loop.launched
        self.stats["empty WorkerAborts"] += model.empty_worker_aborts
        self.stats["chained launches"] += self.loop.chained
        self.stats["max partial prefills"] = max(self.stats["max partial prefills"], worker.max_partials)


SIM_TRIALS = [  # overlap, mixed, chunk, max_running, replicas, eos_p, max_prefill, eager
    (True, False, 0, 4, 2, 0.1, 16, False),
    (True, False, 8, 8, 3, 0.05, 4096, True),
    (True, True, 0, 6, 2, 0.08, 32, True),
    (True, True, 8, 12, 2, 0.05, 4096, False),
    (False, False, 0, 3, 1, 0.1, 8, True),
    (False, False, 8, 8, 3, 0.05, 4096, False),
    (False, True, 0, 16, 2, 0.03, 64, False),
    (False, True, 8, 5, 3, 0.1, 4096, True),
    (True, True, 5, 2, 1, 0.15, 4096, True),
    (True, False, 16, 16, 2, 0.02, 4096, True),
]


STEPS = 4000


def test_randomized_simulation(capsys):
    rng = random.Random(20240601)
    total_steps = 0
    stats: Counter = Counter()
    for trial, (overlap, mixed, chunk, max_running, replicas, eos_p, max_prefill, eager) in enumerate(SIM_TRIALS):
        sim = Sim(
            rng,
            trial,
            overlap=overlap,
            mixed=mixed,
            chunk=chunk,
            max_running=max_running,
            replicas=replicas,
            eos_p=eos_p,
            max_prefill=max_prefill,
            eager=eager,
        )
        total_steps += sim.run(STEPS)
        assert (sim.loop.chained > 0) == overlap
        assert (sim.stats["launches MIXED"] > 0) == mixed
        assert (sim.stats["non-final chunks"] > 0) == (chunk > 0)
        stats.update({k: v for k, v in sim.stats.items() if k != "max partial prefills"})
        stats["max partial prefills"] = max(stats["max partial prefills"], sim.stats["max partial prefills"])
    with capsys.disabled():
        print(
            f"\nscheduler simulation: {total_steps} steps over {len(SIM_TRIALS)} trials, "
            f"{stats['fresh launches'] + stats['chained launches']} launches, {stats['chained launches']} of them chained"
        )
        print("  " + ", ".join(f"{k}: {v}" for k, v in sorted(stats.items())))
    assert total_steps >= len(SIM_TRIALS) * STEPS
    for what in (
        "finish:STOP",
        "finish:LENGTH",
        "abort:ABORT",
        "abort:STOP",
        "error",
        "duplicates refused",
        "rid reused",
        "aborts mid-chain",
        "aborts idle",
        "aborts of chunked requests",
        "ended while the next decode was in flight",
        "tokens of ended requests skipped",
        "launches MIXED",
        "non-final chunks",
    ):
        assert stats[what] > 0, f"the simulation never produced {what}"
    for mode in ("EXTEND", "MIXED", "DECODE"):
        assert any(stats[k] > 0 for k in stats if k.startswith("aborts after") and mode in k), mode
    assert stats["max partial prefills"] == 1
    assert stats["chained launches"] > 1000
