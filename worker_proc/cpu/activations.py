"""SwiGLU on the CPU backend with an `exp` built from MLX's fast arithmetic.

MLX's CPU backend computes transcendental functions elementwise at 36-60 M elements/s on
a 2-core x86 machine (`mx.exp`, `mx.sigmoid`, `nn.silu`), against 1,100-1,900 M for
`mx.add` and `mx.multiply` (docs/PERFORMANCE.md, "TTFT at 16 streams on this CPU"). SwiGLU's
SiLU over every MLP's activations is then about a quarter of a short prefill's MLP time and
7-10% of a 16-row decode step. Written as a polynomial over vectorized arithmetic and fused
by `mx.compile` into one loop, the same SiLU takes a fifth of the time.

The `exp` is the textbook range reduction (Cody and Waite, "Software Manual for the
Elementary Functions", 1980): ``exp(x) = 2^n * exp(r)`` with ``n = round(x / ln 2)`` and
``r = x - n ln 2``, computed in two parts (a high part of ln 2 with 15 significant bits,
whose product with any |n| <= 128 is exact in float32, then the remainder) so that
``|r| <= ln(2) / 2`` carries no cancellation error. ``exp(r)`` is its Taylor polynomial of
degree 6 (truncation error at most (ln(2)/2)^7 / 7! / exp(-ln(2)/2) = 1.7e-7 relative), and
``2^n`` is written straight into a float32's exponent bits. Maximum relative error of the
SiLU against float64: 2.7e-7 (MLX's `nn.silu`: 9.0e-7).

mlx-lm's models call the `swiglu` their module imported from `mlx_lm.models.activations`;
`install` points that name, in the modules that define the model's classes, at
`fast_swiglu`. It changes nothing on a GPU (where the fused kernels are fast) or for weights
other than float32.
"""

from __future__ import annotations

import sys

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import activations

from worker_proc.shapes import shape_bucket

_LOG2E = 1.4426950408889634
_LN2_HI = 0.693145751953125  # ln 2 to 15 significant bits: n * _LN2_HI is exact for |n| <= 128
_LN2_LO = 1.4286068202862268e-06  # ln 2 - _LN2_HI
# float32 exp overflows above 88.72 and is subnormal below -87.33; clipped there, 2^n stays normal
_X_MIN, _X_MAX = -87.0, 88.0


def fast_exp(x: mx.array) -> mx.array:
    """``exp(x)`` for a float32 array of any shape, relative error < 3e-7 for x in
    [-87, 88]; inputs outside are clipped to that interval (so ``exp(-100)`` is 1.6e-38, not
    3.7e-44, and large inputs give 1.65e38, not inf). NaN gives NaN."""
    x = mx.clip(x, _X_MIN, _X_MAX)
    n = mx.floor(x * _LOG2E + 0.5)
    r = (x - n * _LN2_HI) - n * _LN2_LO
    p = 1.0 + r * (1.0 + r * (1 / 2 + r * (1 / 6 + r * (1 / 24 + r * (1 / 120 + r * (1 / 720))))))
    two_n = ((n.astype(mx.int32) + 127) << 23).view(mx.float32)
    return p * two_n


@mx.compile
def _fast_swiglu(gate: mx.array, x: mx.array) -> mx.array:
    # compiled per shape: `view` cannot be traced shapelessly
    return gate / (1.0 + fast_exp(-gate)) * x


MIN_FLAT = 1024
"""Smallest padded length (elements) `fast_swiglu` computes over."""


def fast_swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """``silu(gate) * x`` (mlx-lm's `swiglu`), both ``[..., N]``; float32 through
    `fast_exp`, any other dtype through mlx-lm's own function.

    The compiled function keeps one trace per input shape (about 48 KB each on the CPU). A
    decode step's shape, ``[rows, 1, N]``, has as many values as there are batch sizes, but a
    CPU server meets a new prefill shape with nearly every prompt length: those inputs are
    flattened and zero-padded to `shapes.shape_bucket` lengths (powers of two and
    their 3/4 points), so prefills add a few dozen shapes whatever is served. The padding and
    its copies cost about half the gain there (304 x 1,536 values: 6.1 ms against 3.4 unpadded
    and 9.2 for `nn.silu`)."""
    if gate.dtype != mx.float32 or x.dtype != mx.float32:
        return activations.swiglu(gate, x)
    if gate.ndim < 2 or gate.shape[-2] == 1:  # one position per row: a decode step
        return _fast_swiglu(gate, x)
    n = gate.size
    size = shape_bucket(n, MIN_FLAT)
    flat = [mx.pad(a.reshape(-1), (0, size - n)) for a in (gate, x)]
    return _fast_swiglu(*flat)[:n].reshape(gate.shape)


def install(model: nn.Module) -> list[str]:
    """On the CPU device, point ``swiglu`` at `fast_swiglu` in each module that defines one
    of `model`'s classes and imported mlx-lm's `activations.swiglu`. Process-wide (a model
    class's module is shared); meant for the worker, which serves one model. Returns the
    names of the modules changed (empty on a GPU)."""
    if mx.default_device() != mx.cpu:
        return []
    changed = []
    for name in sorted({type(m).__module__ for m in model.modules()}):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "swiglu", None) is activations.swiglu:
            module.swiglu = fast_swiglu
            changed.append(name)
    return changed
