"""Speculative decoding in the scheduler (issue 42): prompt-lookup drafts verified by the fake
worker (whose acceptance mirrors the real one), against the same requests without it."""

from __future__ import annotations

import msgspec
import pytest

from protocol.enums import FinishReason
from protocol.messages import SamplingParams
from scheduler_proc.scheduler import Scheduler
from scheduler_proc.spec.ngram import TokenHistory
from scheduler_proc.spec.policy import COOL_AFTER, DraftLength, SpeedPolicy
from scheduler_proc.spec.speculator import Speculator
from tests.support.sim_loop import Loop, gen
from tests.support.sim_worker import FakeWorker, ListOutbox

PERIOD = 7


class AlwaysOn(SpeedPolicy):
    """Drafts of up to k in every launch (the real policy follows wall-clock rates)."""

    def cap(self, batch_size: int) -> int:
        return self.k


def cyclic(rid: str, n: int) -> int:
    """Output that repeats a 7-token cycle: prompt lookup drafts it right once seen."""
    return 20 + n % PERIOD


def serve(reqs, spec: bool, choose=cyclic, overlap=True, total=4096, k=4):
    """Run `reqs` to the end; choose: the fake worker's token rule, or a function of the
    worker that returns one. Returns (shown tokens, finish reasons, worker, scheduler)."""
    out = ListOutbox()
    worker = FakeWorker()
    worker.choose = choose if choose is cyclic or choose.__code__.co_argcount == 2 else choose(worker)
    out.fake_worker = worker
    sched = Scheduler(
        out,
        max_running_requests=8,
        max_prefill_tokens=4096,
        detokenizers=1,
        speculator=Speculator(k, AlwaysOn(k)) if spec else None,
    )
    if total != 4096:
        from scheduler_proc.mem.kv_memory import KVMemory

        sched.mem = KVMemory(total, 9, 4096, radix=False)
    for r in reqs:
        sched.add_request(r)
    loop = Loop(sched, out, worker, overlap=overlap)
    loop.run(limit=5000)
    sched.mem.check()
    assert sched.mem.held == 0 and not sched.reqs
    tokens: dict[str, list[int]] = {}
    reasons = {}
    for msg in out.detok[0]:
        for rid, ids, reason in zip(
            getattr(msg, "rids", []), getattr(msg, "new_token_ids", []), getattr(msg, "finish_reasons", [])
        ):
            tokens.setdefault(rid, []).extend(ids)
            if reason is not None:
                reasons[rid] = reason
    assert set(tokens) == set(reasons) == {r.rid for r in reqs}
    return tokens, reasons, worker, sched


def test_output_equals_speculation_off_and_drafts_are_accepted():
    reqs = [gen(f"r{i}", n_prompt=5 + i, max_new=40 + 3 * i) for i in range(4)]
    off, off_reasons, _, _ = serve(reqs, spec=False)
    on, on_reasons, worker, sched = serve(reqs, spec=True)
    assert on == off and on_reasons == off_reasons
    accepted = sum(len(more) for _, _, _, more in worker.verified)
    assert accepted > 60  # the cycle repeats: most drafts are right
    c = sched.spec.counters
    assert c.accepted_tokens == accepted and c.draft_tokens >= accepted and sum(c.accept_lengths) == c.drafts


@pytest.mark.parametrize("overlap", [True, False])
def test_stop_token_and_max_tokens_inside_an_accepted_run_cut_it(overlap):
    """Request "s" has stop token 24 in its prompt's cycle; its output takes that cycle from
    its third round on, so a draft taken from the prompt holds the stop token and is
    accepted: the request ends at it. "m" ends by max_tokens. Both end exactly where they
    end without speculation."""
    s = msgspec.structs.replace(gen("s", max_new=60, stop_ids=(24,)), input_ids=[30, 31, 32, 33, 24, 35, 36])
    reqs = [s, gen("m", n_prompt=6, max_new=23)]

    def choose(rid, n):
        if rid == "m":
            return 20 + n % PERIOD
        return 24 if n >= 2 * PERIOD and n % PERIOD == 4 else 30 + n % PERIOD

    off, off_reasons, _, _ = serve(reqs, spec=False, choose=choose, overlap=overlap)
    on, on_reasons, worker, _ = serve(reqs, spec=True, choose=choose, overlap=overlap)
    assert on == off and on_reasons == off_reasons
    assert on_reasons["s"] == FinishReason.STOP and on_reasons["m"] == FinishReason.LENGTH
    assert len(on["m"]) == 23 and len(on["s"]) == 2 * PERIOD + 4  # the stop token is not shown
    stop_runs = [more for _, rid, _, more in worker.verified if rid == "s" and 24 in more]
    assert stop_runs  # the stop token came inside an accepted run (a draft token the model agreed with)


def test_a_request_that_opts_out_never_drafts():
    out = gen("o", n_prompt=5, max_new=30)
    opted = msgspec.structs.replace(out, sampling=SamplingParams(temperature=0.0, speculative=False))
    _, _, worker, _ = serve([opted, gen("x", n_prompt=5, max_new=30)], spec=True)
    assert all(not draft for _, rid, draft, _ in worker.verified if rid == "o")
    assert any(draft for _, rid, draft, _ in worker.verified if rid == "x")


def test_penalized_requests_are_not_drafted():
    base = gen("p", n_prompt=5, max_new=30)
    reqs = [
        msgspec.structs.replace(base, sampling=SamplingParams(temperature=0.0, frequency_penalty=0.3)),
        msgspec.structs.replace(base, rid="q", sampling=SamplingParams(temperature=0.0, repetition_penalty=1.2)),
    ]
    _, _, worker, sched = serve(reqs, spec=True)
    assert not any(draft for _, _, draft, _ in worker.verified) and sched.spec.counters.drafts == 0


def test_a_tight_pool_drops_drafts_or_retracts_and_frees_every_slot():
    """150 slots for 4 requests of 20 + 50 tokens: retractions (a retracted request is
    prefilled again with its output, and the fake worker's token follows its position in
    the sequence) and drafts the pool cannot hold; same output, every slot back."""
    reqs = [gen(f"r{i}", n_prompt=20, max_new=50) for i in range(4)]

    def by_position(worker):
        return lambda rid, n: cyclic(rid, len(worker.partial.get(rid, worker.prompts.get(rid, []))) - 20 + n)

    runs = {}
    for spec in (False, True):
        out, reasons, worker, sched = serve(reqs, spec=spec, total=150, choose=by_position)
        runs[spec] = out
        assert sched.mem.stats.retractions > 0
    assert runs[True] == runs[False]


def test_verify_launches_are_not_chained():
    _, _, worker, _ = serve([gen("a", n_prompt=5, max_new=40)], spec=True)
    verify = {lid for lid, *_ in worker.verified}
    chains = [m for m in worker.launches if type(m).__name__ == "ChainDecode"]
    assert verify and all(m.prev_launch_id not in verify for m in chains)


def test_prompt_lookup_takes_the_latest_longest_match():
    h = TokenHistory([1, 2, 3, 9, 1, 2, 3, 4, 5, 7, 2, 3])
    assert h.propose(3) == [4, 5, 7]  # "2 3" last followed by 4 (the latest match of the longest n-gram)
    assert h.propose(0) == []
    h.extend([8])
    assert h.propose(2) == []


def test_draft_length_adapts_and_cools_down():
    d = DraftLength(4)
    d.update(4, 1)
    assert d.next() == 2
    d.update(2, 2)
    assert d.next() == 3
    for _ in range(COOL_AFTER):
        d.update(d.next(), 0)
    assert d.next() == 0


def _policy_run(rate_of_cap, launches=200, batch=16, k=4):
    p = SpeedPolicy(k)
    caps = []
    for _ in range(launches):
        cap = p.cap(batch)
        caps.append(cap)
        p.record(batch, cap, rate_of_cap(cap), 1.0)
    return caps, p


def test_speed_policy_turns_speculation_off_where_it_measured_slower():
    caps, p = _policy_run(lambda cap: 1600 if cap == 0 else 900 + 10 * cap)
    assert caps[:8] == [0] * 8 and caps[8:16] == [1] * 8  # off first, then the next cap up
    late = caps[30:]
    assert late.count(0) >= 0.75 * len(late) and set(p.rates()[16]) == {0, 1}  # never climbed past 1


def test_speed_policy_picks_the_fastest_draft_cap():
    caps, _ = _policy_run(lambda cap: {0: 20, 1: 36, 2: 40, 3: 33, 4: 30}[cap], batch=1)
    late = caps[60:]
    assert late.count(2) >= 0.8 * len(late)


def test_speed_policy_sees_through_launches_of_varying_yield():
    """Each launch yields 1..cap+1 tokens at random (a draft accepted in part or whole): the
    policy still settles on the caps with the best mean rates (caps 2 and 3, about 1.75 and
    1.65 tokens a unit of time; caps 1 and 4 about 1.55, off 1.0)."""
    import random

    rng = random.Random(3)
    mean = {0: (1.0, 1.0), 1: (1.7, 1.05), 2: (2.2, 1.2), 3: (2.4, 1.45), 4: (2.6, 1.7)}
    p = SpeedPolicy(4)
    caps = []
    for _ in range(400):
        cap = p.cap(1)
        caps.append(cap)
        tokens, cost = mean[cap]
        got = max(1, min(cap + 1, round(rng.gauss(tokens, 1.0)))) if cap else 1
        p.record(1, cap, got, cost * rng.uniform(0.9, 1.1))
    late = caps[100:]
    assert late.count(2) + late.count(3) >= 0.75 * len(late), {c: late.count(c) for c in range(5)}
