"""Projections of one input fused into one matrix product (vLLM's QKV / gate-up merging).

An attention's ``q_proj``, ``k_proj`` and ``v_proj`` (and an MLP's ``gate_proj`` and
``up_proj``) read the same hidden state: ``x [..., D] @ W_i.T [D, N_i]``. Concatenating the
weights along the output axis, ``W = [W_q; W_k; W_v]`` of shape ``[N_q + N_k + N_v, D]``, gives
all of them in one product whose column slices are the separate outputs. On a GPU a decode
step is bound by dispatching its kernels (docs/PERFORMANCE.md, "Step profile"), so three
products become one launch.

The model's own code is unchanged: each projection attribute is replaced by a `FusedPart`
that the model calls as before. The first part called with an input computes the fused
product; the others called with the *same array object* slice it. A part called with any
other input computes the product for that input, so the outputs equal the separate products
(up to the floating-point order of the product's kernel) whatever order or inputs the
model's code uses. The product is dropped once every part has read it.
"""

from __future__ import annotations

import copy

import mlx.core as mx
import mlx.nn as nn

# groups of attribute names read from one input, fused when a module has all of them
GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class FusedProduct:
    """The concatenated projection and the product of the last input it saw.

    linear: an `nn.Linear` or `nn.QuantizedLinear` of output size ``sum(sizes)``; sizes: the
    parts' output sizes, in order. Not an `nn.Module`, so the weight appears once in the
    model's parameter tree (under the first part)."""

    def __init__(self, linear: nn.Module, sizes: list[int]):
        self.linear = linear
        self.bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        self._x: mx.array | None = None
        self._y: mx.array | None = None
        self._read: set[int] = set()

    def part(self, x: mx.array, i: int) -> mx.array:
        """Part `i` of ``linear(x)``: ``[..., sizes[i]]``, same dtype as the product."""
        if self._x is not x:
            self._x, self._y, self._read = x, self.linear(x), set()
        y = self._y[..., self.bounds[i] : self.bounds[i + 1]]
        self._read.add(i)
        if len(self._read) == len(self.bounds) - 1:
            self._x = self._y = None
        return y


class FusedPart(nn.Module):
    """Stands where one of the fused projections stood; ``part(x) == old_projection(x)``.
    The first part of a group holds the fused weight as its child ``fused``."""

    def __init__(self, product: FusedProduct, index: int):
        super().__init__()
        if index == 0:
            self.fused = product.linear
        self._product = product
        self._index = index

    def __call__(self, x: mx.array) -> mx.array:
        return self._product.part(x, self._index)


def _concat(linears: list[nn.Module]) -> nn.Module | None:
    """One layer whose output is the concatenation of `linears`' outputs, or None when they
    cannot be concatenated (other classes, input sizes, bias presence or quantization)."""
    kinds = {type(m) for m in linears}
    if len(kinds) != 1 or kinds.pop() not in (nn.Linear, nn.QuantizedLinear):
        return None
    first = linears[0]
    keys = sorted(first.keys())
    if any(sorted(m.keys()) != keys for m in linears):
        return None
    if isinstance(first, nn.QuantizedLinear) and any(
        (m.group_size, m.bits, m.mode) != (first.group_size, first.bits, first.mode) for m in linears
    ):
        return None
    if any(m.weight.shape[1:] != first.weight.shape[1:] or m.weight.dtype != first.weight.dtype for m in linears):
        return None
    fused = copy.copy(first)
    for key in keys:
        setattr(fused, key, mx.concatenate([m[key] for m in linears], axis=0))
    return fused


def fuse_projections(model: nn.Module) -> int:
    """Replace each group of `GROUPS` found on a module of `model` by `FusedPart`s of one
    fused product, in place; evaluates the concatenated weights and frees the old ones.
    Returns the number of groups fused (0 where none can be)."""
    count = 0
    for _, module in model.named_modules():
        for names in GROUPS:
            linears = [module.get(n) if isinstance(module, dict) else None for n in names]
            if any(not isinstance(m, nn.Module) for m in linears):
                continue
            fused = _concat(linears)
            if fused is None:
                continue
            mx.eval(fused.parameters())
            product = FusedProduct(fused, [m.weight.shape[0] for m in linears])
            for i, name in enumerate(names):
                setattr(module, name, FusedPart(product, i))
            count += 1
    return count
