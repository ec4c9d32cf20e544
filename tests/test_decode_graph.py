"""Compiled decode (worker_proc/decode_graph.py): the capture contract (DECODE and IDLE
captured, any other mode a ValueError naming it and run uncompiled), compiled output
equal to uncompiled token for token through joins, leaves and MIXED launches, and the
shapeless traces (one per batch size across KV capacities, or a fallback to shaped ones)."""

from __future__ import annotations

from types import SimpleNamespace

import mlx.core as mx
import mlx.nn as nn
import pytest

from protocol.enums import ForwardMode
from protocol.messages import ForwardBatch, SamplingParams
from protocol.model_source import resolve_model
from tests.conftest import TINY_CONFIG, write_random_model
from tests.test_worker import GREEDY, Collector, extend, loaded, prompt_ids  # noqa: F401 (fixtures)
from worker_proc.decode_graph import CAPTURED_MODES, DecodeGraph, check_mode, supports
from worker_proc.model_loader import load
from worker_proc.model_runner import ModelRunner

SEEDED = SamplingParams(temperature=0.8, top_p=0.9, seed=7)


@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.MIXED, 9])
def test_modes_it_does_not_capture_raise_naming_the_mode(mode):
    with pytest.raises(ValueError, match=f"forward mode {mode.name if isinstance(mode, ForwardMode) else mode}"):
        check_mode(mode)


def test_captured_modes_are_decode_and_idle(loaded):
    assert CAPTURED_MODES == {ForwardMode.DECODE, ForwardMode.IDLE}
    graph = DecodeGraph(loaded.model, 8)
    assert graph.run(ForwardMode.IDLE, None, []) is None and graph.replays == 0
    with pytest.raises(ValueError, match="EXTEND"):
        graph.run(ForwardMode.EXTEND, None, [])


def test_architectures_outside_the_llama_family_are_not_captured():
    other = SimpleNamespace(args=SimpleNamespace(model_type="gpt2"))
    assert not supports(other)
    with pytest.raises(ValueError, match="gpt2"):
        DecodeGraph(other, 8)


def drive(runner: ModelRunner, prompts: list[list[int]], steps: int) -> dict[str, list[int]]:
    """a prefills; b and c join after 3 steps (c seeded); a leaves after 8 steps; then d
    prefills in a MIXED launch beside b and c; decode `steps` in all."""
    launch = Collector(runner)
    launch(ForwardMode.EXTEND, extend(["a"], [prompts[0]]))
    for step in range(steps):
        if step == 3:
            launch(ForwardMode.EXTEND, extend(["b", "c"], prompts[1:3], [GREEDY, SEEDED]))
        if step == 8:
            runner.abort(["a"])
        if step == 10:
            rids = list(runner.batch.rids)
            launch(ForwardMode.MIXED, ForwardBatch(rids + ["d"], [[]] * len(rids) + [prompts[0][:20]],
                                                   [None] * len(rids) + [GREEDY], [True] * (len(rids) + 1)))
        launch(ForwardMode.DECODE, ForwardBatch(list(runner.batch.rids)))
    return launch.out


def test_compiled_decode_equals_uncompiled_through_joins_leaves_and_mixed(loaded, prompt_ids):
    plain = drive(ModelRunner(loaded), prompt_ids, 16)
    graph = DecodeGraph(loaded.model, 8)
    compiled = drive(ModelRunner(loaded, graph=graph), prompt_ids, 16)
    assert compiled == plain
    assert graph.replays == 16  # every DECODE launch, none of the EXTEND or MIXED ones
    assert len(plain["a"]) == 9 and len(plain["d"]) == 7


def test_batches_over_the_limit_run_uncompiled(loaded, prompt_ids):
    graph = DecodeGraph(loaded.model, 2)
    runner = ModelRunner(loaded, graph=graph)
    runner.launch(1, ForwardMode.EXTEND, extend(["a", "b", "c"], prompt_ids))
    runner.finalize(1)
    runner.launch(2, ForwardMode.DECODE, ForwardBatch(["a", "b", "c"]))
    runner.finalize(2)
    assert graph.replays == 0
    runner.abort(["c"])  # its row stays, free: the step still computes 3 rows
    runner.launch(3, ForwardMode.DECODE, ForwardBatch(["a", "b"]))
    runner.finalize(3)
    assert graph.replays == 0 and runner.batch.size == 3
    runner.abort(["b"])  # 2 of 3 rows free: compacted to 1
    runner.launch(4, ForwardMode.DECODE, ForwardBatch(["a"]))
    runner.finalize(4)
    assert graph.replays == 1 and runner.batch.size == 1


class SliceFreeRoPE(nn.Module):
    """Rotate-half RoPE written without slicing (the rotation as a product with a
    [dims, dims] permutation matrix), so a shapeless trace can replay it; MLX's CPU RoPE
    slices. x: [B, heads, L, dims]; offset: int or int [B]."""

    def __init__(self, dims: int, base: float = 10000.0) -> None:
        super().__init__()
        half = dims // 2
        inv_freq = base ** (-mx.arange(0, dims, 2, dtype=mx.float32) / dims)
        self._inv_freq = mx.concatenate([inv_freq, inv_freq])
        eye, zero = mx.eye(half), mx.zeros((half, half))
        self._rotate = mx.concatenate([mx.concatenate([zero, eye], 1), mx.concatenate([-eye, zero], 1)], 0)
        mx.eval(self._inv_freq, self._rotate)  # constants, not graphs a trace would take in

    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        batched = isinstance(offset, mx.array) and offset.ndim == 1
        pos = mx.arange(x.shape[2], dtype=mx.float32) + (offset[:, None] if batched else offset)
        angle = pos[..., None] * self._inv_freq
        if batched:
            angle = mx.expand_dims(angle, 1)
        return (x * mx.cos(angle) + (x @ self._rotate.astype(x.dtype)) * mx.sin(angle)).astype(x.dtype)


@pytest.fixture(scope="module")
def shapeless_model(tmp_path_factory, tokenizer):
    """The tiny llama with as many KV heads as heads (MLX's CPU attention broadcasts grouped
    KV heads at a fixed shape) and `SliceFreeRoPE`: a model whose decode step MLX can trace
    shapeless on the CPU, as it traces the stock layers on a GPU."""
    config = dict(TINY_CONFIG, num_key_value_heads=TINY_CONFIG["num_attention_heads"])
    loaded = load(resolve_model(str(write_random_model(tmp_path_factory.mktemp("mha-llama"), tokenizer, config))))
    for layer in loaded.model.model.layers:
        layer.self_attn.rope = SliceFreeRoPE(layer.self_attn.rope.dims)
    return loaded


def test_a_shapeless_trace_serves_every_kv_capacity_of_its_batch_size(shapeless_model, prompt_ids):
    plain = drive(ModelRunner(shapeless_model), prompt_ids, 40)
    graph = DecodeGraph(shapeless_model.model, 8, step=24, shapeless=True)  # off mlx-lm's 256 grid: regrown at once
    traced = []
    forward = graph._forward
    graph._forward = lambda *inputs: traced.append(inputs[0].shape[0]) or forward(*inputs)
    compiled = drive(ModelRunner(shapeless_model, graph=graph), prompt_ids, 40)
    assert compiled == plain
    assert graph.shapeless and graph.replays == 40
    assert len(graph._positions) >= 3  # the batch crossed at least two KV capacities
    assert sorted(traced) == sorted(graph._per_batch)  # one trace per batch size, none per capacity


def test_a_model_that_cannot_trace_shapeless_falls_back_to_a_trace_per_capacity(loaded, prompt_ids):
    plain = drive(ModelRunner(loaded), prompt_ids, 16)
    graph = DecodeGraph(loaded.model, 8, shapeless=True)  # MLX's CPU RoPE slices
    with pytest.warns(UserWarning, match="shapeless trace failed"):
        compiled = drive(ModelRunner(loaded, graph=graph), prompt_ids, 16)
    assert compiled == plain
    assert not graph.shapeless and graph.replays == 16
