"""Forward passes over mlx-lm models that compute logits only where they are needed.

mlx-lm's ``model(tokens, cache)`` applies the LM head to every position; a prefill of L
tokens then builds an [L, V] float matrix for one row of use. For the llama family, whose
head is known (``lm_head`` or the tied embedding), the inner model runs and the head is
applied to the last position only. Other architectures use the full call.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

_KNOWN_HEADS = {"llama", "mistral", "qwen2", "qwen3"}

GPU_PREFILL_STEP = 2048
CPU_PREFILL_STEP = 512
"""Tokens per model call inside one prefill: bounds the attention-score memory, and on MLX's
CPU backend, whose attention slows down with the square of the call's length, shorter calls
are faster in total (2,048 tokens of SmolLM2-135M: 22.5 s in one call, 16–17 s in calls of
512; `python bench/prefill_step.py`)."""


def prefill_step() -> int:
    """`CPU_PREFILL_STEP` on MLX's CPU device, else `GPU_PREFILL_STEP` (tokens)."""
    return CPU_PREFILL_STEP if mx.default_device() == mx.cpu else GPU_PREFILL_STEP


def has_plain_head(model: nn.Module) -> bool:
    """Whether `model` is of a family whose inner model and LM head are known (`head`)."""
    args = getattr(model, "args", None)
    return getattr(args, "model_type", None) in _KNOWN_HEADS and hasattr(model, "model")


def head(model: nn.Module, hidden: mx.array) -> mx.array:
    """The LM head of a `has_plain_head` model: hidden [..., H] -> logits [..., V], lazy."""
    if getattr(model.args, "tie_word_embeddings", False) or not hasattr(model, "lm_head"):
        return model.model.embed_tokens.as_linear(hidden)
    return model.lm_head(hidden)


def prefill_hidden(model: nn.Module, tokens: list[int], cache: list) -> None:
    """Run a non-final chunk: fill `cache` with `tokens`' KV, no LM head (lazy)."""
    plain, step = has_plain_head(model), prefill_step()
    for start in range(0, len(tokens), step):
        chunk = mx.array(tokens[start : start + step], dtype=mx.int32)[None]
        if plain:
            model.model(chunk, cache=cache)
        else:
            model(chunk, cache=cache)


def decode_logits(model: nn.Module, tokens: mx.array, cache: list) -> mx.array:
    """One decode step. tokens: int32 [B] (may be lazy); returns logits [B, V], lazy."""
    return model(tokens[:, None], cache=cache)[:, -1, :]


def prefill_all_logits(model: nn.Module, tokens: list[int], cache: list) -> mx.array:
    """Run `tokens` (len >= 1) through `model`, filling `cache`; return the logits of every
    position, [len(tokens), V], lazy (for prompt logprobs). The LM head runs on each model
    call's positions (`prefill_step()` tokens) separately."""
    plain, step, parts = has_plain_head(model), prefill_step(), []
    for start in range(0, len(tokens), step):
        chunk = mx.array(tokens[start : start + step], dtype=mx.int32)[None]
        parts.append(head(model, model.model(chunk, cache=cache))[0] if plain else model(chunk, cache=cache)[0])
    return parts[0] if len(parts) == 1 else mx.concatenate(parts)
