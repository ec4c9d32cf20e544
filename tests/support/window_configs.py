"""Tiny configs of mlx-lm's sliding-window architectures (random weights in tests and benches,
written with `tests.support.tiny_model.write_random_model`): gpt-oss (window layers with
attention sinks, mixture-of-experts MLPs), Gemma 3 (five window layers per full one) and
Gemma 4 (global layers of another head size, the last layers sharing earlier layers' KV,
soft-capped logits) and Ministral 3 (window and full layers by ``layer_types``). The windows are 8 positions, so a
test's prompts of a few dozen tokens cross them several times."""

from tests.support.hybrid_configs import VOCAB

WINDOW = 8
"""Positions of every tiny config's sliding window."""

_ATTENTION = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "intermediate_size": 128,
    "head_dim": 16,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "sliding_window": WINDOW,
    "max_position_embeddings": 2048,
}
"""What the tiny window configs share."""

WINDOW_CONFIGS: dict[str, dict] = {
    "gpt_oss": {
        **_ATTENTION,
        "model_type": "gpt_oss",
        "intermediate_size": 64,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000,
        "tie_word_embeddings": False,
    },
    "gemma3_text": {
        **_ATTENTION,
        "model_type": "gemma3_text",
        "query_pre_attn_scalar": 16,
        "sliding_window_pattern": 2,
        "rms_norm_eps": 1e-6,
    },
    "gemma4_text": {
        **_ATTENTION,
        "model_type": "gemma4_text",
        "vocab_size_per_layer_input": VOCAB,
        "hidden_size_per_layer_input": 16,
        "num_hidden_layers": 6,
        "num_kv_shared_layers": 2,
        "global_head_dim": 32,
        "sliding_window_pattern": 3,
    },
    "ministral3": {
        **_ATTENTION,
        "model_type": "ministral3",
        "rms_norm_eps": 1e-5,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {
            "rope_theta": 10000.0,
            "rope_type": "default",
            "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": 2048,
        },
        "tie_word_embeddings": False,
    },
}
