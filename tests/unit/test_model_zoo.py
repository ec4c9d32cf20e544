"""The model zoo's fast paths (issue 41, item 4): every architecture the tests serve (one tiny
random config per family: dense, mixture-of-experts, sliding-window, hybrid and recurrent)
runs its prefills with the LM head on the last position only and its decode steps captured.
A family added to the zoo without them fails here, naming it; its start-up log says which
slow path it takes and why (tests/unit/test_forward_head.py)."""

from __future__ import annotations

import pytest

from protocol.config import ModelSource
from tests.support.hybrid_configs import HYBRID_CONFIGS
from tests.support.tiny_model import MOE_FAMILIES, TINY_CONFIG, write_random_model
from tests.support.window_configs import WINDOW_CONFIGS
from worker_proc.model.decode_graph import supports
from worker_proc.model.forward import head_check
from worker_proc.model.loader import load

ZOO = {"llama": TINY_CONFIG, **MOE_FAMILIES, **WINDOW_CONFIGS, **HYBRID_CONFIGS}


@pytest.mark.parametrize("family", sorted(ZOO))
def test_every_family_takes_the_fast_paths(family, tokenizer, tmp_path):
    loaded = load(ModelSource("hf", str(write_random_model(tmp_path, tokenizer, ZOO[family])), "m"))
    assert head_check(loaded.model) == (True, ""), family
    assert supports(loaded.model), family
