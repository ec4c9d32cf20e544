"""`KVPool` in segments allocated as stores reach them: gathers and stores across
segments equal a dense pool, only the segments written hold memory, bad slots are errors.

These tests run on the default model loaded in this process (`loaded`); the others of
the module: tests/unit/test_kv_pool.py."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from worker_proc.memory import kv_pool
from worker_proc.memory.kv_pool import KVPool, split_by_segment


@pytest.fixture
def small_segments(monkeypatch):
    """Segments of 8 slot ids, so a 64-slot pool has 8 (ids 1..64)."""
    monkeypatch.setattr(kv_pool, "MIN_SEGMENT_SLOTS", 8)
    monkeypatch.setattr(kv_pool, "MAX_SEGMENTS", 100)


def random_kv(rng, layers: int, n: int, heads: int, dim: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [
        (
            rng.standard_normal((n, heads, dim)).astype(np.float32),
            rng.standard_normal((n, heads, dim)).astype(np.float32),
        )
        for _ in range(layers)
    ]


def test_stores_and_gathers_across_segments_equal_a_dense_pool(loaded, small_segments):
    pool = KVPool(loaded.model, 64, mx.float32)
    shapes = kv_pool.kv_shapes(loaded.model)
    (heads, dim, _), layers = shapes[0], len(shapes)
    assert pool.segment == 8 and len(pool.keys[0]) == 8
    assert pool.allocated_slots() == 8  # segment 0 (ids 1..8) only, at start
    dense_k = np.zeros((layers, 65, heads, dim), np.float32)
    dense_v = np.zeros_like(dense_k)
    rng = np.random.default_rng(0)
    stores = [[3, 4, 5], [17, 2, 40, 41, 6], [64, 63, 1]]  # segments 0; 2, 0, 4, 5, 0; 7, 7, 0
    for slots in stores:
        kv = random_kv(rng, layers, len(slots), heads, dim)
        pool.store(slots, [(mx.array(k), mx.array(v)) for k, v in kv])
        for layer, (k, v) in enumerate(kv):
            dense_k[layer, slots], dense_v[layer, slots] = k, v
    assert [s for s, a in enumerate(pool.keys[0]) if a is not None] == [0, 2, 4, 5, 7]
    assert pool.allocated_slots() == 8 * 5
    rows = [[40, 2, 64], [], [5], [17, 3, 41, 63, 1, 6]]  # rows over several segments, left-padded
    width = 7
    got = pool.gather_rows(rows, width)
    ids = np.array([[0] * (width - len(r)) + r for r in rows])
    for layer, (k, v) in enumerate(got):
        assert k.shape == (len(rows), heads, width, dim)
        np.testing.assert_array_equal(np.array(k), dense_k[layer][ids].transpose(0, 2, 1, 3))
        np.testing.assert_array_equal(np.array(v), dense_v[layer][ids].transpose(0, 2, 1, 3))
    one = pool.gather([4, 5])  # within one segment: one indexing
    np.testing.assert_array_equal(np.array(one[3][0]), dense_k[3][[4, 5]][None].transpose(0, 2, 1, 3))
    padded = [[40, 41], [], [41]]  # segments 4 and 5, padding: row 0 of segment 4
    assert [s for s, _, _ in split_by_segment(np.array([[0, 40, 41], [0, 0, 0], [0, 0, 41]]), pool.segment)] == [4, 5]
    left = [[17], [], [18, 17]]  # one segment (2), padded: one indexing
    assert [s for s, _, _ in split_by_segment(np.array([[0, 17], [0, 0], [18, 17]]), pool.segment)] == [2]
    for rows in (padded, left):
        ids = np.array([[0] * (2 - len(r)) + r for r in rows])
        k, v = pool.gather_rows(rows, 2)[5]
        np.testing.assert_array_equal(np.array(k), dense_k[5][ids].transpose(0, 2, 1, 3))
        np.testing.assert_array_equal(np.array(v), dense_v[5][ids].transpose(0, 2, 1, 3))


def test_bad_slots_are_errors_and_change_nothing(loaded, small_segments):
    pool = KVPool(loaded.model, 64, mx.float32)
    shapes = kv_pool.kv_shapes(loaded.model)
    (heads, dim, _), layers = shapes[0], len(shapes)
    kv = [(mx.ones((1, heads, dim)), mx.ones((1, heads, dim)))] * layers
    for slot in (0, 65, -1):
        with pytest.raises(ValueError, match="slot"):
            pool.store([slot], kv)
    with pytest.raises(ValueError, match="never stored"):
        pool.gather([30])  # segment 3: nothing was stored there
    with pytest.raises(ValueError, match="not all pool slots"):
        pool.gather([65])
    assert pool.allocated_slots() == 8


def test_a_pool_of_the_default_size_allocates_one_segment_at_start(loaded):
    """The default model's CPU pool (99,345 slots, 4.3 GB whole) holds 6,210 slots' worth at
    start: under 300 MB."""
    pool = KVPool(loaded.model, 99_345, loaded.dtype)
    per_token = kv_pool.bytes_per_token(loaded.model, loaded.dtype)
    assert pool.allocated_slots() == 6_210
    assert sum(a.nbytes for a in pool.arrays()) == 6_211 * per_token < 300 * 2**20  # and its zero row
