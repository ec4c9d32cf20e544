"""Forward passes over mlx-lm models that compute logits only where they are needed.

mlx-lm's ``model(tokens, cache)`` applies the LM head to every position; a prefill of L
tokens then builds an [L, V] float matrix for one row of use (about 1.2 GB for a 2,048-token
chunk of a 151k vocabulary). For a model whose call is its inner model (``model.model``, or
``model.backbone``: Mamba-2, Nemotron-H) followed by its head (``lm_head``, or the tied ``embed_tokens``), the inner model runs and the
head is applied to the last position only. Which models those are is found from the model
itself (`head_check`): the structure is there, and one call of 4 tokens gives the same logits
both ways (the head soft-caps the logits where the model does); a call that does more (logit
scaling) keeps the full call.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

KNOWN_PLAIN_HEADS = frozenset({"llama", "mistral", "qwen2", "qwen3"})
"""Families whose call is inner model + head by mlx-lm's code (not probed: under tensor
parallel a probe is a collective call)."""
_PLAIN = "_lazyserve_plain_head"
"""The attribute that keeps `head_check`'s answer on the model."""

GPU_PREFILL_STEP = 2048
CPU_PREFILL_STEP = 512
"""Tokens per model call inside one prefill: bounds the attention-score memory, and on MLX's
CPU backend, whose attention slows down with the square of the call's length, shorter calls
are faster in total (2,048 tokens of SmolLM2-135M: 22.5 s in one call, 16–17 s in calls of
512; `python bench/prefill_step.py`)."""


def prefill_step() -> int:
    """`CPU_PREFILL_STEP` on MLX's CPU device, else `GPU_PREFILL_STEP` (tokens)."""
    return CPU_PREFILL_STEP if mx.default_device() == mx.cpu else GPU_PREFILL_STEP


def head_check(model: nn.Module) -> tuple[bool, str]:
    """Whether `model`'s call is its inner model followed by its LM head (`head`), and if not
    why: (True, "") for a `KNOWN_PLAIN_HEADS` family or a model whose structure has both and
    whose call on 4 tokens (no cache) gives the same logits as the two parts (within float
    rounding); (False, the reason) otherwise. The answer is kept on the model (the probe runs
    once)."""
    known = getattr(model, _PLAIN, None)
    if known is not None:
        return known
    inner = inner_model(model)
    if not isinstance(inner, nn.Module):
        found = (False, "no inner model (model.model or model.backbone) to run without the head")
    elif not hasattr(_head_owner(model), "lm_head") and not hasattr(_embedding(inner), "as_linear"):
        found = (False, "no LM head found (lm_head, or tied embeddings)")
    elif getattr(getattr(model, "args", None), "model_type", None) in KNOWN_PLAIN_HEADS:
        found = (True, "")
    else:
        found = _probe(model)
    setattr(model, _PLAIN, found)
    return found


def _probe(model: nn.Module) -> tuple[bool, str]:
    """`head_check`'s call of 4 tokens through `model` and through its two parts."""
    x = mx.array([[1, 2, 3, 4]], dtype=mx.int32)
    try:
        whole = model(x)
        parts = head(model, inner_model(model)(x))
        mx.eval(whole, parts)
    except Exception as e:  # a model whose parts do not run alone keeps the full call
        return False, f"its inner model and head do not run alone ({type(e).__name__}: {e})"
    if whole.shape != parts.shape:
        return False, f"its call returns {tuple(whole.shape)}, its inner model and head {tuple(parts.shape)}"
    if not mx.allclose(whole.astype(mx.float32), parts.astype(mx.float32), rtol=1e-3, atol=1e-3).item():
        return False, "its call does more than inner model + head (e.g. logit scaling)"
    return True, ""


def has_plain_head(model: nn.Module) -> bool:
    """Whether `model`'s call is its inner model followed by its LM head (`head_check`)."""
    return head_check(model)[0]


def inner_model(model: nn.Module) -> nn.Module:
    """The model without its LM head: ``model.model``, or ``model.backbone`` (Mamba-2,
    Nemotron-H); None when it has neither. (An `nn.Module` is a dict: tested against None,
    not for truth.)"""
    inner = getattr(model, "model", None)
    return inner if inner is not None else getattr(model, "backbone", None)


def _embedding(inner: nn.Module):
    """The token embedding of an inner model: ``embed_tokens``, or ``embeddings`` (Mamba-2);
    None when it has neither."""
    found = getattr(inner, "embed_tokens", None)
    return found if found is not None else getattr(inner, "embeddings", None)


def _head_owner(model: nn.Module) -> nn.Module:
    """The module that holds the LM head: `model`, or the text model a multimodal wrapper
    keeps as ``language_model`` (Qwen3.5's, whose ``model`` is that text model's)."""
    return getattr(model, "language_model", model)


def head(model: nn.Module, hidden: mx.array) -> mx.array:
    """The LM head of a `has_plain_head` model: hidden [..., H] -> logits [..., V], lazy;
    soft-capped as ``cap * tanh(logits / cap)`` when the model caps its logits
    (``final_logit_softcapping``: Gemma 2 and 4)."""
    owner = _head_owner(model)
    if getattr(getattr(owner, "args", None), "tie_word_embeddings", False) or not hasattr(owner, "lm_head"):
        logits = _embedding(inner_model(model)).as_linear(hidden)
    else:
        logits = owner.lm_head(hidden)
    cap = getattr(owner, "final_logit_softcapping", None)
    return logits if not cap else mx.tanh(logits / cap) * cap


def prefill_hidden(model: nn.Module, tokens: list[int], cache: list) -> None:
    """Run a non-final chunk: fill `cache` with `tokens`' KV, no LM head (lazy)."""
    plain, step = has_plain_head(model), prefill_step()
    for start in range(0, len(tokens), step):
        chunk = mx.array(tokens[start : start + step], dtype=mx.int32)[None]
        if plain:
            inner_model(model)(chunk, cache=cache)
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
        parts.append(head(model, inner_model(model)(chunk, cache=cache))[0] if plain else model(chunk, cache=cache)[0])
    return parts[0] if len(parts) == 1 else mx.concatenate(parts)
