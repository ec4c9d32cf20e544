"""The model zoo's fast paths (issue 41, item 4): every architecture the tests serve (one tiny
random config per family: dense, mixture-of-experts, sliding-window, hybrid and recurrent)
runs its prefills with the LM head on the last position only and its decode steps captured,
and samples a seeded request alike alone and in a batch.
A family added to the zoo without them fails here, naming it; its start-up log says which
slow path it takes and why (tests/unit/test_forward_head.py)."""

from __future__ import annotations

import pytest

from protocol.config import ModelSource
from tests.support.hybrid_configs import HYBRID_CONFIGS
from tests.support.tiny_model import MOE_FAMILIES, TINY_CONFIG, write_random_model
from tests.support.window_configs import WINDOW_CONFIGS
from tests.support.worker_runs import GREEDY, SEEDED, run_batch
from worker_proc.model.decode_graph import supports
from worker_proc.model.forward import head_check
from worker_proc.model.loader import load
from worker_proc.model.runner import ModelRunner

ZOO = {"llama": TINY_CONFIG, **MOE_FAMILIES, **WINDOW_CONFIGS, **HYBRID_CONFIGS}


@pytest.mark.parametrize("family", sorted(ZOO))
def test_every_family_takes_the_fast_paths_and_samples_batch_invariant(family, tokenizer, tmp_path):
    """Both fast paths on; and a seeded sampled request draws the same tokens alone and
    prefilled and decoded beside two others of other lengths (its rows' state and its
    random stream are its own; the captured step is checked against this uncompiled one in
    each family's own module)."""
    loaded = load(ModelSource("hf", str(write_random_model(tmp_path, tokenizer, ZOO[family])), "m"))
    assert head_check(loaded.model) == (True, ""), family
    assert supports(loaded.model), family
    prompts = [list(range(40, 52)), list(range(300, 305)), list(range(900, 930))]
    alone = run_batch(ModelRunner(loaded), ["s"], prompts[:1], 10, [SEEDED])
    together = run_batch(ModelRunner(loaded), ["s", "x", "y"], prompts, 10, [SEEDED, GREEDY, SEEDED])
    assert together["s"] == alone["s"] and len(alone["s"]) == 10, family
