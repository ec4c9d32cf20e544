"""Compiled decode (worker_proc/model/decode_graph.py): the capture contract (DECODE and IDLE
captured, any other mode a ValueError naming it and run uncompiled), and compiled output
equal to uncompiled token for token through joins, leaves and MIXED launches.

The families captured besides the default model's are checked here on tiny random models;
the tests on the default model loaded in this process (`loaded`), too slow for the fast
loop: tests/e2e/real/test_decode_graph.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from protocol.config import ModelSource
from protocol.enums import ForwardMode
from tests.support.tiny_model import MOE_FAMILIES, write_random_model
from tests.support.worker_runs import PROMPTS, drive
from worker_proc.model.decode_graph import CAPTURED_FAMILIES, DecodeGraph, check_mode, supports
from worker_proc.model.loader import load
from worker_proc.model.runner import ModelRunner


@pytest.mark.parametrize("mode", [ForwardMode.EXTEND, ForwardMode.MIXED, 9])
def test_modes_it_does_not_capture_raise_naming_the_mode(mode):
    with pytest.raises(ValueError, match=f"forward mode {mode.name if isinstance(mode, ForwardMode) else mode}"):
        check_mode(mode)


def test_architectures_outside_the_llama_family_are_not_captured():
    other = SimpleNamespace(args=SimpleNamespace(model_type="gpt2"))
    assert not supports(other)
    with pytest.raises(ValueError, match="gpt2"):
        DecodeGraph(other, 8)


@pytest.mark.parametrize("family", sorted(MOE_FAMILIES))
def test_moe_families_decode_captured_as_uncompiled(family, tmp_path, tokenizer):
    """The captured step of a mixture-of-experts family gives the uncompiled step's tokens
    through joins, a leave and a MIXED launch (greedy and seeded rows)."""
    assert family in CAPTURED_FAMILIES
    loaded = load(ModelSource("hf", str(write_random_model(tmp_path, tokenizer, MOE_FAMILIES[family])), "m"))
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    plain = drive(ModelRunner(loaded), prompts, 16)
    graph = DecodeGraph(loaded.model, 8)
    assert drive(ModelRunner(loaded, graph=graph), prompts, 16) == plain
    assert graph.replays == 16 and len(plain["a"]) == 9 and len(plain["d"]) == 7
