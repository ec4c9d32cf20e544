"""KV memory: allocator, request table, radix cache units, and a randomized simulation of
the scheduler under a tiny pool with prefix caching, chunking, aborts and retractions.

The simulation's fake worker keeps, for every slot the scheduler told it to fill, the token
whose KV lives there, and computes each next token as a function of the whole sequence; so
a cached prefix whose slots hold the wrong tokens, or a retraction that recomputes the
wrong sequence, changes the output, which is checked against a plain reference.
"""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

from protocol.enums import ForwardMode
from protocol.messages import (
    AbortReq,
    BatchTokenOut,
    ChainDecode,
    DetokParams,
    Finalize,
    GenerateReq,
    Launch,
    LaunchResult,
    SamplingParams,
    StoreKV,
    WorkerAbort,
)
from scheduler_proc.mem.allocator import TokenToKVPoolAllocator
from scheduler_proc.mem.kv_memory import KVMemory
from scheduler_proc.mem.radix_cache import RadixCache
from scheduler_proc.mem.req_to_token import ReqToTokenPool
from scheduler_proc.scheduler import Scheduler

EOS = 2


# ----------------------------------------------------------------------------- units
def test_allocator_conserves_and_never_gives_slot_zero():
    a = TokenToKVPoolAllocator(10)
    got = a.alloc(4)
    assert len(got) == 4 and 0 not in got and a.free_count == 6
    assert a.alloc(7) is None and a.free_count == 6
    rest = a.alloc(6)
    assert sorted(got + rest) == list(range(1, 11)) and a.free_count == 0
    a.free(got)
    assert a.free_count == 4
    with pytest.raises(ValueError):
        a.free([0])
    with pytest.raises(ValueError):
        TokenToKVPoolAllocator(0)


def test_req_to_token_pool_rows():
    t = ReqToTokenPool(2, 8)
    i, j = t.alloc(), t.alloc()
    assert {i, j} == {0, 1} and t.alloc() is None
    t.write(i, 0, [5, 6, 7])
    t.write(i, 3, [9])
    assert t.read(i, 0, 4) == [5, 6, 7, 9]
    with pytest.raises(ValueError):
        t.write(j, 6, [1, 2, 3])
    t.free(i)
    assert t.alloc() == i


def test_radix_match_insert_split_and_shared_length():
    r = RadixCache()
    assert r.insert([1, 2, 3, 4], [11, 12, 13, 14]) == 0
    slots, node = r.match_prefix([1, 2, 9])
    assert slots == [11, 12] and node.key == [1, 2]  # split at 2
    assert r.insert([1, 2, 5], [21, 22, 25]) == 2  # [1, 2] was cached: 21, 22 are duplicates
    assert r.match_prefix([1, 2, 5, 6])[0] == [11, 12, 25]
    assert r.match_prefix([7])[0] == []
    assert r.total_size == 5 and r.evictable_size == 5
    r.check()


def test_radix_lock_protects_and_evict_is_lru():
    r = RadixCache()
    r.insert([1, 2, 3], [1, 2, 3])
    r.insert([4, 5], [4, 5])
    r.insert([6], [6])
    _, node = r.match_prefix([1, 2, 3])
    r.inc_lock_ref(node)
    assert (r.evictable_size, r.protected_size) == (3, 3)
    r.match_prefix([6])  # touch: [4, 5] is now the least recently used
    assert r.evict(2) == [4, 5]
    assert r.evict(10) == [6]  # the locked branch stays
    r.dec_lock_ref(node)
    assert r.evict(10) == [1, 2, 3] and r.total_size == 0
    with pytest.raises(RuntimeError):
        r.dec_lock_ref(node)
    r.check()


def test_radix_salts_are_namespaces_that_share_nothing():
    r = RadixCache()
    r.insert([1, 2, 3], [11, 12, 13])
    assert r.insert([1, 2, 3], [21, 22, 23], salt="a") == 0  # nothing shared across salts
    assert r.match_prefix([1, 2, 3], "a")[0] == [21, 22, 23]
    assert r.match_prefix([1, 2, 3])[0] == [11, 12, 13]
    slots, node = r.match_prefix([1, 2, 3], "b")  # a salt with nothing cached: no hit
    assert slots == [] and node.parent is None and "b" not in r.roots
    assert r.set_state([1, 2], 7, salt="a") and r.state_point(r.match_prefix([1, 2, 3], "a")[1])[1] == 2
    assert r.state_point(r.match_prefix([1, 2, 3])[1])[1] == 0  # the snapshot is the salt's alone
    assert r.total_size == 6
    r.check()
    r.match_prefix([1, 2, 3], "a")  # touch: the unsalted branch is the least recently used
    assert r.evict(3) == [11, 12, 13] and set(r.roots) == {"", "a"}
    assert r.evict(3) == [23, 21, 22] and set(r.roots) == {""}  # an emptied salt's root goes too
    r.check()


def test_kv_memory_salted_requests_reuse_only_their_salts_prefix():
    m = KVMemory(40, 4, 64)
    prompt = [1, 2, 3, 4, 5]
    for salt in ("", "tenant-a"):
        kv = m.begin(prompt, salt=salt)
        assert kv.prefix_len == 0  # the other salt's cached prompt is not reused
        assert m.alloc(kv, 5)
        m.release(kv, prompt)
    again = m.begin(prompt + [6], salt="tenant-a")
    assert again.prefix_len == 5 and again.salt == "tenant-a"
    assert m.alloc(again, 1)
    start, store = m.release(again, prompt + [6])
    assert (start, len(store)) == (5, 1)  # extends tenant-a's entry, not the shared one
    assert m.begin(prompt + [6], salt="tenant-b").prefix_len == 0
    assert m.radix.total_size == 11
    m.check()


def test_kv_memory_release_caches_and_frees_duplicates():
    m = KVMemory(20, 4, 64)
    a = m.begin([1, 2, 3, 4])
    assert a.prefix_len == 0 and m.alloc(a, 4)
    b = m.begin([1, 2, 3, 4, 5])  # nothing cached yet
    assert m.alloc(b, 5)
    start, store = m.release(a, [1, 2, 3, 4])
    assert start == 0 and len(store) == 4
    start, store = m.release(b, [1, 2, 3, 4, 5])  # [1..4] was cached meanwhile: only 5 is stored
    assert start == 4 and len(store) == 1
    m.check()
    assert m.radix.total_size == 5 and m.held == 0 and m.allocator.free_count == 15
    c = m.begin([1, 2, 3, 4, 5])  # fully cached: the last token is recomputed
    assert c.prefix_len == 4 and m.stats.cached_tokens == 0  # counted once the scheduler admits it
    m.admitted(c, 5)
    assert (m.stats.prompt_tokens, m.stats.cached_tokens) == (5, 4)
    m.alloc(c, 1)
    m.release(c)  # aborted: nothing cached, its own slot freed
    m.check()


def test_flush_frees_every_prefix_no_request_holds():
    m = KVMemory(20, 4, 64)
    for ids in ([1, 2, 3, 4], [1, 2, 9], [7, 8]):
        kv = m.begin(ids)
        assert m.alloc(kv, len(ids) - kv.prefix_len)
        m.release(kv, ids)
    held = m.begin([7, 8, 5])  # holds the cached [7, 8] while it runs
    m.admitted(held, 3)
    assert m.alloc(held, 1)
    assert m.radix.total_size == 7
    assert m.flush() == (5, 2)  # [1, 2, 3, 4] and its branch [9] freed; [7, 8] kept
    m.check()
    assert m.allocator.free_count == 20 - 2 - 1
    m.release(held)
    assert m.flush() == (2, 0)
    m.check()
    assert m.allocator.free_count == 20 and m.radix.total_size == 0


def test_an_ended_request_takes_an_end_snapshot_unless_aborted():
    m = KVMemory(64, 4, 64, state_slots=8, end_snapshots=True)
    prompt = [1, 2, 3, 4, 5, 6]
    kv = m.begin(prompt)
    assert m.alloc(kv, 6) and m.snapshot(kv, 6)
    m.cache_prompt(kv, prompt)  # the prompt-end snapshot goes to the cache
    for _ in range(3):  # three decode steps: outputs 7, 8 and a last one whose KV is never computed
        assert m.alloc(kv, 1)
    m.release(kv, prompt + [7, 8])
    assert kv.end_state and m.radix.state_slots() == 2 and m.states.free_count == 6 and m.state_held == 0
    m.check()
    nxt = m.begin(prompt + [7, 8, 9, 10])  # the next turn resumes after the answer
    assert (nxt.prefix_len, nxt.prefix_state) == (8, kv.end_state)
    assert m.alloc(nxt, 2)
    m.release(nxt)  # aborted: no end snapshot, nothing cached
    assert not nxt.end_state and m.radix.state_slots() == 2 and m.states.free_count == 6
    again = m.begin(prompt + [7, 8, 9])
    assert m.alloc(again, 1)
    m.release(again, prompt + [7, 8])  # ends where a snapshot is already cached: none taken
    assert not again.end_state and m.radix.state_slots() == 2 and m.states.free_count == 6 and m.state_held == 0
    m.check()


# ----------------------------------------------------------------------------- simulation
def next_token(seq: tuple[int, ...]) -> int:
    """The fake model: the next token is a function of the whole sequence."""
    h = hash(seq) & 0xFFFFFF
    return EOS if h % 23 == 0 else 10 + h % 40


def reference(prompt: list[int], max_new: int) -> list[int]:
    seq, out = list(prompt), []
    while len(out) < max_new:
        t = next_token(tuple(seq))
        out.append(t)
        if t == EOS:
            break
        seq.append(t)
    return out


class MemWorker:
    """Fake worker: rows in order, each row's sequence of tokens whose KV it holds, and a
    pool of slot -> token written only through StoreKV."""

    def __init__(self) -> None:
        self.rows: list[str] = []
        self.seq: dict[str, list[int]] = {}
        self.last: dict[str, int] = {}
        self.partial: dict[str, list[int]] = {}
        self.pool: dict[int, int] = {}
        self.pending: dict[int, tuple[list[str], list[int]]] = {}
        self.states: dict[int, tuple[int, ...]] = {}  # a recurrent-state snapshot = the tokens it consumed
        self.restores = 0
        self.ends: set[int] = set()  # slots last written as an end-of-request snapshot
        self.end_restores = 0

    def handle(self, msg):
        if isinstance(msg, Launch):
            self.pending[msg.launch_id] = (list(msg.batch.rids), self._launch(msg))
        elif isinstance(msg, ChainDecode):
            self.pending[msg.launch_id] = (list(self.rows), self._decode())
        elif isinstance(msg, Finalize):
            rids, toks = self.pending.pop(msg.launch_id)
            return LaunchResult(msg.launch_id, rids, toks)
        elif isinstance(msg, StoreKV):
            for rid, start, slots in zip(msg.rids, msg.starts, msg.slots):
                seq = self.seq[rid]
                assert start + len(slots) <= len(seq)
                for j, s in enumerate(slots):
                    self.pool[s] = seq[start + j]
            for rid, start, slots, state in zip(msg.rids, msg.starts, msg.slots, msg.state_slots):
                if state:  # the worker keeps the states of its last two launches: this one's or the chained one's
                    end = start + len(slots)
                    assert len(self.seq[rid]) - 1 <= end <= len(self.seq[rid]), "an end state the worker no longer has"
                    self.states[state] = tuple(self.seq[rid][:end])
                    self.ends.add(state)
        elif isinstance(msg, WorkerAbort):
            for rid in msg.rids:
                self.partial.pop(rid, None)
                if rid in self.seq:
                    self.rows.remove(rid)
                    del self.seq[rid], self.last[rid]
        return None

    def _decode(self) -> list[int]:
        out = []
        for rid in self.rows:
            self.seq[rid].append(self.last[rid])
            self.last[rid] = next_token(tuple(self.seq[rid]))
            out.append(self.last[rid])
        return out

    def _launch(self, msg: Launch) -> list[int]:
        b = msg.batch
        if msg.mode == ForwardMode.DECODE:
            assert b.rids == self.rows
            return self._decode()
        out = [None] * len(b.rids)
        dec = [i for i, r in enumerate(b.rids) if r in self.seq]
        if dec:
            toks = self._decode()
            for j, i in enumerate(dec):
                out[i] = toks[j]
        for i, rid in enumerate(b.rids):
            if rid in self.seq:
                continue
            if rid not in self.partial:
                prefix = b.prefix_slots[i] if b.prefix_slots else []
                self.partial[rid] = [self.pool[s] for s in prefix]
                restore = b.state_restores[i] if b.state_restores else 0
                if self.states and prefix:  # a recurrent model resumes exactly where its snapshot was taken
                    assert self.states[restore] == tuple(self.partial[rid]), "restored a stale or wrong snapshot"
                    self.restores += 1
                    self.end_restores += restore in self.ends
            start = len(self.partial[rid])
            self.partial[rid] += b.input_ids[i]
            for at, slot in zip(
                b.state_save_at[i] if b.state_save_at else [], b.state_save_slots[i] if b.state_save_slots else []
            ):
                assert start < at <= len(self.partial[rid])
                self.states[slot] = tuple(self.partial[rid][:at])
                self.ends.discard(slot)
            if b.final[i]:
                seq = self.partial.pop(rid)
                self.seq[rid], self.last[rid] = seq, next_token(tuple(seq))
                self.rows.append(rid)
                out[i] = self.last[rid]
            else:
                out[i] = -1
        return out


class Outbox:
    def __init__(self, worker: MemWorker) -> None:
        self.worker = worker
        self.detok: list[BatchTokenOut] = []

    def to_worker(self, msg) -> None:
        self.result = self.worker.handle(msg)

    def to_detokenizer(self, index, msg) -> None:
        if isinstance(msg, BatchTokenOut):
            self.detok.append(msg)

    def to_tokenizer(self, msg) -> None:
        raise AssertionError(f"unexpected message to the tokenizer: {msg!r}")


@pytest.mark.parametrize(
    "chunk,radix,overlap,seed,states,ends",
    [
        (0, True, True, 1, 0, False),
        (8, True, False, 2, 0, False),
        (8, False, True, 3, 0, False),
        (16, True, True, 4, 0, False),
        # a recurrent model, state snapshots every 4; the last two with end snapshots (extra buffer)
        (8, True, True, 5, 12, False),
        (0, True, False, 6, 4, False),
        (8, True, True, 7, 40, True),
        (0, True, True, 8, 30, True),
    ],
)
def test_simulation_conserves_slots_and_output(chunk, radix, overlap, seed, states, ends, capsys):
    rng = random.Random(seed)
    worker = MemWorker()
    if states:
        worker.states[0] = ()  # an empty snapshot map marks a recurrent model
    out = Outbox(worker)
    mem = KVMemory(160, 9, 256, radix=radix, state_slots=states, end_snapshots=ends)
    sched = Scheduler(
        out,
        max_running_requests=8,
        max_prefill_tokens=64,
        detokenizers=1,
        chunked_prefill_size=chunk,
        enable_mixed_chunk=rng.random() < 0.5,
        memory=mem,
        state_interval=4 if states else 0,
    )
    prefixes = [[rng.randrange(10, 50) for _ in range(rng.randint(5, 30))] for _ in range(4)]
    prompts: dict[str, tuple[list[int], int]] = {}
    salts: dict[str, str] = {}
    tokens: dict[str, list[int]] = defaultdict(list)
    ended: dict[str, str] = {}
    steps = launches = 0
    inflight = None
    n_req = 0
    for _step in range(8000):
        steps += 1
        if n_req < 1000 and rng.random() < 0.3:
            rid = f"r{n_req}"
            n_req += 1
            done = [r for r, how in ended.items() if how == "LENGTH"]
            if done and rng.random() < 0.3:  # the next turn of a finished "chat": its prompt and answer, and more
                prior = rng.choice(done)
                prompt = prompts[prior][0] + tokens[prior] + [rng.randrange(10, 50) for _ in range(rng.randint(1, 8))]
                salt = salts[prior]
            else:
                prompt = rng.choice(prefixes)[: rng.randint(1, 30)] + [
                    rng.randrange(10, 50) for _ in range(rng.randint(0, 25))
                ]
                salt = rng.choice(("", "", "t1", "t2"))  # cache_salt namespaces, created and emptied
            max_new = rng.randint(1, 24)
            prompts[rid], salts[rid] = (prompt, max_new), salt
            sched.add_request(
                GenerateReq(rid, prompt, max_new, SamplingParams(temperature=0), DetokParams(), [EOS], cache_salt=salt)
            )
        if rng.random() < 0.03 and sched.reqs:
            rid = rng.choice(sorted(sched.reqs))
            sched.abort(AbortReq(rid))
            if rid not in sched.reqs and rid not in ended:
                ended[rid] = "abort"
        if inflight is None:
            inflight = sched.next_batch()
            if inflight is None:
                mem.check()
                continue
            out.to_worker(sched.launch(inflight))
            launches += 1
        following = None
        if overlap and sched.can_chain(inflight):
            following, msg = sched.chain(inflight)
            out.to_worker(msg)
            launches += 1
        out.to_worker(Finalize(inflight.launch_id))
        sched.process_result(inflight, out.result)
        inflight = following
        mem.check()
        assert worker.rows == [r.rid for r in sched.running] or inflight is not None
        for r in sched.running:  # each reads its own salt's cache (or an empty root), never another's
            root = r.kv.node
            while root.parent is not None:
                root = root.parent
            assert root is mem.radix.roots.get(salts[r.rid]) or not root.children, r.rid
        for msg in out.detok:
            for i, rid in enumerate(msg.rids):
                tokens[rid] += msg.new_token_ids[i]
                if msg.finish_reasons[i] is not None:
                    assert rid not in ended, f"{rid} ended twice"
                    ended[rid] = msg.finish_reasons[i].name
        out.detok.clear()
    # drain without new arrivals
    for _ in range(20000):
        if not sched.reqs and inflight is None:
            break
        if inflight is None:
            inflight = sched.next_batch()
            out.to_worker(sched.launch(inflight))
        out.to_worker(Finalize(inflight.launch_id))
        sched.process_result(inflight, out.result)
        inflight = None
        mem.check()
        for msg in out.detok:
            for i, rid in enumerate(msg.rids):
                tokens[rid] += msg.new_token_ids[i]
                if msg.finish_reasons[i] is not None:
                    assert rid not in ended
                    ended[rid] = msg.finish_reasons[i].name
        out.detok.clear()
    assert not sched.reqs and set(ended) == set(prompts), "a request was lost"
    assert mem.held == 0 and mem.allocator.free_count + mem.radix.total_size == mem.total
    assert not worker.rows and not worker.partial
    # every completed request's tokens equal the reference (the scheduler's own record)
    finished = [rid for rid, how in ended.items() if how in ("STOP", "LENGTH")]
    assert len(finished) > 100
    for rid in finished:
        ref = reference(*prompts[rid])
        assert tokens[rid] == (ref[:-1] if ref[-1] == EOS else ref), rid
    with capsys.disabled():
        print(
            f"\nKV simulation chunk={chunk} radix={radix} overlap={overlap}: {steps} steps, {launches} launches, "
            f"{n_req} requests, retractions {mem.stats.retractions}, cached tokens {mem.stats.cached_tokens} "
            f"of {mem.stats.prompt_tokens}"
        )
    assert mem.stats.retractions > 0
    if radix:
        assert mem.stats.cached_tokens > 0
    if states:  # snapshots were used; at the end all are free or in the cache (mem.check), none held
        assert worker.restores > 0 and mem.state_held == 0
        assert (worker.end_restores > 0) == ends  # a next turn resumed after the previous answer
