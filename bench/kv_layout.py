"""What the running batch's left-padded KV layout costs on joins and leaves (issue 13).

The decode batch keeps one `BatchKVCache` per layer with every row right-aligned; a request
joining (`extend`) or leaving (`filter`) rewrites every layer's buffers. This builds a batch
of `--batch` rows with KV lengths spread over `--min-len..--max-len` (random KV values: the
cost does not depend on them), then times, with `mx.eval`, one decode step of the model on
it, one join of a row, and one leave, alternating for `--rounds` rounds. With requests of
`--output-len` tokens at steady state, one join and one leave come every output_len / batch
steps, so their amortized share of a step is (join + leave) x batch / output_len / step.

    python bench/kv_layout.py [--model PATH] [--load-format dummy] [--batch 64]
        [--min-len 50] [--max-len 1500] [--output-len 256] [--rounds 5]
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cli import model_parser  # noqa: E402


def batch_cache(model, lengths: list[int], dtype):
    """Per-layer `BatchKVCache` of len(lengths) rows holding random KV of those lengths."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    from worker_proc.memory.kv_pool import kv_shapes

    width = max(lengths)
    caches = []
    for kv_heads, k_dim, v_dim in kv_shapes(model):
        c = BatchKVCache([width - n for n in lengths])
        c.update_and_fetch(
            mx.random.normal((len(lengths), kv_heads, width, k_dim)).astype(dtype),
            mx.random.normal((len(lengths), kv_heads, width, v_dim)).astype(dtype),
        )
        caches.append(c)
    mx.eval([(c.keys, c.values) for c in caches])
    return caches


def main() -> None:
    p = model_parser(__doc__)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--min-len", type=int, default=50)
    p.add_argument("--max-len", type=int, default=1500)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    a = p.parse_args()

    import mlx.core as mx

    from protocol.messages import SamplingParams
    from protocol.model_source import resolve_model
    from worker_proc.logits.row import RowSampling
    from worker_proc.model.forward import decode_logits
    from worker_proc.model.loader import load
    from worker_proc.model.running_batch import RunningBatch

    loaded = load(resolve_model(a.model), a.load_format)
    model, rng = loaded.model, random.Random(0)
    lengths = [rng.randint(a.min_len, a.max_len) for _ in range(a.batch)]
    cache = batch_cache(model, lengths, loaded.dtype)
    tokens = mx.array([1] * a.batch, dtype=mx.int32)
    times: dict[str, list[float]] = {
        "decode step": [],
        "join one row": [],
        "leave one row": [],
        "leave one row, RunningBatch": [],
        "join one row, RunningBatch": [],
    }
    batch = RunningBatch(loaded.vocab_size)
    greedy = RowSampling.start(SamplingParams(temperature=0.0), loaded.vocab_size)
    batch.append(
        [f"r{i}" for i in range(a.batch)],
        batch_cache(model, lengths, loaded.dtype),
        tokens,
        [greedy] * a.batch,
        lengths,
        None,
    )
    for k in range(a.rounds):
        t0 = time.perf_counter()
        mx.eval(mx.argmax(decode_logits(model, tokens, cache), axis=-1))
        times["decode step"].append(time.perf_counter() - t0)
        row = batch_cache(model, [rng.randint(a.min_len, a.max_len)], loaded.dtype)
        t0 = time.perf_counter()
        for mine, theirs in zip(cache, row):
            mine.extend(theirs)
        mx.eval([(c.keys, c.values) for c in cache])
        times["join one row"].append(time.perf_counter() - t0)
        keep = mx.array(list(range(1, a.batch + 1)), dtype=mx.int32)
        t0 = time.perf_counter()
        for c in cache:
            c.filter(keep)
        mx.eval([(c.keys, c.values) for c in cache])
        times["leave one row"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        batch.drop({batch.rids[0]})
        mx.eval([(c.keys, c.values) for c in batch.cache])
        times["leave one row, RunningBatch"].append(time.perf_counter() - t0)
        n = rng.randint(a.min_len, min(a.max_len, batch.cache[0]._idx))
        row = batch_cache(model, [n], loaded.dtype)
        t0 = time.perf_counter()
        batch.append([f"j{k}"], row, tokens[:1], [greedy], [n], None)
        mx.eval([(c.keys, c.values) for c in batch.cache], batch.last_tokens)
        times["join one row, RunningBatch"].append(time.perf_counter() - t0)
    step = statistics.median(times["decode step"])
    churn = {
        k: (statistics.median(times[f"join one row{k}"]) + statistics.median(times[f"leave one row{k}"]))
        * a.batch
        / a.output_len
        for k in ("", ", RunningBatch")
    }
    print(f"device: {mx.default_device()}; batch {a.batch}, KV lengths {a.min_len}-{a.max_len}, {a.rounds} rounds")
    print("| operation | median ms | vs one decode step |")
    print("|---|---|---|")
    for k, v in times.items():
        print(f"| {k} | {statistics.median(v) * 1e3:.2f} | {statistics.median(v) / step:.2f} |")
    for k, v in churn.items():
        print(f"| joins + leaves per step at {a.output_len}-token outputs{k} | {v * 1e3:.2f} | {v / step:.2f} |")


if __name__ == "__main__":
    main()
