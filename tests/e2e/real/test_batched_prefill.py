"""Batched prefill (worker_proc/model/batched_prefill.py): grouping by length, and new requests of
one extend launch (fresh, with cached prefixes of different lengths, continuing a chunk)
prefilled together give the tokens each gives alone.

These tests run on the default model loaded in this process (`loaded`); the others of
the module: tests/unit/test_batched_prefill.py."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from protocol.enums import ForwardMode
from protocol.messages import ForwardBatch
from tests.support.worker_runs import GREEDY, Collector, decode_all, run_batch
from worker_proc.memory.kv_pool import KVPool
from worker_proc.model import batched_prefill
from worker_proc.model.batched_prefill import prefill_rows
from worker_proc.model.runner import ModelRunner


def test_prefill_rows_refuses_empty_rows(loaded):
    with pytest.raises(ValueError, match="non-empty"):
        prefill_rows(loaded.model, [[1, 2], []], [make_prompt_cache(loaded.model)] * 2)


def test_rows_of_different_lengths_and_prefixes_equal_solo(loaded, prompt_ids, monkeypatch):
    """One EXTEND launch holds a fresh prompt, two prompts whose cached prefixes (6 and 20
    tokens, gathered from the pool) differ in length, and the final chunk of a prompt
    prefilled in part before; a model-call step of 64 positions splits the longest row. The
    pool has segments of 8 slot ids, so the prefixes are stored and gathered across 4."""
    from worker_proc.memory import kv_pool

    monkeypatch.setattr(batched_prefill, "prefill_step", lambda: 64)
    monkeypatch.setattr(kv_pool, "MIN_SEGMENT_SLOTS", 8)
    long_ids = (prompt_ids[1] * 4)[:90]
    prompts = [prompt_ids[0], prompt_ids[1], prompt_ids[2], long_ids]
    solo = [run_batch(ModelRunner(loaded), ["x"], [ids], 10)["x"] for ids in prompts]
    pool = KVPool(loaded.model, 64, loaded.dtype)
    runner = ModelRunner(loaded, pool=pool)
    slots = {1: list(range(1, 7)), 2: list(range(7, 27))}
    for i, sl in slots.items():  # the pool holds the KV of each prompt's first len(sl) tokens
        cache = make_prompt_cache(loaded.model)
        loaded.model(mx.array(prompts[i][: len(sl)])[None], cache=cache)
        pool.store(
            sl,
            [(c.keys[0, :, : len(sl)].transpose(1, 0, 2), c.values[0, :, : len(sl)].transpose(1, 0, 2)) for c in cache],
        )
    runner.launch(1, ForwardMode.EXTEND, ForwardBatch(["d"], [long_ids[:30]], [GREEDY], [False]))
    assert runner.finalize(1)[1] == [-1] and "d" in runner.partial
    batch = ForwardBatch(
        ["a", "b", "c", "d"],
        [prompts[0], prompts[1][6:], prompts[2][20:], long_ids[30:]],
        [GREEDY, GREEDY, GREEDY, None],
        [True] * 4,
        prefix_slots=[[], slots[1], slots[2], []],
    )
    gathers = []
    monkeypatch.setattr(
        pool, "gather_rows", lambda rows, width: gathers.append((rows, width)) or KVPool.gather_rows(pool, rows, width)
    )
    runner.launch(2, ForwardMode.EXTEND, batch)
    assert gathers == [([[], slots[1], slots[2], []], 30)]  # both prefixes in one gather per layer, d its own 30
    assert pool.segment == 8 and [s for s, a in enumerate(pool.keys[0]) if a is not None] == [0, 1, 2, 3]
    rids, toks = runner.finalize(2)
    assert rids == ["a", "b", "c", "d"] and runner.batch.rids == rids
    assert [runner.batch.length(i) for i in range(4)] == [len(p) for p in prompts]
    out = {r: [t] for r, t in zip(rids, toks)}
    decode_all(runner, out, 10, 3)
    for rid, ref in zip("abcd", solo):
        assert out[rid][: len(ref)] == ref


def test_bucketed_prefill_equals_unbucketed(loaded, prompt_ids):
    """Five rows (padded to 8, three padding rows dropped after), widths padded to 64, cached
    prefixes of 0, 5 and 11 tokens padded to 16: the same last-token logits and the same KV
    for every row as without padding."""
    model = loaded.model
    prompts = [prompt_ids[0], prompt_ids[1], prompt_ids[2], prompt_ids[0][:20], prompt_ids[1][:9]]
    prefix = [0, 5, 11, 0, 5]

    def caches():
        out = []
        for ids, n in zip(prompts, prefix):
            c = make_prompt_cache(model)
            if n:
                model(mx.array(ids[:n])[None], cache=c)
            out.append(c)
        return out

    tokens = [ids[n:] for ids, n in zip(prompts, prefix)]
    ref_logits, ref = prefill_rows(model, tokens, caches(), buckets=False)
    logits, got = prefill_rows(model, tokens, caches(), buckets=True)
    assert logits.shape == ref_logits.shape == (5, loaded.vocab_size)
    assert mx.allclose(logits, ref_logits, atol=1e-3).item()
    for layer in (0, len(ref) - 1):
        for i, ids in enumerate(prompts):
            n = len(ids)
            a, b = ref[layer], got[layer]
            assert mx.allclose(a.keys[i, :, a._idx - n : a._idx], b.keys[i, :, b._idx - n : b._idx], atol=1e-4).item()
            assert a.offset[i].item() == b.offset[i].item() == n


def test_a_leave_frees_a_slot_without_a_copy_and_a_join_reuses_it(loaded, prompt_ids):
    """b leaves after 3 steps: its row stays, free (no copy); d joins into that row; c's
    partner e (longer than the batch's width) forces a compaction and an append; every
    request's tokens equal its solo run, with and without the decode graph."""
    from worker_proc.model.decode_graph import DecodeGraph

    long_ids = (prompt_ids[1] * 3)[:120]
    prompts = {"a": prompt_ids[0], "b": prompt_ids[1], "c": prompt_ids[2], "d": prompt_ids[2][:15], "e": long_ids}
    solo = {r: run_batch(ModelRunner(loaded), ["x"], [ids], 10)["x"] for r, ids in prompts.items()}
    for graph in (None, DecodeGraph(loaded.model, 8)):
        runner = ModelRunner(loaded, graph=graph)
        launch = Collector(runner)
        out = launch.out

        launch(ForwardMode.EXTEND, ForwardBatch(["a", "b", "c"], [prompts[r] for r in "abc"], [GREEDY] * 3, [True] * 3))
        for _ in range(3):
            launch(ForwardMode.DECODE, ForwardBatch(list(runner.batch.rids)))
        keys = runner.batch.cache[0].keys
        runner.abort(["b"])
        assert runner.batch.rids == ["a", "c"] and runner.batch.slots == [0, 2] and runner.batch.size == 3
        assert runner.batch.cache[0].keys is keys  # no copy
        launch(ForwardMode.EXTEND, ForwardBatch(["d"], [prompts["d"]], [GREEDY], [True]))
        assert runner.batch.rids == ["a", "c", "d"] and runner.batch.slots == [0, 2, 1]
        for _ in range(3):
            launch(ForwardMode.DECODE, ForwardBatch(list(runner.batch.rids)))
        runner.abort(["a"])
        launch(ForwardMode.EXTEND, ForwardBatch(["e"], [prompts["e"]], [GREEDY], [True]))
        assert runner.batch.rids == ["c", "d", "e"] and runner.batch.slots == [0, 1, 2]  # compacted, appended
        while any(len(out[r]) < 10 for r in runner.batch.rids):
            launch(ForwardMode.DECODE, ForwardBatch(list(runner.batch.rids)))
        for rid, ref in solo.items():
            assert out[rid][: min(len(ref), len(out[rid]))] == ref[: len(out[rid])], rid
        assert len(out["a"]) == 7 and len(out["b"]) == 4


def test_the_batch_compacts_when_more_than_half_its_rows_are_free(loaded, prompt_ids):
    runner = ModelRunner(loaded)
    runner.launch(1, ForwardMode.EXTEND, ForwardBatch(["a", "b", "c"], prompt_ids, [GREEDY] * 3, [True] * 3))
    runner.finalize(1)
    runner.abort(["a"])
    assert runner.batch.size == 3 and runner.batch.slots == [1, 2]
    runner.abort(["c"])
    assert runner.batch.size == 1 and runner.batch.slots == [0] and runner.batch.rids == ["b"]
    assert runner.batch.length(0) == len(prompt_ids[1])


def test_steady_joins_into_free_rows_keep_the_batch_width_bounded(loaded, prompt_ids, monkeypatch):
    """Every 4 steps the oldest of 2 rows leaves and a new request joins its free row (half
    free: never compacted by free share): the padding all live rows carry stays under
    TRIM_AT (without the trim it grows 4 positions a round, and with it memory and attention
    width), and every request's tokens equal its solo run."""
    from worker_proc.model import running_batch

    monkeypatch.setattr(running_batch, "TRIM_AT", 12)
    prompts = {f"r{k}": prompt_ids[k % len(prompt_ids)][: 8 + k] for k in range(10)}
    solo = {r: run_batch(ModelRunner(loaded), ["x"], [ids], 9)["x"] for r, ids in prompts.items()}
    runner = ModelRunner(loaded)
    launch = Collector(runner)
    launch(ForwardMode.EXTEND, ForwardBatch(["r0", "r1"], [prompts["r0"], prompts["r1"]], [GREEDY] * 2, [True] * 2))
    paddings = []
    for k in range(2, 10):
        for _ in range(4):
            launch(ForwardMode.DECODE, ForwardBatch(list(runner.batch.rids)))
        runner.abort([runner.batch.rids[0]])
        launch(ForwardMode.EXTEND, ForwardBatch([f"r{k}"], [prompts[f"r{k}"]], [GREEDY], [True]))
        assert runner.batch.size == 2
        paddings.append(runner.batch.padding())
    assert max(paddings) < 12 and paddings.count(0) >= 2, paddings  # trimmed, more than once
    for rid, got in launch.out.items():
        assert got == solo[rid][: len(got)], rid
