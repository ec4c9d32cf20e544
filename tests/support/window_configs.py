"""Tiny configs of mlx-lm's sliding-window architectures (random weights in tests and benches,
written with `tests.support.tiny_model.write_random_model`): gpt-oss (window layers with
attention sinks, mixture-of-experts MLPs), Gemma 3 (five window layers per full one) and
Gemma 4 (global layers of another head size, the last layers sharing earlier layers' KV,
soft-capped logits) and Ministral 3 (window and full layers by ``layer_types``). The windows are 8 positions, so a
test's prompts of a few dozen tokens cross them several times."""

from tests.support.hybrid_configs import VOCAB

WINDOW = 8
"""Positions of every tiny config's sliding window."""

WINDOW_CONFIGS: dict[str, dict] = {
    "gpt_oss": {
        "model_type": "gpt_oss",
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 64,
        "head_dim": 16,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": WINDOW,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000,
        "tie_word_embeddings": False,
    },
    "gemma3_text": {
        "model_type": "gemma3_text",
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "head_dim": 16,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "query_pre_attn_scalar": 16,
        "sliding_window": WINDOW,
        "sliding_window_pattern": 2,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 2048,
    },
    "gemma4_text": {
        "model_type": "gemma4_text",
        "vocab_size": VOCAB,
        "vocab_size_per_layer_input": VOCAB,
        "hidden_size": 64,
        "hidden_size_per_layer_input": 16,
        "num_hidden_layers": 6,
        "num_kv_shared_layers": 2,
        "intermediate_size": 128,
        "head_dim": 16,
        "global_head_dim": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "sliding_window": WINDOW,
        "sliding_window_pattern": 3,
        "max_position_embeddings": 2048,
    },
    "ministral3": {
        "model_type": "ministral3",
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "head_dim": 16,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 2048,
        "sliding_window": WINDOW,
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
