"""Random-weight MLX model directories for the tests and the benchmarks in bench/: the tiny
2-layer llama (`TINY_CONFIG`), tiny mixture-of-experts configs (`MOE_FAMILIES`) and any mlx-lm
architecture by its config."""

from __future__ import annotations

import json
from pathlib import Path

TINY_CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 49152,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "tie_word_embeddings": True,
    "eos_token_id": 2,
}


MOE_FAMILIES = {
    "qwen3_moe": {
        **TINY_CONFIG,
        "model_type": "qwen3_moe",
        "head_dim": 16,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "moe_intermediate_size": 64,
        "norm_topk_prob": True,
        "tie_word_embeddings": False,
    },
    "mixtral": {
        **TINY_CONFIG,
        "model_type": "mixtral",
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "tie_word_embeddings": False,
    },
    "glm4_moe": {
        **TINY_CONFIG,
        "model_type": "glm4_moe",
        "head_dim": 16,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
        "n_group": 1,
        "topk_group": 1,
        "n_shared_experts": 1,
        "n_routed_experts": 4,
        "routed_scaling_factor": 1.0,
        "num_experts_per_tok": 2,
        "first_k_dense_replace": 1,
        "rope_scaling": None,
        "use_qk_norm": True,
        "attention_bias": False,
        "partial_rotary_factor": 0.5,
        "tie_word_embeddings": False,
    },
    "deepseek_v3": {
        **TINY_CONFIG,
        "model_type": "deepseek_v3",
        "moe_intermediate_size": 32,
        "n_shared_experts": 1,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "kv_lora_rank": 32,
        "q_lora_rank": 48,
        "qk_rope_head_dim": 8,
        "v_head_dim": 16,
        "qk_nope_head_dim": 16,
        "first_k_dense_replace": 1,
        "num_key_value_heads": 4,
        "tie_word_embeddings": False,
    },
}
"""Tiny configs of the mixture-of-experts families the graph captures (DeepSeek-V3's
attention is multi-head latent attention, whose cache keeps a latent and a RoPE key of two
sizes; the others' is the llama family's)."""


def write_random_model(path: Path, tokenizer, config: dict = TINY_CONFIG) -> Path:
    """Write an MLX model directory to `path`: the mlx-lm architecture of `config` (its
    ``model_type``) with random weights (seed 0) and `tokenizer` (a transformers
    tokenizer); returns `path`."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import _get_classes

    path.mkdir(parents=True, exist_ok=True)
    mx.random.seed(0)
    model_cls, args_cls = _get_classes(config)
    model = model_cls(args_cls.from_dict(config))
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (path / "config.json").write_text(json.dumps(config))
    tokenizer.save_pretrained(str(path))
    return path
