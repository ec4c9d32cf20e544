"""The CPU's polynomial exp and SwiGLU (`worker_proc.cpu.activations`): accuracy against
float64, the fallback for other dtypes, and greedy tokens of the default model unchanged.

The tests on the default model loaded in this process (`loaded`), too slow for the
fast loop: tests/e2e/real/test_cpu_activations.py."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import activations

from worker_proc.cpu import activations as cpu_activations
from worker_proc.cpu.activations import fast_exp, fast_swiglu


def _rel_err(got: mx.array, want: np.ndarray) -> float:
    got = np.array(got, dtype=np.float64)
    return float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-300)))


def test_fast_exp_is_accurate_over_the_float32_range():
    x = np.concatenate([np.linspace(-87, 88, 200_001), [0.0, -0.0, 1e-30, -1e-30, 0.34657359, -0.34657359]])
    got = fast_exp(mx.array(x.astype(np.float32)))
    assert got.dtype == mx.float32
    assert _rel_err(got, np.exp(x.astype(np.float32).astype(np.float64))) < 4e-7
    assert float(fast_exp(mx.array([0.0]))[0]) == 1.0


def test_fast_exp_clips_outside_the_range_and_keeps_nan():
    got = np.array(fast_exp(mx.array([-1000.0, 1000.0, float("nan")])))
    assert got[0] == pytest.approx(np.exp(-87.0), rel=1e-6)
    assert got[1] == pytest.approx(np.exp(88.0), rel=1e-6)
    assert np.isfinite(got[:2]).all() and np.isnan(got[2])


def test_fast_swiglu_matches_silu_on_strided_inputs():
    both = mx.random.normal((7, 2 * 300), key=mx.random.key(1)) * 6  # gate and up as slices of one product
    gate, up = both[:, :300], both[:, 300:]
    g = np.array(gate, dtype=np.float64)
    want = g / (1 + np.exp(-g)) * np.array(up, dtype=np.float64)
    got = fast_swiglu(gate, up)
    assert got.shape == (7, 300) and got.dtype == mx.float32
    assert _rel_err(got, want) < 1e-6
    assert _rel_err(activations.swiglu(gate, up), want) < 2e-6  # MLX's own, for scale


def test_fast_swiglu_leaves_other_dtypes_to_mlx_lm():
    gate = mx.random.normal((4, 64), key=mx.random.key(2)).astype(mx.bfloat16)
    up = mx.random.normal((4, 64), key=mx.random.key(3)).astype(mx.bfloat16)
    got = fast_swiglu(gate, up)
    assert got.dtype == mx.bfloat16
    assert mx.array_equal(got, activations.swiglu(gate, up)).item()


def test_fast_swiglu_meets_few_shapes_whatever_the_input_shape(monkeypatch):
    """A prefill's input (several positions per row) reaches the compiled function as a
    padded flat length from `shape_bucket` (powers of two and their 3/4 points), so its
    per-shape traces stay few; a decode step's [rows, 1, N] goes as it is."""
    from worker_proc.shapes import shape_bucket

    seen = []
    compiled = cpu_activations._fast_swiglu
    monkeypatch.setattr(cpu_activations, "_fast_swiglu", lambda g, x: seen.append(g.shape) or compiled(g, x))
    for rows in range(1, 200, 7):
        gate = mx.random.normal((rows, 3, 300), key=mx.random.key(rows)) * 6
        up = mx.random.normal((rows, 3, 300), key=mx.random.key(rows + 1))
        got = fast_swiglu(gate, up)
        assert got.shape == gate.shape
        assert mx.array_equal(got, compiled(gate, up)).item()  # the padding changes no value
    buckets = {(shape_bucket(n, cpu_activations.MIN_FLAT),) for n in range(1, 200 * 900, 900)}
    assert set(seen) <= buckets and len(set(seen)) < len(seen) == 29
    seen.clear()
    decode = mx.ones((5, 1, 300))
    assert mx.array_equal(fast_swiglu(decode, decode), compiled(decode, decode)).item()
    assert seen == [(5, 1, 300)]
