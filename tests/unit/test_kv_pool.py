"""`KVPool` in segments allocated as stores reach them: gathers and stores across
segments equal a dense pool, only the segments written hold memory, bad slots are errors.

The tests on the default model loaded in this process (`loaded`), too slow for the
fast loop: tests/e2e/real/test_kv_pool.py."""

from __future__ import annotations

from worker_proc.memory import kv_pool


def test_segment_size_follows_the_pool_size():
    assert kv_pool.segment_slots(100) == kv_pool.MIN_SEGMENT_SLOTS
    assert kv_pool.segment_slots(99_345) == 6_210  # ceil(99,345 / 16)
    assert kv_pool.segment_slots(16 * 10_000) == 10_000
