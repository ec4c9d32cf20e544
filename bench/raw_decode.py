"""The raw in-process mlx-lm decode loops, the ceilings a server on the same model and device
can approach:

- the batch loop: B prompts of the same length, each prefilled into the model's own caches
  (``make_prompt_cache``) and merged into mlx-lm's batch caches as its `BatchGenerator` does
  (`BatchKVCache`, `BatchRotatingKVCache` for sliding windows, batched `ArraysCache` for
  recurrent state), then the whole batch decoded greedily, each step queued
  (``mx.async_eval``) before the previous step's tokens are read, as mlx-lm's own loops do;
- with ``--plain``, batch 1 as a user's ``mlx_lm.generate`` runs it: mlx-lm's own
  ``generate_step`` on its plain cache (``make_prompt_cache``), greedy.

    python -m bench.raw_decode --model DIR --batch 1,16,64 --input-len L --steps N [--plain] [--json OUT]

prints {batch: decode tok/s} (B * steps / time of the steps; prefill excluded) as JSON, and
with ``--plain`` also {"plain": tok/s of the plain batch-1 loop}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def decode_rate(model, batch: int, input_len: int, steps: int, vocab_size: int, seed: int = 0, step=None) -> float:
    """Decode tokens/s of `steps` greedy steps of `batch` random prompts of `input_len` tokens
    (ids below `vocab_size`) through `model` (an mlx-lm model called as ``model(tokens[B, L],
    cache=...) -> logits[B, L, V]``). step: ``step(tokens int32 [B], cache) -> logits [B, V]``
    for one decode step (default: `model` itself). Raises `ValueError` for batch, input_len or
    steps < 1."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    if min(batch, input_len, steps) < 1:
        raise ValueError(f"batch, input_len and steps must be >= 1, got {batch}, {input_len}, {steps}")
    mx.random.seed(seed)
    prompts = mx.random.randint(0, vocab_size, (batch, input_len))
    own = [make_prompt_cache(model) for _ in range(batch)]
    y = mx.concatenate([model(prompts[i : i + 1], cache=c)[:, -1] for i, c in enumerate(own)]).argmax(-1)
    cache = [type(layer).merge([c[i] for c in own]) for i, layer in enumerate(own[0])]
    y = y.astype(mx.int32)
    held = [a for c in cache for a in (c.cache if hasattr(c, "cache") else (c.keys, c.values)) if a is not None]
    mx.eval(y, *held)  # the merge too, outside the timed steps
    step = step or (lambda tokens, c: model(tokens[:, None], cache=c)[:, -1])
    t0 = time.perf_counter()
    for _ in range(steps):
        nxt = mx.argmax(step(y, cache), axis=-1).astype(mx.int32)
        mx.async_eval(nxt)
        y.tolist()
        y = nxt
    y.tolist()
    return batch * steps / (time.perf_counter() - t0)


def plain_rate(model, input_len: int, steps: int, vocab_size: int, seed: int = 0) -> float:
    """Decode tokens/s of mlx-lm's ``generate_step`` (its plain cache, greedy, as
    ``mlx_lm.generate`` runs) on one random prompt of `input_len` tokens (ids below
    `vocab_size`): `steps` tokens after the first (whose time includes the prefill) over the
    time from the first to the last. Raises `ValueError` for input_len or steps < 1."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    if min(input_len, steps) < 1:
        raise ValueError(f"input_len and steps must be >= 1, got {input_len}, {steps}")
    mx.random.seed(seed)
    prompt = mx.random.randint(0, vocab_size, (input_len,))
    t0, n = 0.0, -1
    for n, _ in enumerate(generate_step(prompt, model, max_tokens=steps + 1, sampler=lambda x: mx.argmax(x, -1))):
        if n == 0:
            t0 = time.perf_counter()
    return n / (time.perf_counter() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model directory or GGUF, loaded as lazyserve loads it")
    p.add_argument("--batch", default="1", help="comma-separated batch sizes")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--plain", action="store_true", help="also time the plain batch-1 loop (mlx_lm.generate's)")
    p.add_argument("--json", default=None, help="also write the result here")
    a = p.parse_args()

    from protocol.model_source import resolve_model
    from worker_proc.model.loader import load

    loaded = load(resolve_model(a.model))
    batches = [int(b) for b in a.batch.split(",")]
    for b in batches:  # warm-up: a GPU prepares its kernels for each batch size the first time it meets it
        decode_rate(loaded.model, b, a.input_len, 4, loaded.vocab_size)
    rates: dict = {b: decode_rate(loaded.model, b, a.input_len, a.steps, loaded.vocab_size) for b in batches}
    if a.plain:
        plain_rate(loaded.model, a.input_len, 4, loaded.vocab_size)  # warm-up, as above
        rates["plain"] = plain_rate(loaded.model, a.input_len, a.steps, loaded.vocab_size)
    if a.json:
        Path(a.json).write_text(json.dumps(rates))
    print(json.dumps(rates))


if __name__ == "__main__":
    main()
