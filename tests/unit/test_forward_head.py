"""Logits only where they are needed, for every architecture whose call allows it
(worker_proc/model/forward.py): the head is found from the model's structure and checked by
one call, not read from a list of four families (issue 41, item 4)."""

from __future__ import annotations

import importlib

import mlx.core as mx

from worker_proc.model.decode_graph import supports
from worker_proc.model.forward import KNOWN_PLAIN_HEADS, head, head_check, prefill_all_logits

BASE = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
}
CONFIGS = {
    "llama": {"head_dim": 8, "tie_word_embeddings": False},
    "qwen3_moe": {
        "head_dim": 8,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "moe_intermediate_size": 16,
        "tie_word_embeddings": False,
        "max_position_embeddings": 512,
        "norm_topk_prob": True,
    },
    "cohere": {"layer_norm_eps": 1e-5, "logit_scale": 0.0625, "rms_norm_eps": None},
}


def tiny(family: str):
    """A random-weight mlx-lm model of `family` built in this process."""
    module = importlib.import_module(f"mlx_lm.models.{family}")
    config = {**BASE, **CONFIGS[family], "model_type": family}
    args = module.ModelArgs.from_dict({k: v for k, v in config.items() if v is not None})
    mx.random.seed(0)
    model = module.Model(args)
    mx.eval(model.parameters())
    return model


def test_a_known_family_is_plain_without_a_probe():
    assert "llama" in KNOWN_PLAIN_HEADS and head_check(tiny("llama")) == (True, "")


def test_another_family_whose_call_is_inner_model_and_head_gets_the_fast_path():
    model = tiny("qwen3_moe")
    assert head_check(model) == (True, "")
    ids = [5, 9, 3, 7, 1]
    fast = prefill_all_logits(model, ids, None)  # the split path: inner model, then head
    full = model(mx.array([ids], dtype=mx.int32))[0]
    assert fast.shape == full.shape == (5, 128) and mx.allclose(fast, full, atol=1e-5).item()
    assert supports(model)  # its attention is qwen3's: the decode step is captured too


def test_a_wrapped_text_model_finds_its_head_in_the_language_model():
    """Qwen3.5 keeps its text model as ``language_model`` (``model`` is that model's inner one)."""
    import mlx_lm.models.qwen3_5 as qwen3_5

    text = {
        **BASE,
        "model_type": "qwen3_5_text",
        "num_hidden_layers": 4,
        "head_dim": 8,
        "linear_num_value_heads": 4,
        "linear_num_key_heads": 2,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 4,
        "full_attention_interval": 2,
        "tie_word_embeddings": False,
        "rope_parameters": {
            "type": "default",
            "mrope_section": [1, 1, 0],
            "rope_theta": 10000,
            "partial_rotary_factor": 0.25,
        },
    }
    mx.random.seed(0)
    model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict({"model_type": "qwen3_5", "text_config": text}))
    assert head_check(model) == (True, "")
    ids = [5, 9, 3, 7]
    assert mx.allclose(prefill_all_logits(model, ids, None), model(mx.array([ids]))[0], atol=1e-5).item()


def test_a_call_that_scales_the_logits_keeps_the_full_call_and_says_why():
    model = tiny("cohere")  # logits * logit_scale after the tied head
    plain, why = head_check(model)
    assert not plain and "does more than inner model + head" in why
    x = mx.array([[1, 2, 3]], dtype=mx.int32)
    assert not mx.allclose(model(x), head(model, model.model(x))).item()


def test_a_model_without_an_inner_model_is_not_split():
    class Bare:
        args = None

    plain, why = head_check(Bare())
    assert not plain and "no inner model" in why
