"""The plain mlx-lm greedy loop the hybrid-model tests compare against (in-process and served)."""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache


def reference(model, ids: list[int], n: int, logprobs: list[float] | None = None) -> list[int]:
    """A plain mlx-lm greedy loop: the model's own caches, one request, n tokens (their
    logprobs appended to `logprobs` when given)."""
    cache = make_prompt_cache(model)
    logits = model(mx.array(ids)[None], cache=cache)[:, -1]
    out = []
    for _ in range(n):
        tok = mx.argmax(logits, axis=-1)
        out.append(tok.item())
        if logprobs is not None:
            logprobs.append((logits - mx.logsumexp(logits, axis=-1, keepdims=True))[0, out[-1]].item())
        logits = model(tok[None], cache=cache)[:, -1]
    return out
