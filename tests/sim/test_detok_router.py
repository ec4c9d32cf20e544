"""Unit tests of the detokenizer replica routing and failover (DESIGN.md §7):
`scheduler_proc.replicas.router.DetokRouter` with a list outbox and a fake clock, and the real
`Scheduler` driven by the fake worker while replicas die, drain and attach."""

from __future__ import annotations

import random

import pytest

from protocol.enums import FinishReason, ReplicaState
from protocol.messages import (
    BatchTokenOut,
    DeliveredQuery,
    DetokAbort,
    DetokParams,
    DetokSeed,
    DetokShutdown,
    DetokStatus,
    GenerateReq,
    ReplicaRefused,
    ReplicaWelcome,
    ReqError,
    SamplingParams,
)
from scheduler_proc.replicas.router import HEARTBEAT_TIMEOUT_S, DetokRouter, shown_ids
from scheduler_proc.req import Req
from scheduler_proc.scheduler import Scheduler
from tests.support.sim_loop import Loop
from tests.support.sim_worker import FakeWorker, ListOutbox

EOS = 2
PARAMS = DetokParams(stop=["xy"], prompt_tail_ids=[5, 6])


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


def make(replicas=2, wait_s=30.0):
    out, clock = ListOutbox(), Clock()
    return DetokRouter(out, replicas, wait_s=wait_s, clock=clock), out, clock


def req(rid: str, output=(), max_new=100, prompt=(10, 11, 12)) -> Req:
    r = Req.from_msg(GenerateReq(rid, list(prompt), max_new, SamplingParams(), PARAMS, [EOS]))
    r.output_ids = list(output)
    return r


def sent(out: ListOutbox, kind="detok"):
    """(index, message) pairs sent since the last call, of one kind."""
    return [(i, m) for k, i, m in out.take() if k == kind]


def tick(router: DetokRouter, clock: Clock, dt: float = 0.2) -> list[str]:
    clock.advance(dt)
    return router.tick()


# ---------------------------------------------------------------- routing
def test_least_loaded_with_ties_in_turn_and_sticky():
    router, out, _ = make(replicas=3)
    reqs = [req(f"r{i}") for i in range(6)]
    for r in reqs:
        router.start(r)
    assert [r.detokenizer for r in reqs] == [0, 1, 2, 0, 1, 2]
    assert router.loads() == [2, 2, 2]
    router.close(reqs[1])  # replica 1 is now the least loaded
    r6 = req("r6")
    router.start(r6)
    assert r6.detokenizer == 1
    router.start(r6)  # idempotent: a request keeps its replica
    assert r6.detokenizer == 1 and router.loads() == [2, 2, 2]
    seeds = [(i, m) for i, m in sent(out) if isinstance(m, DetokSeed)]
    assert seeds == [(r.detokenizer, DetokSeed(r.rid, PARAMS, 3)) for r in reqs + [r6]]
    router.check()


def test_tokens_go_to_each_requests_replica_in_one_message_per_replica():
    router, out, _ = make(replicas=2)
    a, b, c = req("a"), req("b"), req("c")
    for r in (a, b, c):
        router.start(r)
    out.take()
    for r, t in ((a, 50), (b, 51), (c, EOS)):
        r.check_finish(t)
    router.tokens([(a, [50]), (b, [51]), (c, [])])
    assert sent(out) == [
        (0, BatchTokenOut(["a", "c"], [[50], []], [1, 1], [None, FinishReason.STOP], [None, None])),
        (1, BatchTokenOut(["b"], [[51]], [1], [None], [None])),
    ]


def test_shown_ids_leave_out_the_eos_that_ended_it():
    r = req("a", output=[7, 8])
    assert shown_ids(r) == [7, 8]
    r.check_finish(EOS)
    assert shown_ids(r) == [7, 8]
    r2 = req("b", output=[7], max_new=2)
    r2.check_finish(EOS + 100)
    assert shown_ids(r2) == [7, EOS + 100] and r2.finish_reason == FinishReason.LENGTH


# ---------------------------------------------------------------- losing a replica
def test_lost_replica_requests_are_reseeded_from_the_tokenizers_counts():
    router, out, clock = make(replicas=2)
    a, b, c, d = req("a"), req("b"), req("c"), req("d")
    for r in (a, b, c, d):
        router.start(r)  # a, c on 0; b, d on 1
    a.output_ids = [60, 61, 62]
    c.output_ids = [70]
    c.check_finish(EOS)  # c ended on EOS; its final row was sent, the tokenizer has not confirmed it
    router.close(c)
    out.take()
    router.lost(0, "killed")
    msgs = out.take()
    assert ("disconnect", 0, False) in msgs
    assert ("tokenizer", None, DeliveredQuery(["a", "c"])) in msgs
    assert router.loads() == [0, 2]
    assert router.replicas.get(0).state == ReplicaState.GONE
    # tokens generated while the counts are awaited are not sent anywhere
    a.output_ids.append(63)
    router.tokens([(a, [63])])
    assert sent(out) == []
    clock.advance(0.05)
    assert router.delivered(["a", "c"], [5, 2]) == []
    assert sent(out) == [
        (1, DetokSeed("a", PARAMS, 3, 0, 5)),
        (1, BatchTokenOut(["a"], [[60, 61, 62, 63]], [4], [None], [None])),
        (1, DetokSeed("c", PARAMS, 3, 0, 2)),
        (1, BatchTokenOut(["c"], [[70]], [2], [FinishReason.STOP], [None])),
    ]
    assert a.detokenizer == 1 and router.loads() == [0, 3]  # c is finished: not a load
    assert router.replicas.get(1).reseeded == 2 and router.lost_count == 1
    a.output_ids.append(64)
    router.tokens([(a, [64])])
    assert sent(out) == [(1, BatchTokenOut(["a"], [[64]], [5], [None], [None]))]
    router.check()


def test_a_closed_stream_is_not_reseeded_and_a_running_one_is_aborted():
    router, out, _ = make(replicas=2)
    a, b = req("a"), req("b")
    router.start(a)
    router.start(b)
    router.lost(0, "killed")
    out.take()
    assert router.delivered(["a"], [-1]) == ["a"]  # still running in the scheduler: abort it
    assert sent(out) == [] and "a" not in router.records
    assert router.streams_closed(["b"]) == ["b"] and router.loads() == [0, 0]
    router.check()


def test_streams_closed_forgets_finished_requests():
    router, out, _ = make(replicas=1)
    a = req("a")
    router.start(a)
    router.close(a)
    assert router.streams_closed(["a", "unknown"]) == []
    assert router.records == {}
    router.lost(0, "killed")
    assert not any(isinstance(m, DeliveredQuery) for _, _, m in out.take())


def test_a_stream_closed_while_running_is_forgotten_by_its_replica_too():
    """The tokenizer may close a stream whose request still runs without an abort first (it
    failed the request itself): the scheduler's abort that follows finds no record, so the
    replica must be told here, or it keeps the request's state for as long as it runs."""
    router, out, _ = make(replicas=2)
    a, b = req("a"), req("b")
    router.start(a)
    router.start(b)
    router.close(b)
    out.take()
    assert router.streams_closed(["a", "b"]) == ["a"]
    assert sent(out) == [(a.detokenizer, DetokAbort("a"))]  # b finished: its replica forgot it already
    router.abort(a)  # the scheduler's abort of the running request: nothing more to say
    assert sent(out) == [] and router.records == {} and router.loads() == [0, 0]
    router.check()


def test_abort_tells_the_replica_and_forgets():
    router, out, _ = make(replicas=1)
    a = req("a")
    router.start(a)
    out.take()
    router.abort(a)
    assert sent(out) == [(0, DetokAbort("a"))]
    assert router.records == {} and router.loads() == [0]
    router.abort(a)  # idempotent
    assert sent(out) == []


def test_rid_reused_after_its_stream_closed_starts_fresh():
    router, out, _ = make(replicas=2)
    old = req("a")
    router.start(old)
    router.close(old)
    new = req("a")
    router.start(new)
    assert router.records["a"].req is new and router.loads() == [0, 1]
    router.check()


# ---------------------------------------------------------------- no replica left
def test_requests_wait_for_an_attached_replica():
    router, out, clock = make(replicas=1)
    a = req("a")
    router.start(a)
    router.lost(0, "killed")
    router.delivered(["a"], [3])
    b = req("b", output=[40])
    router.start(b)  # a new request while no replica is live
    out.take()
    assert router.status().waiting == 2
    index = router.register(None, 4242, "ipc:///run/detokenizer-pid4242.sock")
    assert index == 1
    assert out.take() == [("connect", 1, "ipc:///run/detokenizer-pid4242.sock"), ("detok", 1, ReplicaWelcome(1))]
    a.output_ids = [9]
    router.ready(1, 4242)
    assert sent(out) == [
        (1, DetokSeed("a", PARAMS, 3, 0, 3)),
        (1, BatchTokenOut(["a"], [[9]], [1], [None], [None])),
        (1, DetokSeed("b", PARAMS, 3)),
        (1, BatchTokenOut(["b"], [[40]], [1], [None], [None])),
    ]
    rep = router.replicas.get(1)
    assert (rep.routed, rep.reseeded, rep.attached, rep.load) == (1, 1, True, 2)
    router.check()


def test_requests_fail_with_503_after_waiting_too_long():
    router, out, clock = make(replicas=1, wait_s=10.0)
    a, b = req("a"), req("b")
    router.start(a)
    router.start(b)
    router.close(b)  # finished in the scheduler, not yet delivered
    router.lost(0, "killed")
    router.delivered(["a", "b"], [0, 4])
    out.take()
    assert tick(router, clock, 9.0) == []
    aborted = tick(router, clock, 1.5)
    assert aborted == ["a"]  # b is finished in the scheduler already
    errors = [m for _, m in sent(out, "tokenizer") if isinstance(m, ReqError)]
    assert [(e.rid, e.status) for e in errors] == [("a", 503), ("b", 503)]
    assert "no detokenizer replica was available for 10 s" in errors[0].message
    assert router.records == {} and router.failed == 2


# ---------------------------------------------------------------- registration and liveness
def test_launch_replicas_are_routed_to_before_they_register():
    router, out, clock = make(replicas=2)
    a = req("a")
    router.start(a)
    assert a.detokenizer == 0
    assert router.register(0, 100, "ipc:///run/detokenizer-0.sock") == 0
    assert out.take()[-1] == ("detok", 0, ReplicaWelcome(0))  # no new link: it exists from the start
    router.ready(0, 100)
    assert router.replicas.get(0).state == ReplicaState.LIVE and router.loads() == [1, 0]


def test_register_refuses_an_index_launch_did_not_start():
    router, _, _ = make(replicas=2)
    with pytest.raises(ValueError, match=r"detokenizer index 5 was not started by launch \(it started 0..1\)"):
        router.register(5, 100, "ipc:///x")


def test_restarted_replica_takes_requests_once_ready():
    router, out, clock = make(replicas=2)
    router.register(0, 100, "ep0")
    router.lost(0, "killed")
    out.take()
    assert router.register(0, 101, "ep0") == 0
    assert out.take() == [("connect", 0, "ep0"), ("detok", 0, ReplicaWelcome(0))]
    assert router.replicas.get(0).state == ReplicaState.STARTING
    router.start(req("a"))
    assert router.records["a"].replica == 1  # not to a replica that is still starting
    router.ready(0, 101)
    router.start(req("b"))
    assert router.records["b"].replica == 0


def test_new_process_under_a_live_index_replaces_the_old():
    router, out, _ = make(replicas=1)
    router.register(0, 100, "ep0")
    a = req("a")
    router.start(a)
    out.take()
    router.register(0, 101, "ep0")
    msgs = out.take()
    assert ("tokenizer", None, DeliveredQuery(["a"])) in msgs
    router.exited(0, 100, "killed")  # the late exit notice of the old process changes nothing
    assert router.replicas.get(0).state == ReplicaState.STARTING


def test_missed_heartbeats_lose_the_replica_and_a_late_one_is_told_to_exit():
    """A replica silent for the heartbeat timeout is lost; its next heartbeat is answered with
    `ReplicaRefused`, again each heartbeat timeout while heartbeats go on. Told only once, a
    replica that missed the refusal (a memory stall outlasting the link's 1 s linger) kept
    heartbeating, ignored, for good: no live replica, /health 503 and every request a 503."""
    router, out, clock = make(replicas=2)
    router.register(None, 300, "ep-attached")
    router.ready(2, 300)
    router.register(0, 100, "ep0")
    router.register(1, 101, "ep1")
    a, b, c = req("a"), req("b"), req("c")
    for r in (a, b, c):
        router.start(r)
    assert c.detokenizer == 2
    for _ in range(int(HEARTBEAT_TIMEOUT_S / 0.5) + 2):
        clock.advance(0.5)
        router.heartbeat(0, 100)
        router.heartbeat(1, 101)
        router.tick()
    assert router.replicas.get(2).state == ReplicaState.GONE
    assert ("tokenizer", None, DeliveredQuery(["c"])) in out.take()
    assert router.replicas.get(0).state == ReplicaState.LIVE
    router.heartbeat(2, 300)
    msgs = out.take()
    assert msgs[0] == ("connect", 2, "ep-attached")
    assert isinstance(msgs[1][2], ReplicaRefused) and "declared lost" in msgs[1][2].message
    assert msgs[2] == ("disconnect", 2, True)
    router.heartbeat(2, 300)
    assert out.take() == []  # told once
    clock.advance(HEARTBEAT_TIMEOUT_S - 0.1)
    router.heartbeat(2, 300)
    assert out.take() == []  # once per heartbeat timeout
    clock.advance(0.1)
    router.heartbeat(2, 300)  # still alive: the refusal was lost (it was stalled past its link's linger)
    msgs = out.take()
    assert msgs[0] == ("connect", 2, "ep-attached") and msgs[2] == ("disconnect", 2, True)
    assert isinstance(msgs[1][2], ReplicaRefused) and "declared lost" in msgs[1][2].message


def test_drain_takes_no_new_requests_and_releases_when_idle():
    router, out, clock = make(replicas=2)
    a = req("a")
    router.start(a)  # on 0
    assert router.drain(0) is None
    b = req("b")
    router.start(b)
    c = req("c")
    router.start(c)
    assert (b.detokenizer, c.detokenizer) == (1, 1)
    tick(router, clock)
    assert not any(isinstance(m, DetokShutdown) for _, m in sent(out))
    router.close(a)
    tick(router, clock)
    assert (0, DetokShutdown()) in sent(out)
    router.exited(0, 0, "left")
    assert router.lost_count == 0  # a drained replica that leaves is not lost
    assert router.drain(0) == "no live detokenizer replica 0 (live: 1)"
    assert router.drain(7).startswith("no live detokenizer replica 7")


def test_shutdown_tells_every_serving_replica():
    router, out, _ = make(replicas=3)
    router.lost(1, "killed")
    out.take()
    router.shutdown()
    assert sent(out) == [(0, DetokShutdown()), (2, DetokShutdown())]


def test_status_snapshot_and_rate():
    router, out, clock = make(replicas=2)
    router.register(0, 100, "ep0")
    router.start(req("a"))
    tick(router, clock)
    st = [m for _, m in sent(out, "tokenizer") if isinstance(m, DetokStatus)]
    assert st == [
        DetokStatus([0, 1], [100, 0], [ReplicaState.LIVE, ReplicaState.LIVE], [False, False], [1, 0], [1, 0], [0, 0])
    ]
    tick(router, clock)
    assert sent(out, "tokenizer") == []  # nothing changed


# ---------------------------------------------------------------- with the scheduler
def make_sched(replicas=3, choose=None):
    out = ListOutbox()
    worker = FakeWorker(choose)
    out.fake_worker = worker
    sched = Scheduler(out, max_running_requests=16, max_prefill_tokens=1024, detokenizers=replicas)
    sched.detok.clock = Clock()
    return sched, out, worker


def gen(rid: str, max_new: int) -> GenerateReq:
    return GenerateReq(rid, [10, 11, 12], max_new, SamplingParams(temperature=0.0), DetokParams(), [EOS])


def rendered(out: ListOutbox, replicas: set[int] | None = None) -> dict[str, list[int]]:
    """What each request's current replica was asked to render: the ids since its last
    seed (a re-seed replays everything), following the replicas' messages in order."""
    ids: dict[str, list[int]] = {}
    for kind, _index, msg in out.sent:
        if kind != "detok":
            continue
        if isinstance(msg, DetokSeed):
            ids[msg.rid] = []
        elif isinstance(msg, BatchTokenOut):
            for rid, new in zip(msg.rids, msg.new_token_ids):
                ids[rid] = ids.get(rid, []) + list(new)
    return ids


def test_scheduler_reseeds_requests_of_a_lost_replica_mid_run():
    sched, out, worker = make_sched(replicas=3, choose=lambda rid, n: 200 + n)
    for i in range(9):
        sched.add_request(gen(f"r{i}", max_new=12))
    loop = Loop(sched, out, worker)
    for _ in range(5):
        loop.iterate()
    victims = sorted(rid for rid, r in sched.reqs.items() if r.detokenizer == 1)
    assert victims
    sched.detok.lost(1, "killed")
    query = [m for k, _, m in out.sent if isinstance(m, DeliveredQuery)]
    assert query == [DeliveredQuery(victims)]
    for _ in range(2):
        loop.iterate()  # the scheduler keeps decoding while the counts are awaited
    sched.detok.delivered(victims, [4] * len(victims))
    loop.run()
    final = rendered(out)
    for i in range(9):
        assert final[f"r{i}"] == [200 + n for n in range(12)], f"r{i}"
    for rid in victims:
        seeds = [(idx, m) for k, idx, m in out.sent if k == "detok" and isinstance(m, DetokSeed) and m.rid == rid]
        assert len(seeds) == 2 and seeds[1][0] in (0, 2) and seeds[1][1].chars_sent == 4
    assert sched.detok_load == [0, 0, 0]
    sched.detok.check()


@pytest.mark.parametrize("seed", range(5))
def test_randomized_losses_and_attaches_render_every_token_once(seed):
    """Requests arrive and finish while replicas die, come back and attach at random: each
    request's last replica is asked to render exactly its shown tokens, in order."""
    rng = random.Random(seed)
    sched, out, worker = make_sched(replicas=3, choose=lambda rid, n: EOS if rng.random() < 0.03 else 300 + n)
    router = sched.detok
    loop = Loop(sched, out, worker)
    reqs: dict[str, Req] = {}
    pids = iter(range(1000, 10**6))
    n = 0
    pending_queries: list[DeliveredQuery] = []
    for _ in range(400):
        if rng.random() < 0.3:
            rid = f"q{n}"
            n += 1
            sched.add_request(gen(rid, rng.randint(1, 20)))
            reqs[rid] = sched.reqs[rid]
        event = rng.random()
        serving = [r.index for r in router.replicas if r.serving]
        if event < 0.03 and serving:
            router.lost(rng.choice(serving), "killed")
        elif event < 0.05:
            gone = [r.index for r in router.replicas if not r.serving and r.index < 3]
            if gone:
                i = rng.choice(gone)
                pid = next(pids)
                router.register(i, pid, f"ep{i}")
                router.ready(i, pid)
        elif event < 0.06:
            pid = next(pids)
            router.ready(router.register(None, pid, f"ep-{pid}"), pid)
        pending_queries += [m for k, _, m in out.take() if isinstance(m, DeliveredQuery)]
        if pending_queries and rng.random() < 0.5:
            q = pending_queries.pop(0)
            router.delivered(q.rids, [0] * len(q.rids))
        loop.iterate()
        router.check()
    for q in pending_queries:
        router.delivered(q.rids, [0] * len(q.rids))
    if not any(r.serving for r in router.replicas):
        router.ready(router.register(None, 1, "ep-last"), 1)
    loop.run()
    final = rendered(out)
    for rid, r in reqs.items():
        if r.finish_reason == FinishReason.ABORT:
            continue
        assert final[rid] == shown_ids(r), rid
    assert all(load == 0 for load in sched.detok_load)
    router.check()
    assert router.lost_count >= 3 and sum(r.reseeded for r in router.replicas) >= 3  # the case under test happened
