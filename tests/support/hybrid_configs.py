"""Tiny configs of mlx-lm's recurrent and hybrid architectures (random weights in tests and
benches, written with `tests.support.tiny_model.write_random_model`): Mamba-2 (state only), and three
hybrids with attention layers: LFM2 (short-conv), Nemotron-H and Granite 4 hybrid (Mamba-2)."""

VOCAB = 49152  # SmolLM2's tokenizer

HYBRID_CONFIGS: dict[str, dict] = {
    "mamba2": {
        "model_type": "mamba2", "num_heads": 8, "head_dim": 16, "vocab_size": VOCAB, "hidden_size": 64,
        "intermediate_size": 128, "state_size": 16, "num_hidden_layers": 2, "layer_norm_epsilon": 1e-5,
        "conv_kernel": 4, "n_groups": 1, "use_bias": False, "use_conv_bias": True, "tie_word_embeddings": True,
        "time_step_limit": [0.001, 100.0], "time_step_rank": "auto", "max_position_embeddings": 2048,
    },
    "lfm2": {
        "model_type": "lfm2", "vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 2048, "norm_eps": 1e-5, "conv_bias": False,
        "conv_L_cache": 3, "block_dim": 64, "block_ff_dim": 128, "block_multiple_of": 32,
        "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": False, "full_attn_idxs": [1, 3],
    },
    "nemotron_h": {
        "model_type": "nemotron_h", "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
        "max_position_embeddings": 2048, "num_attention_heads": 4, "num_key_value_heads": 2, "attention_bias": False,
        "mamba_num_heads": 8, "mamba_head_dim": 16, "mamba_proj_bias": False, "ssm_state_size": 16, "conv_kernel": 4,
        "n_groups": 1, "mlp_bias": False, "layer_norm_epsilon": 1e-5, "use_bias": False, "use_conv_bias": True,
        "hybrid_override_pattern": "M*M-", "head_dim": 16, "time_step_limit": [0.0, 1e9],
    },
    "granitemoehybrid": {
        "model_type": "granitemoehybrid", "vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 4, "max_position_embeddings": 2048, "num_attention_heads": 4, "num_key_value_heads": 2,
        "attention_bias": False, "embedding_multiplier": 1.0, "attention_multiplier": 0.25, "logits_scaling": 1.0,
        "residual_multiplier": 1.0, "layer_types": ["mamba", "attention", "mamba", "attention"], "rms_norm_eps": 1e-5,
        "mamba_n_heads": 8, "mamba_d_head": 16, "mamba_proj_bias": False, "mamba_d_state": 16, "mamba_d_conv": 4,
        "mamba_n_groups": 1, "mamba_conv_bias": True, "shared_intermediate_size": 128, "num_local_experts": 0,
        "num_experts_per_tok": 0,
    },
}
