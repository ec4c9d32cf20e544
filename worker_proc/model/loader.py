"""Loading a model into mlx-lm model classes (DESIGN.md §5).

Three sources: a GGUF llama file (``mx.load`` with metadata, llama.cpp names mapped to
mlx-lm names, quantized tensors dequantized), an MLX/HF directory (mlx-lm's loader), and
``load_format="dummy"`` (the architecture from the config with random weights).
On the CPU device weights are float32 (BLAS matmuls; MLX's quantized matmul gets no BLAS
speed-up); on a GPU they are bfloat16, or kept quantized for an MLX-quantized directory.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from mlx_lm.utils import _get_classes, dequantize_model
from mlx_lm.utils import load_model as mlx_lm_load_model

from protocol.config import ModelSource
from worker_proc.memory.layer_caches import CacheKinds
from worker_proc.model.batched_prefill import pads_exactly

GGUF_GROUP_SIZE = 32

# llama.cpp tensor names -> mlx-lm llama names; the "blk.N." prefix maps to "model.layers.N."
_GGUF_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_norm": "input_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_norm": "post_attention_layernorm",
}
_GGUF_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


@dataclass
class LoadedModel:
    """model: an mlx-lm `nn.Module` called as ``model(tokens[B, L], cache=...) -> logits[B, L, V]``;
    config: its mlx-lm config dict; num_layers; vocab_size; dtype: the float dtype of its
    weights; caches: the kinds of its per-layer caches (attention KV, recurrent state);
    pads_exactly: whether its rows may be prefilled together with right padding
    (`batched_prefill.pads_exactly`)."""

    model: nn.Module
    config: dict
    num_layers: int
    vocab_size: int
    dtype: mx.Dtype
    caches: CacheKinds
    pads_exactly: bool = True


def compute_dtype() -> mx.Dtype:
    """float32 on the CPU device, bfloat16 on a GPU."""
    return mx.float32 if mx.default_device() == mx.cpu else mx.bfloat16


def _scalar(v: object) -> object:
    return v.item() if isinstance(v, mx.array) else v


def gguf_config(metadata: dict, path: Path) -> dict:
    """An mlx-lm llama config from GGUF metadata. Raises `ValueError` naming `path` for a
    non-llama architecture or missing keys."""
    arch = metadata.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: unsupported GGUF architecture {arch!r} (supported: 'llama')")
    g = lambda key: _scalar(metadata[f"llama.{key}"])  # noqa: E731
    try:
        heads = int(g("attention.head_count"))
        hidden = int(g("embedding_length"))
        vocab = metadata.get("llama.vocab_size")
        vocab = int(_scalar(vocab)) if vocab is not None else len(metadata["tokenizer.ggml.tokens"])
        return {
            "model_type": "llama",
            "hidden_size": hidden,
            "num_hidden_layers": int(g("block_count")),
            "intermediate_size": int(g("feed_forward_length")),
            "num_attention_heads": heads,
            "num_key_value_heads": int(_scalar(metadata.get("llama.attention.head_count_kv", heads))),
            "rms_norm_eps": float(g("attention.layer_norm_rms_epsilon")),
            "vocab_size": vocab,
            "max_position_embeddings": int(g("context_length")),
            "rope_theta": float(_scalar(metadata.get("llama.rope.freq_base", 10000.0))),
            # llama.cpp stores Q/K permuted for interleaved RoPE (DESIGN.md §5)
            "rope_traditional": True,
            "tie_word_embeddings": "output.weight" not in metadata.get("_tensor_names", ()),
        }
    except KeyError as e:
        raise ValueError(f"{path}: GGUF metadata lacks {e.args[0]!r}") from e


def _gguf_name(name: str) -> str:
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(\w+)", name)
    if m:
        layer, part, leaf = m.groups()
        if part not in _GGUF_LAYER_NAMES:
            raise ValueError(f"unknown GGUF tensor {name!r}")
        return f"model.layers.{layer}.{_GGUF_LAYER_NAMES[part]}.{leaf}"
    base, leaf = name.rsplit(".", 1)
    if base not in _GGUF_GLOBAL_NAMES:
        raise ValueError(f"unknown GGUF tensor {name!r}")
    return f"{_GGUF_GLOBAL_NAMES[base]}.{leaf}"


def gguf_weights(raw: dict[str, mx.array], dtype: mx.Dtype) -> dict[str, mx.array]:
    """Map llama.cpp tensors to mlx-lm names, dequantizing quantized ones to `dtype`.

    `mx.load` returns Q4_1/Q8_0 tensors in MLX's affine layout (``weight`` uint32 plus
    ``scales``/``biases``, group size 32); bits = weight.shape[1] * 32 / in_features with
    in_features = scales.shape[1] * 32.
    """
    out = {}
    for name, w in raw.items():
        if name.endswith((".scales", ".biases")):
            continue
        base = name[: -len(".weight")] if name.endswith(".weight") else None
        if base is not None and f"{base}.scales" in raw:
            scales, biases = raw[f"{base}.scales"], raw[f"{base}.biases"]
            in_features = scales.shape[1] * GGUF_GROUP_SIZE
            bits = w.shape[1] * 32 // in_features
            w = mx.dequantize(w, scales, biases, group_size=GGUF_GROUP_SIZE, bits=bits)
        out[_gguf_name(name)] = w.astype(dtype)
    return out


def _build(config: dict) -> nn.Module:
    model_cls, args_cls = _get_classes(config)
    return model_cls(args_cls.from_dict(config))


def config_value(config: dict, key: str):
    """`key` of a model's config.json, or of its ``text_config`` (a multimodal checkpoint's
    text model: Qwen3.5); None when neither states it."""
    got = config.get(key)
    return got if got is not None else (config.get("text_config") or {}).get(key)


def _finish(model: nn.Module, config: dict, dtype: mx.Dtype) -> LoadedModel:
    model.eval()
    mx.eval(model.parameters())
    args = getattr(model, "args", None)
    num_layers = len(model.layers)
    vocab = int(config_value(config, "vocab_size") or args.vocab_size)
    kinds = CacheKinds.of(model)
    return LoadedModel(model, config, num_layers, vocab, dtype, kinds, pads_exactly(model, kinds.state))


def load(source: ModelSource, load_format: str = "auto", check: Callable[[dict], None] | None = None) -> LoadedModel:
    """Load `source` ("auto": real weights; "dummy": random weights of the same architecture).
    check: called with the mlx-lm config before any weight is read (it raises to refuse the
    model, e.g. `tensor_parallel.check_shardable`).

    Raises `FileNotFoundError` (missing weights), `ValueError` (unknown architecture,
    unknown tensor, corrupt file), each naming the file, and `layer_caches.UnsupportedCache`
    (a `ValueError`) for a layer cache type the worker does not serve.
    """
    dtype = compute_dtype()
    path = Path(source.path)
    if load_format not in ("auto", "dummy"):
        raise ValueError(f"unknown --load-format {load_format!r} (supported: auto, dummy)")
    if source.kind == "gguf":
        try:
            raw, metadata = mx.load(str(path), return_metadata=True)
        except Exception as e:  # mlx raises RuntimeError/ValueError for a corrupt file
            raise ValueError(f"{path}: cannot read GGUF file: {e}") from e
        metadata = dict(metadata)
        metadata["_tensor_names"] = set(raw)
        config = gguf_config(metadata, path)
        if check is not None:
            check(config)
        model = _build(config)
        if load_format == "auto":
            model.load_weights(list(gguf_weights(raw, dtype).items()), strict=True)
        else:
            model.set_dtype(dtype)
        return _finish(model, config, dtype)
    try:
        config = json.loads((path / "config.json").read_text())
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{path / 'config.json'}: not valid JSON: {e}") from e
    if check is not None:
        check(config)
    if load_format == "dummy":
        config.pop("quantization", None)
        config.pop("quantization_config", None)
        try:
            model = _build(config)
        except ValueError as e:
            raise ValueError(f"{path / 'config.json'}: {e}") from e
        model.set_dtype(dtype)
        return _finish(model, config, dtype)
    try:
        model, config = mlx_lm_load_model(path)
    except (ValueError, RuntimeError) as e:  # mlx raises RuntimeError for a truncated or corrupt safetensors file
        raise ValueError(f"{path}: {e}") from e
    if mx.default_device() == mx.cpu:
        model = dequantize_model(model)
        model.set_dtype(dtype)
    return _finish(model, config, dtype)


def parameter_bytes(model: nn.Module) -> int:
    """Total bytes of the model's parameters."""
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))
