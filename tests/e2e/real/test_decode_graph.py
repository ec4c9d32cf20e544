"""Compiled decode (worker_proc/model/decode_graph.py): the capture contract (DECODE and IDLE
captured, any other mode a ValueError naming it and run uncompiled), and compiled output
equal to uncompiled token for token through joins, leaves and MIXED launches.

These tests run on the default model loaded in this process (`loaded`); the others of
the module: tests/unit/test_decode_graph.py."""

from __future__ import annotations

import pytest

from protocol.enums import ForwardMode
from protocol.messages import ForwardBatch
from tests.support.worker_runs import Collector, drive, extend
from worker_proc.model.decode_graph import CAPTURED_MODES, DecodeGraph
from worker_proc.model.runner import ModelRunner


def test_captured_modes_are_decode_and_idle(loaded):
    assert {ForwardMode.DECODE, ForwardMode.IDLE} == CAPTURED_MODES
    graph = DecodeGraph(loaded.model, 8)
    assert graph.run(ForwardMode.IDLE, None, []) is None and graph.replays == 0
    with pytest.raises(ValueError, match="EXTEND"):
        graph.run(ForwardMode.EXTEND, None, [])


@pytest.mark.parametrize("select_write, step", [(False, None), (True, 16)], ids=["slice-update", "select-grid16"])
def test_compiled_decode_equals_uncompiled_through_joins_leaves_and_mixed(loaded, prompt_ids, select_write, step):
    """Both ways of writing the KV (the CPU's slice update, a GPU's select) and a capacity
    grid that the steps cross; the buffers are the smallest of the grid with room for the
    next position (a prefill's 256 positions shrunk, not read by every step)."""
    plain = drive(ModelRunner(loaded), prompt_ids, 16)
    graph = DecodeGraph(loaded.model, 8, step)
    graph.select_write = select_write
    runner = ModelRunner(loaded, graph=graph)
    compiled = drive(runner, prompt_ids, 16)
    assert compiled == plain
    assert graph.replays == 16  # every DECODE launch, none of the EXTEND or MIXED ones
    assert len(plain["a"]) == 9 and len(plain["d"]) == 7
    if step:
        index = runner.batch.cache[0]._idx
        assert index > 2 * step  # crossed the grid more than once
        assert {c.keys.shape[2] for c in runner.batch.cache} == {(index - 1) // step * step + step}


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


def lazy_ops(a, tmp_path) -> int:
    """Primitives MLX would still run to compute `a` (its unevaluated graph, counted in the
    DOT file `mx.export_to_dot` writes)."""
    import mlx.core as mx

    dot = tmp_path / "graph.dot"
    mx.export_to_dot(str(dot), a)
    return dot.read_text().count("shape=rectangle")


def test_captured_steps_leave_no_growing_lazy_state(loaded, prompt_ids, tmp_path):
    """Every layer's cache offset is what the next captured step reads, so none of them grows
    a lazy chain one node longer every step while the batch runs (through a join, too)."""
    runner = ModelRunner(loaded, graph=DecodeGraph(loaded.model, 8))
    launch = Collector(runner)
    launch(ForwardMode.EXTEND, extend(["a"], [prompt_ids[0]]))
    for step in range(24):
        if step == 4:
            launch(ForwardMode.EXTEND, extend(["b"], [prompt_ids[1]]))
        launch(ForwardMode.DECODE, ForwardBatch(list(runner.batch.rids)))
    sizes = [lazy_ops(c.offset, tmp_path) for c in runner.batch.cache]
    assert len(sizes) == loaded.num_layers and max(sizes) <= 2, sizes


def test_joins_into_free_rows_leave_no_growing_lazy_padding(loaded, prompt_ids, tmp_path):
    """A request joining into a free row writes its left padding into every layer's cache;
    a captured step reads the first layer's only, so the others must share it, or each join
    leaves them one more lazy node that no step evaluates, for as long as the batch runs
    (a long request with short ones coming and going)."""
    runner = ModelRunner(loaded, graph=DecodeGraph(loaded.model, 8))
    launch = Collector(runner)
    launch(ForwardMode.EXTEND, extend(["a"], [prompt_ids[0] * 2]))
    for k in range(6):
        launch(ForwardMode.EXTEND, extend([f"b{k}"], [prompt_ids[1][:8]]))
        assert runner.batch.size == 2  # b's row is reused: a fill, not an append
        for _ in range(2):
            launch(ForwardMode.DECODE, ForwardBatch(list(runner.batch.rids)))
        runner.abort([f"b{k}"])
    sizes = [lazy_ops(c.left_padding, tmp_path) for c in runner.batch.cache]
    assert len(sizes) == loaded.num_layers and max(sizes) <= 2, sizes
