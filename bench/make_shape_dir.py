"""Write a model directory with the default model's shape (or `--model`'s): config.json and
the tokenizer files, for `--load-format dummy` on machines that cannot receive the weights
(the lent GPU); with ``--weights real|random``, also model.safetensors (the weights as
lazyserve loads them, or random ones of the same architecture), so that mlx-lm and
mlx_lm.server can load the directory, e.g. the default model, a GGUF they cannot read.
With ``--shape llama-3.2-1b`` (or ``llama-3.1-8b``, ``qwen3-30b-a3b``, ``lfm2-350m``), config.json is instead that public
architecture (`SHAPES`; vocabulary 128,256 / 65,536) and the tokenizer is the default model's (or `--model`'s) with
its vocabulary padded by dummy tokens ``<|pad_N|>`` (N = the id) up to the shape's, so that
every id a random-weight model samples decodes (``--weights random`` only).

    python bench/make_shape_dir.py OUT_DIR [--weights real|random] [--model PATH] [--shape llama-3.2-1b]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SOURCE_FILE = "lazyserve_source.json"
"""What a directory was written from: {"model", "weights", "dtype"[, "shape"]} (see `write_model_dir`)."""

SHAPES = {
    "llama-3.2-1b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    },
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 128256,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "gpt-oss-20b": {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_hidden_layers": 24,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "num_local_experts": 32,
        "num_experts_per_tok": 4,
        "sliding_window": 128,
        "layer_types": ["sliding_attention", "full_attention"] * 12,
        "vocab_size": 201088,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 150000,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "gemma-3-4b": {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "num_hidden_layers": 34,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "query_pre_attn_scalar": 256,
        "sliding_window": 1024,
        "sliding_window_pattern": 6,
        "vocab_size": 262208,
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "torch_dtype": "bfloat16",
    },
    "qwen3-next-80b-a3b": {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "hidden_size": 2048,
        "intermediate_size": 5120,
        "num_hidden_layers": 48,
        "full_attention_interval": 4,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "linear_num_value_heads": 32,
        "linear_num_key_heads": 16,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_conv_kernel_dim": 4,
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "partial_rotary_factor": 0.25,
        "vocab_size": 151936,
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000000.0,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "lfm2-350m": {
        "architectures": ["Lfm2ForCausalLM"],
        "model_type": "lfm2",
        "hidden_size": 1024,
        "num_hidden_layers": 16,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "vocab_size": 65536,
        "max_position_embeddings": 128000,
        "norm_eps": 1e-5,
        "conv_bias": False,
        "conv_L_cache": 3,
        "block_dim": 1024,
        "block_ff_dim": 6656,
        "block_multiple_of": 256,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": True,
        "full_attn_idxs": [2, 5, 8, 10, 12, 14],
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
    },
}
"""Architecture configs (public values, no weights) for ``--shape``; token ids come from the
tokenizer. ``llama-3.1-8b`` and ``qwen3-30b-a3b`` (a mixture of experts: 128 experts, 8 per
token, 3.3B of its 30.5B parameters active) are the device-bound shapes of issue 40's
comparison; ``lfm2-350m``: a hybrid (10 short-conv layers, 6 attention layers) for issue 11's
benches; ``gpt-oss-20b`` (window layers of 128 with attention sinks between full ones, 32
experts), ``gemma-3-4b`` (five window layers of 1,024 per full one) and
``qwen3-next-80b-a3b`` (gated DeltaNet with a full-attention layer every 4, 512 experts) for
issue 41's (with ``--layers N``: the first N layers only)."""

PAD_TOKEN = "<|pad_{}|>"


def _pad_tokenizer(path: Path, size: int) -> None:
    """Pad the tokenizer saved in `path` to `size` ids with `PAD_TOKEN`s (N = the id). A
    byte-level BPE vocabulary gets them as plain vocabulary entries without merges, so text
    never encodes to them and the files stay small; another tokenizer gets them as added
    tokens. Raises `ValueError` when the reloaded tokenizer does not hold `size` ids."""
    from transformers import AutoTokenizer

    file = path / "tokenizer.json"
    data = json.loads(file.read_text()) if file.exists() else {}
    model = data.get("model", {})
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    n = len(tokenizer)
    if model.get("type") == "BPE" and (data.get("decoder") or {}).get("type") == "ByteLevel":
        taken = set(model["vocab"].values()) | {t["id"] for t in data.get("added_tokens", [])}
        if taken != set(range(n)):
            raise ValueError(f"{file}: token ids are not 0..{n - 1}; cannot pad")
        model["vocab"].update({PAD_TOKEN.format(i): i for i in range(n, size)})
        file.write_text(json.dumps(data, ensure_ascii=False))
    else:
        tokenizer.add_tokens([PAD_TOKEN.format(i) for i in range(n, size)])
        tokenizer.save_pretrained(str(path))
    padded = len(AutoTokenizer.from_pretrained(str(path)))
    if padded != size:
        raise ValueError(f"{path}: padded tokenizer holds {padded} ids, expected {size}")


def _shape_config(source) -> dict:
    """The model's config without loading its weights."""
    import mlx.core as mx

    from worker_proc.model.loader import gguf_config

    if source.kind != "gguf":
        return json.loads((Path(source.path) / "config.json").read_text())
    _, metadata = mx.load(source.path, return_metadata=True)
    metadata = dict(metadata)
    metadata["_tensor_names"] = set()
    return gguf_config(metadata, Path(source.path))


def write_model_dir(
    out: str | Path, model: str | None = None, weights: str | None = None, shape: str | None = None, layers: int = 0
) -> dict:
    """Write `model`'s (None: the default model) directory to `out`: config.json, tokenizer
    files, `SOURCE_FILE`, and for `weights` "real" or "random" model.safetensors in the dtype
    lazyserve computes in on this device (float32 on the CPU, bfloat16 on a GPU; an MLX-quantized
    directory stays quantized on a GPU). With `shape` (a key of `SHAPES`), config.json is that
    architecture (its first `layers` layers when given, `first_layers`) and the tokenizer
    `model`'s padded to its vocabulary (`_pad_tokenizer`). Returns the source record written. Raises `FileNotFoundError` / `ValueError` as
    `protocol.model_source.resolve_model` and `worker_proc.model.loader.load` do, and
    `ValueError` for another `weights`, an unknown `shape`, or `shape` with real weights."""
    from protocol.model_source import resolve_model

    if weights not in (None, "real", "random"):
        raise ValueError(f"weights must be 'real' or 'random', got {weights!r}")
    if shape is not None:
        return _write_shape_dir(Path(out), model, weights, shape, layers)
    from mlx.utils import tree_flatten

    from text.hf_tokenizer import load_tokenizer

    source = resolve_model(model)
    tokenizer = load_tokenizer(source)
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    record = {"model": model or "default", "weights": weights, "dtype": None}
    if weights is None:
        config = _shape_config(source)
    else:
        import mlx.core as mx

        from worker_proc.model.loader import load

        loaded = load(source, "auto" if weights == "real" else "dummy")
        tensors = dict(tree_flatten(loaded.model.parameters()))
        config = dict(loaded.config)
        if not any(k.endswith(".scales") for k in tensors):
            config.pop("quantization", None)
            config.pop("quantization_config", None)
        mx.save_safetensors(str(path / "model.safetensors"), tensors, metadata={"format": "mlx"})
        record["dtype"] = str(loaded.dtype)
    config.setdefault("eos_token_id", tokenizer.eos_token_id)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    tokenizer.save_pretrained(str(path))
    (path / SOURCE_FILE).write_text(json.dumps(record))
    return record


def first_layers(config: dict, layers: int) -> dict:
    """`config` with its first `layers` layers only (its per-layer lists cut to match).
    Raises `ValueError` for more layers than it has, or fewer than 1."""
    if not 1 <= layers <= config["num_hidden_layers"]:
        raise ValueError(f"--layers must be 1..{config['num_hidden_layers']}, got {layers}")
    out = dict(config, num_hidden_layers=layers)
    for key, value in config.items():
        if isinstance(value, list) and len(value) == config["num_hidden_layers"]:
            out[key] = value[:layers]
    return out


def _write_shape_dir(path: Path, model: str | None, weights: str | None, shape: str, layers: int = 0) -> dict:
    """`write_model_dir` for a `shape`: its config, `model`'s tokenizer padded to its
    vocabulary; with `weights` "random", then the directory written so far is loaded as
    `write_model_dir` loads a model directory (random weights) and rewritten with them."""
    from protocol.model_source import resolve_model
    from text.hf_tokenizer import load_tokenizer

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r} (known: {', '.join(SHAPES)})")
    if weights == "real":
        raise ValueError(f"shape {shape!r} has no real weights; use weights 'random' or none")
    config = first_layers(SHAPES[shape], layers) if layers else dict(SHAPES[shape])
    tokenizer = load_tokenizer(resolve_model(model))
    if len(tokenizer) > config["vocab_size"]:
        raise ValueError(
            f"the tokenizer holds {len(tokenizer)} ids, more than shape {shape!r}'s "
            f"vocabulary of {config['vocab_size']}"
        )
    path.mkdir(parents=True, exist_ok=True)
    (path / "model.safetensors").unlink(missing_ok=True)
    tokenizer.save_pretrained(str(path))
    _pad_tokenizer(path, config["vocab_size"])
    for key in ("bos_token_id", "eos_token_id"):
        if getattr(tokenizer, key) is not None:
            config[key] = getattr(tokenizer, key)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    record = {"model": model or "default", "weights": None, "dtype": None, "shape": shape}
    (path / SOURCE_FILE).write_text(json.dumps(record))
    if weights == "random":
        record = dict(write_model_dir(path, str(path), "random"), model=model or "default", shape=shape)
        (path / SOURCE_FILE).write_text(json.dumps(record))
    return record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--model", default=None, help="GGUF file or model directory (default: the default model)")
    p.add_argument("--weights", choices=["real", "random"], default=None, help="also write model.safetensors")
    p.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default=None,
        help="write this architecture's config and the tokenizer padded to its vocabulary",
    )
    p.add_argument("--layers", type=int, default=0, help="with --shape: its first N layers only")
    a = p.parse_args()
    record = write_model_dir(a.out, a.model, a.weights, a.shape, a.layers)
    config = json.loads((Path(a.out) / "config.json").read_text())
    print(f"wrote {a.out} ({config['num_hidden_layers']} layers, hidden {config['hidden_size']}; {record})")


if __name__ == "__main__":
    main()
