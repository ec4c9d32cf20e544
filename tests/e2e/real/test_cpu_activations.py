"""The CPU's polynomial exp and SwiGLU (`worker_proc.cpu.activations`): accuracy against
float64, the fallback for other dtypes, and greedy tokens of the default model unchanged.

These tests run on the default model loaded in this process (`loaded`); the others of
the module: tests/unit/test_cpu_activations.py."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from worker_proc.cpu import activations as cpu_activations
from worker_proc.cpu.activations import fast_swiglu


def _greedy(model, prompt: list[int], steps: int) -> list[int]:
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)
    out = []
    for _ in range(steps):
        out.append(int(mx.argmax(logits[0, -1])))
        logits = model(mx.array([[out[-1]]]), cache=cache)
    return out


def test_install_changes_the_model_module_and_keeps_greedy_tokens(loaded, monkeypatch):
    import mlx_lm.models.llama as llama

    monkeypatch.setattr(llama, "swiglu", llama.swiglu)  # restored after the test
    prompts = [[1, 9690, 198] + list(range(100 + 37 * i, 140 + 37 * i)) for i in range(3)]
    stock = [_greedy(loaded.model, p, 24) for p in prompts]
    assert cpu_activations.install(loaded.model) == ["mlx_lm.models.llama"]
    assert llama.swiglu is fast_swiglu
    assert [_greedy(loaded.model, p, 24) for p in prompts] == stock
    assert cpu_activations.install(loaded.model) == []  # already installed: nothing left to change
