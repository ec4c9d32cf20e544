"""Mixture-of-experts families (issue 41, item 5), in this process: Qwen3-MoE, Mixtral,
GLM-4-MoE and DeepSeek-V3 (multi-head latent attention: a cache of a latent and a RoPE key
of two sizes, which the KV pool keeps per layer as the model does) are served token for
token like mlx-lm's own loop through batched prefill of unequal prompts, chunked prefill,
a MIXED launch, chained decodes and a join into a freed row, and a cached prefix gathered
from the pool; their captured decode step gives the uncompiled step's tokens."""

from __future__ import annotations

import pytest

from protocol.config import ModelSource
from protocol.enums import ForwardMode
from protocol.messages import ForwardBatch
from tests.support.tiny_model import MOE_FAMILIES, write_random_model
from tests.support.worker_runs import (
    LOGPROB_GREEDY,
    Collector,
    assert_captured_as_uncompiled,
    assert_reference,
    leave_and_join,
)
from worker_proc.memory.kv_pool import KVPool, kv_shapes
from worker_proc.model.decode_graph import CAPTURED_FAMILIES
from worker_proc.model.loader import load
from worker_proc.model.runner import ModelRunner

A, B, C = list(range(10, 17)), list(range(100, 121)), [(7 * i) % 900 + 30 for i in range(20)]


@pytest.fixture(scope="module", params=sorted(MOE_FAMILIES))
def moe_model(request, tokenizer, tmp_path_factory):
    path = write_random_model(tmp_path_factory.mktemp(request.param), tokenizer, MOE_FAMILIES[request.param])
    return load(ModelSource("hf", str(path), "m"))


def test_runner_equals_the_reference_loop(moe_model):
    out, lps = leave_and_join(ModelRunner(moe_model), (A, B, C), [12], 8)
    assert_reference(moe_model.model, out, lps, {"a": A, "b": B, "c": C}, 2e-3)


def test_a_cached_prefix_is_gathered_from_the_pool(moe_model):
    """b's prompt starts with a's first 16 tokens, whose KV a stored: b prefills the rest
    after them and answers like the reference loop."""
    if moe_model.config["model_type"] == "deepseek_v3":
        heads, k_dim, v_dim = kv_shapes(moe_model.model)[0]
        assert (heads, k_dim, v_dim) == (1, 32, 8)  # the latent and the RoPE key
    runner = ModelRunner(moe_model, pool=KVPool(moe_model.model, 64, moe_model.dtype))
    launch = Collector(runner)
    launch(ForwardMode.EXTEND, ForwardBatch(["a"], [B], [LOGPROB_GREEDY], [True]))
    runner.store(["a"], [0], [list(range(1, 17))])
    runner.abort(["a"])
    launch(ForwardMode.EXTEND, ForwardBatch(["b"], [C], [LOGPROB_GREEDY], [True], prefix_slots=[list(range(1, 17))]))
    for _ in range(5):
        launch(ForwardMode.DECODE, ForwardBatch(["b"]))
    assert_reference(moe_model.model, {"b": launch.out["b"]}, {"b": launch.lps["b"]}, {"b": B[:16] + C}, 2e-3)


def test_decode_captured_as_uncompiled(moe_model, tokenizer):
    """The captured step of a mixture-of-experts family gives the uncompiled step's tokens
    through joins, a leave and a MIXED launch (greedy and seeded rows)."""
    loaded = moe_model
    assert loaded.config["model_type"] in CAPTURED_FAMILIES
    assert_captured_as_uncompiled(loaded, tokenizer)
