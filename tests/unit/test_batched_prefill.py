"""Batched prefill (worker_proc/model/batched_prefill.py): grouping by length, and new requests of
one extend launch (fresh, with cached prefixes of different lengths, continuing a chunk)
prefilled together give the tokens each gives alone.

The tests on the default model loaded in this process (`loaded`), too slow for the
fast loop: tests/e2e/real/test_batched_prefill.py."""

from __future__ import annotations

from worker_proc.model.batched_prefill import plan_groups
from worker_proc.model.shape_warmup import row_buckets
from worker_proc.shapes import shape_bucket


def test_groups_keep_padding_bounded_and_cover_every_row():
    assert plan_groups([5, 1500, 7, 6, 1400]) == [[0, 2, 3], [1, 4]]
    assert plan_groups([43] * 64) == [list(range(64))]
    assert plan_groups([]) == []
    lengths = [3, 900, 40, 41, 2000, 10, 12, 600]
    groups = plan_groups(lengths, waste=0.25, slack=64)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for g in groups:
        real = sum(lengths[i] for i in g)
        assert len(g) * max(lengths[i] for i in g) <= 1.25 * real + 64


def test_shape_buckets_are_powers_of_two_up_to_64_then_pad_at_most_half():
    assert [shape_bucket(n, 1) for n in (1, 2, 3, 5, 9, 13, 17, 33, 49, 64, 65, 97)] == [
        1,
        2,
        4,
        8,
        16,
        16,
        32,
        64,
        64,
        64,
        96,
        128,
    ]
    assert [shape_bucket(n, 16) for n in (1, 16, 17, 19, 24, 43, 300, 2048)] == [16, 16, 32, 32, 32, 64, 384, 2048]
    assert all(n <= shape_bucket(n, 16) <= max(16, 2 * n if n <= 64 else 1.5 * n) for n in range(1, 3000))
    assert row_buckets(64) == [1, 2, 4, 8, 16, 32, 64]


def test_a_short_chat_turn_meets_only_warmed_shapes():
    """A 43-token chat prompt whose 24-token template head is cached (and the same prompt
    sent again, all but its last token cached), in launches of 1 to 64 rows: every
    (rows, width, cached width) the prefill pads them to is one the warm-up prepares."""
    from worker_proc.model import shape_warmup

    warmed = {(r, w, c) for r in row_buckets(64) for w in shape_warmup.WIDTHS for c in shape_warmup.CACHED_WIDTHS}
    for rows in range(1, 65):
        for new, cached in ((19, 24), (43, 0), (1, 42)):
            assert (shape_bucket(rows, 1), shape_bucket(new, 16), shape_bucket(cached, 16) if cached else 0) in warmed


def test_shape_warm_up_does_nothing_on_the_cpu_and_every_bucket_on_a_gpu(tiny_model_dir, monkeypatch):
    """On the tiny model: what is counted (model calls, graph replays) does not depend on the
    model, and the default one takes seconds per bucket on the CPU."""
    from protocol.config import ModelSource
    from worker_proc.model import shape_warmup
    from worker_proc.model.decode_graph import DecodeGraph
    from worker_proc.model.loader import load

    tiny = load(ModelSource("hf", str(tiny_model_dir), "tiny"))
    graph = DecodeGraph(tiny.model, 3)
    assert shape_warmup.warm_shapes(tiny, graph, 3) == 0 and graph.replays == 0
    monkeypatch.setattr(shape_warmup, "buckets_on", lambda: True)
    calls = shape_warmup.warm_shapes(tiny, graph, 3)
    assert calls == 3 * len(shape_warmup.CACHED_WIDTHS) * len(shape_warmup.WIDTHS) + 3
    assert graph.replays == 3
