"""Quantized checkpoints load as a user's download does (issue 41, item 5): a tiny random
config quantized by mlx-lm (affine, 4 and 8 bits; a dense and a mixture-of-experts family; and
gpt-oss in MXFP4, the format its checkpoints ship in),
saved to disk with mlx-lm's own writers, and loaded by the worker's loader. On the CPU the
weights are dequantized to float32; their logits equal mlx-lm's quantized model's within
the quantized matmul's rounding, and pick the same tokens."""

from __future__ import annotations

import shutil

import mlx.core as mx
import pytest
from mlx_lm.utils import load_model, quantize_model, save_config, save_model

from protocol.config import ModelSource
from tests.support.tiny_model import MOE_FAMILIES, TINY_CONFIG, write_random_model
from tests.support.window_configs import WINDOW_CONFIGS
from worker_proc.model.loader import load

MOE = MOE_FAMILIES["qwen3_moe"]
GPT_OSS = WINDOW_CONFIGS["gpt_oss"]  # its checkpoints ship MXFP4 experts


@pytest.mark.parametrize(
    "config,bits,mode",
    [(TINY_CONFIG, 4, "affine"), (TINY_CONFIG, 8, "affine"), (MOE, 4, "affine"), (GPT_OSS, 4, "mxfp4")],
    ids=["llama-4", "llama-8", "moe-4", "gpt-oss-mxfp4"],
)
def test_a_quantized_checkpoint_loads_and_computes_like_mlx_lm(tmp_path, tokenizer, config, bits, mode):
    src = write_random_model(tmp_path / "src", tokenizer, config)
    model, cfg = load_model(src)
    model, cfg = quantize_model(model, cfg, group_size=32 if mode == "affine" else None, bits=bits, mode=mode)
    out = tmp_path / "quantized"
    out.mkdir()
    save_model(out, model)
    save_config(cfg, out / "config.json")
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copy(f, out / f.name)
    assert cfg["quantization"]["bits"] == bits

    loaded = load(ModelSource("hf", str(out), "m"))
    reference, _ = load_model(out)  # mlx-lm's own load: quantized layers, quantized matmuls
    ids = mx.array([[5, 900, 33, 2047, 12, 7, 480, 9, 31, 64, 100, 3]], dtype=mx.int32)
    ours, theirs = loaded.model(ids), reference(ids)
    assert ours.shape == theirs.shape == (1, 12, config["vocab_size"])
    assert mx.allclose(ours, theirs.astype(ours.dtype), atol=2e-3, rtol=2e-3).item()
    assert (mx.argmax(ours, -1) == mx.argmax(theirs, -1)).all().item()
