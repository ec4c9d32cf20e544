"""The worker's model runner against a plain mlx-lm loop on the same loaded model, batched
against solo, sampling, and the forward-mode contract (DESIGN.md §4, §5, §8).

These tests run on the default model loaded in this process (`loaded`); the others of
the module: tests/unit/test_worker.py."""

from __future__ import annotations

from contextlib import contextmanager

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from protocol.enums import ForwardMode
from protocol.messages import ForwardBatch
from tests.support.worker_runs import EOS, GREEDY, decode_all, extend, run_batch
from worker_proc.model.runner import ModelRunner


def reference_greedy(model, ids: list[int], max_tokens: int) -> list[int]:
    """The plain mlx-lm loop: prefill, then argmax step by step, through EOS."""
    cache = make_prompt_cache(model)
    logits = model(mx.array(ids)[None], cache=cache)[:, -1]
    out = []
    for _ in range(max_tokens):
        tok = mx.argmax(logits, axis=-1)
        out.append(tok.item())
        if out[-1] == EOS:
            break
        logits = model(tok[None], cache=cache)[:, -1]
    return out


def test_greedy_equals_reference_loop(loaded, prompt_ids, tokenizer):
    refs = [reference_greedy(loaded.model, ids, 40) for ids in prompt_ids]
    assert any(r[-1] == EOS for r in refs), "at least one reference must run through EOS"
    out = run_batch(ModelRunner(loaded), ["a", "b", "c"], prompt_ids, 40)
    assert [out["a"], out["b"], out["c"]] == refs
    assert tokenizer.decode(refs[0], skip_special_tokens=True) == "The capital of France is Paris."


class CountingThreads:
    """Stands for `worker_proc.cpu.blas_threads.PrefillThreads`: counts the launches queued under it."""

    def __init__(self) -> None:
        self.applied_to = self.recorded = 0

    @contextmanager
    def applied(self, prefill: bool = True):
        if prefill:
            self.applied_to += 1
        else:
            self.recorded += 1
        yield 2 if prefill else 1


def test_prefill_launches_run_with_the_prefill_threads_and_decodes_without(loaded, prompt_ids):
    threads = CountingThreads()
    out = run_batch(ModelRunner(loaded, threads=threads), ["a", "b"], prompt_ids[:2], 5)
    assert threads.applied_to == 1  # the EXTEND; its 4 DECODE steps keep the decode count
    assert threads.recorded == 4  # (and keep the measure of the cores recent)
    assert out == run_batch(ModelRunner(loaded), ["a", "b"], prompt_ids[:2], 5)


def test_batched_equals_solo_with_joins(loaded, prompt_ids):
    """Requests prefilled one by one into a running batch decode as they would alone."""
    solo = [run_batch(ModelRunner(loaded), ["x"], [ids], 16)["x"] for ids in prompt_ids]
    runner = ModelRunner(loaded)
    runner.launch(1, ForwardMode.EXTEND, extend(["a"], [prompt_ids[0]]))
    out = {"a": runner.finalize(1)[1]}
    runner.launch(2, ForwardMode.DECODE, ForwardBatch(["a"]))
    out["a"] += runner.finalize(2)[1]
    runner.launch(3, ForwardMode.EXTEND, extend(["b", "c"], prompt_ids[1:]))
    rids, toks = runner.finalize(3)
    out.update({r: [t] for r, t in zip(rids, toks)})
    lid = 4
    while any(len(v) < 16 for v in out.values()):
        runner.launch(lid, ForwardMode.DECODE, ForwardBatch(list(runner.batch.rids)))
        for r, t in zip(*runner.finalize(lid)):
            out[r].append(t)
        lid += 1
    for rid, ref in zip("abc", solo):
        got = out[rid][: len(ref)]
        assert got == ref


def test_store_writes_every_request_s_positions_at_their_slots(loaded, prompt_ids):
    """`ModelRunner.store` of rows of different lengths (left padding differs, one row has
    decoded past its prompt) writes each request's positions start..end-1 at its slots, in
    one gather per cache array (`RunningBatch.rows_kv`): equal to each prompt's own KV."""
    from worker_proc.memory.kv_pool import KVPool

    pool = KVPool(loaded.model, 256, loaded.dtype)
    runner = ModelRunner(loaded, pool=pool)
    runner.launch(1, ForwardMode.EXTEND, extend(["a"], [prompt_ids[0]]))
    runner.finalize(1)
    runner.launch(2, ForwardMode.DECODE, ForwardBatch(["a"]))
    runner.finalize(2)
    runner.launch(3, ForwardMode.EXTEND, extend(["b", "c"], prompt_ids[1:3]))
    runner.finalize(3)
    la, lc = len(prompt_ids[0]), len(prompt_ids[2])
    spans = {"c": (2, lc), "a": (0, la)}  # c's tail and a's whole prompt, in that order
    slots = {"c": list(range(100, 100 + lc - 2)), "a": list(range(10, 10 + la))}
    runner.store(["c", "b", "a"], [spans["c"][0], 0, 0], [slots["c"], [], slots["a"]])
    mx.eval(pool.arrays())
    for rid, ids in (("a", prompt_ids[0]), ("c", prompt_ids[2])):
        cache = make_prompt_cache(loaded.model)
        loaded.model(mx.array(ids)[None], cache=cache)
        start, end = spans[rid]
        idx = mx.array(slots[rid])
        for layer, c in enumerate(cache):
            want_k = c.keys[0, :, start:end, :].transpose(1, 0, 2)
            want_v = c.values[0, :, start:end, :].transpose(1, 0, 2)
            assert mx.allclose(pool.keys[layer][0][idx], want_k, atol=1e-4).item(), (rid, layer)
            assert mx.allclose(pool.values[layer][0][idx], want_v, atol=1e-4).item(), (rid, layer)
    assert not mx.any(pool.keys[0][0][10 + la : 100]).item()  # nothing written between


def test_unknown_mode_at_launch_and_finalize(loaded, prompt_ids):
    runner = ModelRunner(loaded)
    with pytest.raises(
        ValueError, match=r"worker cannot launch forward mode IDLE; supported: DECODE, EXTEND, MIXED, TARGET_VERIFY"
    ):
        runner.launch(7, ForwardMode.IDLE, extend(["a"], [prompt_ids[0]]))
    with pytest.raises(
        ValueError, match=r"cannot finalize launch in mode IDLE; supported: DECODE, EXTEND, MIXED, TARGET_VERIFY"
    ):
        runner.finalize(7)
    with pytest.raises(ValueError, match="worker cannot launch forward mode 9"):
        runner.launch(8, 9, extend(["a"], [prompt_ids[0]]))
    with pytest.raises(KeyError):
        runner.finalize(12345)


def test_decode_must_match_running_batch(loaded, prompt_ids):
    runner = ModelRunner(loaded)
    runner.launch(1, ForwardMode.EXTEND, extend(["a"], [prompt_ids[0]]))
    runner.finalize(1)
    with pytest.raises(ValueError, match="do not match"):
        runner.launch(2, ForwardMode.DECODE, ForwardBatch(["zzz"]))
    with pytest.raises(RuntimeError, match="do not match"):
        runner.finalize(2)


def test_chunked_prefill_and_mixed_equal_solo(loaded, prompt_ids):
    """A prompt prefilled in chunks (including a final chunk of one token) while another
    request decodes in the same MIXED launches gives the same tokens as each alone."""
    solo = [run_batch(ModelRunner(loaded), ["x"], [ids], 12)["x"] for ids in prompt_ids[:2]]
    runner = ModelRunner(loaded)
    runner.launch(1, ForwardMode.EXTEND, extend(["a"], [prompt_ids[0]]))
    out = {"a": runner.finalize(1)[1]}
    ids = prompt_ids[1]
    cuts = [0, 5, len(ids) - 1, len(ids)]  # chunks of 5, len-6 and exactly 1 token
    for k in range(3):
        chunk = ids[cuts[k] : cuts[k + 1]]
        final = k == 2
        batch = ForwardBatch(["a", "b"], [[], chunk], [None, GREEDY if k == 0 else None], [True, final])
        runner.launch(2 + k, ForwardMode.MIXED, batch)
        rids, toks = runner.finalize(2 + k)
        assert rids == ["a", "b"]
        out["a"].append(toks[0])
        if final:
            out["b"] = [toks[1]]
        else:
            assert toks[1] == -1
            assert runner.batch.rids == ["a"] and "b" in runner.partial
    assert runner.batch.rids == ["a", "b"] and not runner.partial
    decode_all(runner, out, 12, 10)
    assert out["a"][: len(solo[0])] == solo[0]
    assert out["b"][: len(solo[1])] == solo[1]


def test_non_final_chunk_is_computed_by_its_own_launch(loaded, prompt_ids):
    """A non-final chunk samples nothing, so its KV must be computed with its launch (and
    waited for at finalize), not left lazy until the final chunk: after finalize the
    chunk's KV buffers are allocated."""
    runner = ModelRunner(loaded)
    ids = prompt_ids[0]
    before = mx.get_active_memory()
    runner.launch(1, ForwardMode.EXTEND, ForwardBatch(["b"], [ids[:-1]], [GREEDY], [False]))
    assert runner.finalize(1) == (["b"], [-1])
    grown = mx.get_active_memory() - before
    kv = sum(c.keys.nbytes + c.values.nbytes for c in runner.partial["b"].cache)
    assert kv > 0 and grown >= kv, (grown, kv)


def chain_through(runner: ModelRunner, prev: int, last: int, out: dict[str, list[int]], step) -> None:
    """Chain decodes prev+1..last; `step(lid, prev)` launches lid and returns prev's
    finalize (in its own order); then finalize `last`. Appends every token to `out`."""
    for lid in range(prev + 1, last + 1):
        for r, t in zip(*step(lid, prev)):
            out[r].append(t)
        prev = lid
    for r, t in zip(*runner.finalize(prev)):
        out[r].append(t)


def test_chained_decode_equals_unchained(loaded, prompt_ids):
    """Decodes chained on the previous launch's lazy tokens (two in flight) give the same
    tokens as launch-then-finalize."""
    plain = run_batch(ModelRunner(loaded), ["a", "b"], prompt_ids[:2], 10)
    runner = ModelRunner(loaded)
    runner.launch(1, ForwardMode.EXTEND, extend(["a", "b"], prompt_ids[:2]))
    runner.launch(2, ForwardMode.DECODE, ForwardBatch(["a", "b"]))  # before finalizing 1
    out = {r: [t] for r, t in zip(*runner.finalize(1))}

    def chain_first(lid: int, prev: int):
        runner.chain_decode(lid, prev)
        return runner.finalize(prev)

    chain_through(runner, 2, 10, out, chain_first)
    for rid in ("a", "b"):
        n = min(len(plain[rid]), 10)
        assert out[rid][:n] == plain[rid][:n]
    with pytest.raises(ValueError, match="must follow the latest launch"):
        runner.chain_decode(99, 3)
    with pytest.raises(RuntimeError, match="must follow the latest launch"):
        runner.finalize(99)


def test_finalize_early_orders_equal_chain_first(loaded, prompt_ids):
    """Building chained launch N+1, finalizing N, then starting N+1 (the finalize-early
    order), or finalizing N before chaining at all, gives the same tokens as chaining first;
    a chain on a launch that is not the latest fails."""
    plain = run_batch(ModelRunner(loaded), ["a", "b"], prompt_ids[:2], 10)
    runner = ModelRunner(loaded)
    runner.launch(1, ForwardMode.EXTEND, extend(["a", "b"], prompt_ids[:2]))
    out = {"a": [], "b": []}

    def alternate(lid: int, prev: int):
        if lid % 3 == 0:
            runner.chain_decode(lid, prev)
            return runner.finalize(prev)
        if lid % 3 == 1:
            got = runner.finalize(prev)
            runner.chain_decode(lid, prev)
            return got
        runner.chain_decode(lid, prev, start=False)
        got = runner.finalize(prev)
        runner.start(lid)
        return got

    chain_through(runner, 1, 10, out, alternate)
    for rid in ("a", "b"):
        n = min(len(plain[rid]), 10)
        assert len(out[rid]) == 10 and out[rid][:n] == plain[rid][:n]
    with pytest.raises(ValueError, match="must follow the latest launch, got prev=9"):
        runner.chain_decode(11, 9)


def test_extend_with_a_running_rid_needs_mixed(loaded, prompt_ids):
    runner = ModelRunner(loaded)
    runner.launch(1, ForwardMode.EXTEND, extend(["a"], [prompt_ids[0]]))
    runner.finalize(1)
    with pytest.raises(ValueError, match="only MIXED batches hold decode rows"):
        runner.launch(2, ForwardMode.EXTEND, ForwardBatch(["a"], [[]], [None], [True]))


def test_kv_pool_segment_0_is_allocated_at_start_up(loaded):
    """The first segment's memory is taken when the worker starts (before it reports ready),
    not by the first request that stores into it; the rest when stores reach it."""
    from worker_proc.memory.kv_pool import KVPool, bytes_per_token

    before = mx.get_active_memory()
    pool = KVPool(loaded.model, 4095, loaded.dtype)  # 4,096 ids: one segment
    assert mx.get_active_memory() - before >= 4096 * bytes_per_token(loaded.model, loaded.dtype)
    assert pool.size == 4095 and len(pool.keys[0]) == 1


def test_worker_process_runs_the_finalize_early_order(loaded, prompt_ids):
    """WorkerProcess with the early order on: a ChainDecode(N+1, N) followed by Finalize(N)
    sends N's result before N+1 is queued, and the tokens equal the plain loop's."""
    import structlog

    from protocol import codec
    from protocol.messages import ChainDecode, Finalize
    from worker_proc.finalize_order import FinalizeOrder
    from worker_proc.proc import WorkerProcess

    class Inbox:
        def __init__(self):
            self.queue = []

        def poll(self, timeout_ms):
            return bool(self.queue)

        def recv(self):
            return self.queue.pop(0)

    class Results:
        def __init__(self):
            self.sent = []

        def send(self, raw):
            self.sent.append(codec.from_worker.decode(raw))

    plain = run_batch(ModelRunner(loaded), ["a"], prompt_ids[:1], 8)["a"]
    proc = WorkerProcess.__new__(WorkerProcess)
    proc.runner, proc.log, proc.inbox, proc.results = ModelRunner(loaded), structlog.get_logger(), Inbox(), Results()
    proc.order, proc.chain_first, proc.stopping, proc.generation = FinalizeOrder(), None, False, 0
    proc.order.finalize_early, proc.order.round_trip_s = True, 1.0
    proc.runner.launch(1, ForwardMode.EXTEND, extend(["a"], prompt_ids[:1]))
    started = []
    start = proc.runner.start
    proc.runner.start = lambda lid: (started.append((lid, len(proc.results.sent))), start(lid))
    for lid in range(2, 9):
        proc.inbox.queue.append(codec.encoder.encode(Finalize(lid - 1)))
        proc._handle(ChainDecode(lid, lid - 1), 0.0, 0.0)
        assert not proc.inbox.queue
    proc._handle(Finalize(8), 0.0, 0.0)
    assert [r.launch_id for r in proc.results.sent] == list(range(1, 9))
    assert [t for r in proc.results.sent for t in r.next_token_ids] == plain[:8]
    assert started == [(lid, lid - 1) for lid in range(2, 9)]  # N+1 queued after N's result was sent
    assert proc.order.finalize_early


def test_prefill_in_several_calls_equals_one_call(loaded, prompt_ids, monkeypatch):
    """A prompt longer than the prefill step (several model calls in one lazy prefill) gives
    the logits of one call over the whole prompt."""
    from worker_proc.model import batched_prefill

    ids = (prompt_ids[0] * 20)[:400]
    logits = {}
    for step in (1024, 128):
        monkeypatch.setattr(batched_prefill, "prefill_step", lambda step=step: step)
        logits[step], cache = batched_prefill.prefill_rows(loaded.model, [ids], [make_prompt_cache(loaded.model)])
        assert cache[0].offset.tolist() == [400]
    assert mx.allclose(logits[1024], logits[128], atol=1e-3).item()
    assert mx.argmax(logits[1024]).item() == mx.argmax(logits[128]).item()


def test_warm_up_runs_a_dummy_request_through_the_runner_and_drops_it(loaded, monkeypatch):
    """Start-up warm-up: each dummy row alone, an EXTEND then DECODE steps, each finalized
    with a real token; with the KV pool, then the radix cache's path (store, an EXTEND after
    a prefix gathered from the pool joining a running row, decodes of both, a drop);
    afterwards no row is left and MLX's cache is empty."""
    from worker_proc.memory.kv_pool import KVPool
    from worker_proc.model import batched_prefill, warmup

    runners, launches, tokens, stores, masked = [], [], [], [], []

    class Recording(ModelRunner):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            runners.append(self)

        def launch(self, launch_id, mode, batch):
            launches.append((mode, list(batch.rids), [len(s) for s in batch.prefix_slots]))
            masked.append((list(batch.rids), list(batch.grammar_rows), [len(m) for m in batch.grammar_masks]))
            super().launch(launch_id, mode, batch)

        def finalize(self, launch_id):
            rids, ids = super().finalize(launch_id)
            tokens.append(ids)
            return rids, ids

        def store(self, rids, starts, slots, state_slots=()):
            stores.append((list(rids), list(starts), [list(s) for s in slots]))
            super().store(rids, starts, slots, state_slots)

    monkeypatch.setattr(warmup, "ModelRunner", Recording)
    pool = KVPool(loaded.model, 64, loaded.dtype)
    seconds = warmup.warm_up(loaded, pool=pool, kernels=True)
    stored, cached = warmup.CACHED_ROWS
    steps, n = warmup.DECODE_STEPS, warmup.PROMPT_TOKENS
    assert launches == [
        launch
        for rid in warmup.ROWS
        for launch in [(ForwardMode.EXTEND, [rid], [])] + [(ForwardMode.DECODE, [rid], [])] * steps
    ] + [(ForwardMode.EXTEND, [stored], [])] + [(ForwardMode.DECODE, [stored], [])] * steps + [
        (ForwardMode.EXTEND, [cached], [n // 2])
    ] + [(ForwardMode.DECODE, [stored, cached], [])] * steps + [(ForwardMode.DECODE, [cached], [])]
    assert stores == [([stored], [0], [list(range(1, n + 1))])]
    # the row taking every logit edit sends an all-allowing grammar mask in each of its launches, and only it
    words = (loaded.vocab_size + 31) // 32
    assert [m for m in masked if m[1]] == [([warmup.EDITED], [0], [4 * words])] * (1 + steps)
    assert warmup.open_mask(loaded.vocab_size) == b"\xff" * (4 * words)
    assert [len(ids) for ids in tokens] == [1] * (len(warmup.ROWS) + 1) * (1 + steps) + [1] + [2] * steps + [1]
    assert all(0 <= t < loaded.vocab_size for ids in tokens for t in ids)
    assert len(runners) == 1 and runners[0].batch.rids == [] and not runners[0].pending and not runners[0].partial
    assert mx.get_cache_memory() == 0
    # the stored row's prompt KV is in slots 1..n (a fresh prefill of the same prompt), slot 0 and n+1.. untouched
    prompt = [1 + i % (loaded.vocab_size - 1) for i in range(n)]
    _, cache = batched_prefill.prefill_rows(loaded.model, [prompt], [make_prompt_cache(loaded.model)])
    want = cache[0].keys[0, :, :n, :].transpose(1, 0, 2)  # one row: no left padding
    assert mx.allclose(pool.keys[0][0][1 : n + 1], want, atol=1e-4).item()
    assert not mx.any(pool.keys[0][0][0]).item() and not mx.any(pool.keys[0][0][n + 1 :]).item()
    assert 0 < seconds < 60


def test_warm_up_on_the_cpu_runs_the_plain_rows_only(loaded, monkeypatch):
    """Where kernels are not prepared on first use (MLX's CPU backend, the default there), the
    warm-up runs the greedy and sampled rows and neither the row with every logit edit nor the
    pool path: the pool's slots stay untouched."""
    from worker_proc.memory.kv_pool import KVPool
    from worker_proc.model import warmup

    rids = []

    class Recording(ModelRunner):
        def launch(self, launch_id, mode, batch):
            rids.extend(r for r in batch.rids if r not in rids)
            super().launch(launch_id, mode, batch)

    monkeypatch.setattr(warmup, "ModelRunner", Recording)
    pool = KVPool(loaded.model, 64, loaded.dtype)
    assert mx.default_device() == mx.cpu
    warmup.warm_up(loaded, pool=pool)
    assert rids == [r for r in warmup.ROWS if r != warmup.EDITED]
    assert not mx.any(pool.keys[0][0]).item()


def test_warm_up_skips_the_pool_path_where_it_cannot_take_it(loaded):
    """`warm_pool` does nothing with a pool smaller than its prompt (a tiny --max-total-tokens)."""
    from worker_proc.memory.kv_pool import KVPool
    from worker_proc.model import warmup

    pool = KVPool(loaded.model, warmup.PROMPT_TOKENS - 1, loaded.dtype)
    runner = ModelRunner(loaded, pool=pool)
    assert warmup.warm_pool(runner, loaded, pool, list(range(1, warmup.PROMPT_TOKENS + 1)), 0) is False
    assert not mx.any(pool.keys[0][0]).item()
