"""`shape_bucket`: the padded sizes of the shapes compiled kernels see, shared by the batched
prefill (rows and widths) and the CPU activations (flat lengths), so that few distinct
shapes exist and the warm-up can prepare them all."""

from __future__ import annotations

COARSE_UP_TO = 64
"""Sizes up to this are padded to powers of two only: a GPU runs a call of at most 64 rows
of at most 64 tokens in about the same time padded or not, and every extra shape is one
more to prepare (about 100 ms each, in some request's time to first token unless the
warm-up made it: a 19-token chat turn after a 24-token cached template head met (rows,
24, 24), which the warm-up's 16/32/64 widths did not cover)."""


def shape_bucket(n: int, floor: int) -> int:
    """The padded size of `n`: the smallest of `floor` and the powers of two above it that is
    at least n, up to `COARSE_UP_TO`; above it also their 3/4 points (..., 64, 96, 128, 192,
    ...), so at most 1.5 x n when n > `COARSE_UP_TO` (2 x n below)."""
    if n <= floor:
        return floor
    power = 1 << (n - 1).bit_length()
    return power * 3 // 4 if n <= power * 3 // 4 and power > COARSE_UP_TO else power
