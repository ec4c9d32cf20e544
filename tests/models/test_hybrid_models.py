"""Recurrent and hybrid models (issue 11, first part), in this process: the worker serves
mlx-lm's Mamba-2 and three hybrids (LFM2, Nemotron-H, Granite 4 hybrid) token for token like a
plain mlx-lm loop, through batched prefill of unequal prompts, chunked prefill, a MIXED launch,
chained decodes, a request leaving and another joining into its free row; the extra buffer's
end states are those of the last two launches; a cache type the worker does not serve is
refused at load naming the architecture and the type. End to end (a hybrid server resuming
cached prefixes from recurrent-state snapshots): tests/e2e/test_hybrid_models.py."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import pytest
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, RotatingKVCache, make_prompt_cache

from protocol.config import ModelSource
from protocol.enums import ForwardMode
from protocol.messages import ForwardBatch, SamplingParams
from tests.support.hybrid_configs import HYBRID_CONFIGS
from tests.support.tiny_model import write_random_model
from tests.support.worker_runs import assert_captured_as_uncompiled, assert_reference, leave_and_join
from worker_proc.memory.kv_pool import KVPool
from worker_proc.memory.layer_caches import KV, STATE, CacheKinds, UnsupportedCache
from worker_proc.memory.state_pool import StatePool, state_rows
from worker_proc.model.loader import load
from worker_proc.model.runner import ModelRunner

A, B, C = list(range(10, 17)), list(range(100, 121)), [(7 * i) % 900 + 30 for i in range(20)]
GREEDY = SamplingParams(temperature=0.0, top_logprobs=0)  # with each token's logprob, to compare closely


STEPS = 10


@pytest.fixture(scope="module", params=sorted(HYBRID_CONFIGS))
def hybrid_dir(request, tokenizer, tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp(request.param), tokenizer, HYBRID_CONFIGS[request.param])


def test_runner_equals_the_reference_loop(hybrid_dir):
    loaded = load(ModelSource("hf", str(hybrid_dir), "m"))
    kinds = loaded.caches.kinds
    assert STATE in kinds and (KV in kinds) == (loaded.config["model_type"] != "mamba2")
    out, lps = leave_and_join(ModelRunner(loaded), (A, B, C), [12], STEPS)
    # batched float32 arithmetic differs from one row's by ~1e-3 (Nemotron-H's SSM scan);
    # a row decoding on another request's state is off by ~0.5
    assert_reference(loaded.model, out, lps, {"a": A, "b": B, "c": C}, 1e-2)


def test_end_states_come_from_the_last_two_launches(hybrid_dir):
    """The extra buffer: the worker keeps the recurrent state its last two launches left
    (the one whose result ended a request, and the chained decode after it) and copies a
    request's state at its end from there; the prompt's end is saved after a batched
    prefill of unequal rows."""
    loaded = load(ModelSource("hf", str(hybrid_dir), "m"))
    pool = StatePool(loaded.caches, state_rows(loaded.model, loaded.caches), 6)
    runner = ModelRunner(loaded, pool=KVPool(loaded.model, 64, loaded.dtype), states=pool, end_states=True)
    out: dict[str, list[int]] = {"a": [], "b": []}

    def take(rids, toks):
        for r, t in zip(rids, toks):
            out[r].append(t)

    def slot(s):
        return [a for layer in pool.snapshot(s) for a in layer]

    runner.launch(
        1,
        ForwardMode.EXTEND,
        ForwardBatch(
            ["a", "b"], [A, B], [GREEDY] * 2, [True, True], state_save_at=[[len(A)], []], state_save_slots=[[5], []]
        ),
    )
    take(*runner.finalize(1))
    assert _allclose(slot(5), reference_state(loaded, A))  # b, longer, prefilled with it: no decay through the pads
    runner.launch(2, ForwardMode.DECODE, ForwardBatch(["a", "b"]))
    runner.chain_decode(3, 2)
    take(*runner.finalize(2))
    # a ends after launch 2 (the chained launch 3 already went past it), b after launch 3
    runner.store(["a", "b"], [len(A) + 1, len(B) + 2], [[], []], [1, 2])
    take(*runner.finalize(3))
    assert _allclose(slot(1), reference_state(loaded, A + out["a"][:1]))
    assert _allclose(slot(2), reference_state(loaded, B + out["b"][:2]))
    with pytest.raises(ValueError, match="no recent state of 'a' after 3 positions"):
        runner.store(["a"], [3], [[]], [3])


def test_the_state_pool_is_allocated_by_segment_as_saves_reach_it(hybrid_dir):
    """A 40-slot pool: 14 segments of 3 ids (the last of 1), segment 0 alone at start. Saves
    that span segments (batch rows in any order) read back equal to what was saved; a segment
    is allocated by the first save into it, and a slot of one never saved into is an error."""
    loaded = load(ModelSource("hf", str(hybrid_dir), "m"))
    rows = state_rows(loaded.model, loaded.caches)
    pool = StatePool(loaded.caches, rows, 40)
    assert (pool.segment, pool.segments, pool.allocated_slots()) == (3, 14, 3)
    batch = [[mx.random.normal((4, *a.shape[1:])).astype(a.dtype) for a in layer] for layer in rows]
    mx.eval(pool.save_arrays([2, 40, 7, 3], batch, [3, 1, 0, 2]))
    assert pool.allocated_slots() == 3 + 3 + 1  # segments 0, 2 (ids 7..9) and 13 (id 40)
    for slot, row in ((2, 3), (40, 1), (7, 0), (3, 2)):
        got = pool.snapshot(slot)
        assert all(mx.array_equal(g, b[row]).item() for gl, bl in zip(got, batch) for g, b in zip(gl, bl)), slot
    with pytest.raises(ValueError, match="state slot 20 .* was never saved into"):
        pool.snapshot(20)
    with pytest.raises(ValueError, match="state slot 41 is not one of 1..40"):
        pool.save_arrays([41], batch, [0])


def reference_state(loaded, ids: list[int]) -> list[mx.array]:
    """The recurrent state of a plain mlx-lm run over `ids` (the layout `StatePool` keeps)."""
    cache = make_prompt_cache(loaded.model)
    loaded.model(mx.array(ids)[None], cache=cache)
    return [a[0] for layer in loaded.caches.state for a in cache[layer].cache]


def test_warm_up_takes_the_cached_prefix_path_through_a_state_snapshot(hybrid_dir):
    """The start-up warm-up's radix-cache path on a model with recurrent layers: the first
    row's state after half its prompt is snapshotted into state slot 1, the second row
    resumes from it after the gathered prefix; both are dropped after. Without a state pool
    it does nothing."""
    from worker_proc.model import warmup

    loaded = load(ModelSource("hf", str(hybrid_dir), "m"))
    states = StatePool(loaded.caches, state_rows(loaded.model, loaded.caches), 2)
    pool = KVPool(loaded.model, 64, loaded.dtype)
    runner = ModelRunner(loaded, pool=pool, states=states)
    prompt = list(range(1, warmup.PROMPT_TOKENS + 1))
    assert warmup.warm_pool(runner, loaded, pool, prompt, 0, states) is True
    assert runner.batch.rids == [] and not runner.partial and not runner.pending
    slot = [a for layer in states.snapshot(1) for a in layer]
    assert _allclose(slot, reference_state(loaded, prompt[: len(prompt) // 2]))
    assert warmup.warm_pool(ModelRunner(loaded, pool=pool), loaded, pool, prompt, 0) is False


def _allclose(xs: list[mx.array], ys: list[mx.array]) -> bool:
    # batched float32 arithmetic differs from one row's by ~1e-3 (see the reference-loop test)
    return len(xs) == len(ys) and all(mx.allclose(x, y, atol=2e-2, rtol=1e-2).item() for x, y in zip(xs, ys))


@pytest.mark.parametrize(
    "cache,name",
    [
        (RotatingKVCache(max_size=8, keep=4), "RotatingKVCache keeping its first 4 tokens"),
        (CacheList(ArraysCache(2), KVCache()), "CacheList"),
    ],
)
def test_a_cache_type_not_served_is_refused_naming_the_architecture(cache, name):
    model = SimpleNamespace(args=SimpleNamespace(model_type="falcon_h1"), make_cache=lambda: [KVCache(), cache])
    with pytest.raises(UnsupportedCache, match=f"architecture 'falcon_h1': cache 1 is a {name}"):
        CacheKinds.of(model)


def test_decode_captured_as_uncompiled(hybrid_dir, tokenizer):
    """The captured step (recurrent state arrays in and out of the trace beside the KV)
    gives the uncompiled step's tokens through joins, a leave and a MIXED launch."""
    from worker_proc.model.decode_graph import supports

    loaded = load(ModelSource("hf", str(hybrid_dir), "m"))
    assert supports(loaded.model)
    assert_captured_as_uncompiled(loaded, tokenizer)
