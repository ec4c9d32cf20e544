"""Fused q/k/v and gate/up projections against separate ones, paired in one process.

Loads the model twice, one copy with `worker_proc.model.fused_projections.fuse_projections`
applied, and for each batch size alternates, for `--rounds` rounds: the raw mlx-lm loop
(`bench.raw_decode.decode_rate`) on each copy, and the worker's `ModelRunner` with its
captured decode step (overlapped, as served) on each. Prints decode tok/s medians, the
fused / separate ratios, and the share of greedy tokens equal between the copies over
`--steps` steps of the raw loop (bf16 products of other shapes may round differently):

    python bench/fused_projections.py [--model PATH] [--load-format dummy] [--batch 1,16,64]
        [--input-len 43] [--steps 64] [--rounds 3]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cli import model_parser  # noqa: E402
from bench.decode_graph import alternated_rates, time_decode  # noqa: E402
from bench.raw_decode import decode_rate  # noqa: E402


def greedy_tokens(model, batch: int, input_len: int, steps: int, vocab_size: int) -> list[list[int]]:
    """`steps` greedy tokens [batch][steps] of `batch` random prompts (seed 0) through `model`."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    mx.random.seed(0)
    prompts = mx.random.randint(0, vocab_size, (batch, input_len))
    cache = [BatchKVCache([0] * batch) for _ in model.layers]
    y = mx.argmax(model(prompts, cache=cache)[:, -1], axis=-1)
    out = [y]
    for _ in range(steps - 1):
        y = mx.argmax(model(y[:, None], cache=cache)[:, -1], axis=-1)
        out.append(y)
    return mx.stack(out, axis=1).tolist()


def main() -> None:
    p = model_parser(__doc__)
    p.add_argument("--batch", default="1,16,64")
    p.add_argument("--input-len", type=int, default=43)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()

    import mlx.core as mx
    from mlx.utils import tree_flatten

    from protocol.model_source import resolve_model
    from worker_proc.model.decode_graph import DecodeGraph
    from worker_proc.model.fused_projections import fuse_projections
    from worker_proc.model.loader import load
    from worker_proc.model.runner import ModelRunner

    source = resolve_model(a.model)
    batches = [int(b) for b in a.batch.split(",")]
    separate = load(source, a.load_format)
    fused = load(source, a.load_format)
    fused.model.load_weights(tree_flatten(separate.model.parameters()))
    groups = fuse_projections(fused.model)
    vocab = separate.vocab_size
    runs = {}
    for name, loaded in (("separate", separate), ("fused", fused)):
        runner = ModelRunner(loaded, graph=DecodeGraph(loaded.model, max(batches)))
        runs[f"raw {name}"] = lambda b, n, m=loaded.model: decode_rate(m, b, a.input_len, n, vocab)
        runs[f"runner {name}"] = lambda b, n, r=runner: b / time_decode(r, b, a.input_len, n, vocab, overlap=True)
    rates = alternated_rates(runs, batches, a.steps, a.rounds)
    print(
        f"device: {mx.default_device()}; {groups} groups fused; input {a.input_len} tokens, "
        f"{a.steps} steps, {a.rounds} rounds"
    )
    print(
        "| batch | " + " | ".join(f"{k} tok/s" for k in runs) + " | raw fused/separate | runner fused/separate "
        "| greedy tokens equal |"
    )
    print("|---|" + "---|" * (len(runs) + 3))
    for b in batches:
        med = {k: statistics.median(rates[k, b]) for k in runs}
        ref = greedy_tokens(separate.model, b, a.input_len, a.steps, vocab)
        got = greedy_tokens(fused.model, b, a.input_len, a.steps, vocab)
        equal = sum(x == y for r, g in zip(ref, got) for x, y in zip(r, g)) / (b * a.steps)
        cells = [f"{med[k]:,.0f}" for k in runs]
        print(
            f"| {b} | " + " | ".join(cells) + f" | {med['raw fused'] / med['raw separate']:.2f} | "
            f"{med['runner fused'] / med['runner separate']:.2f} | {equal:.1%} |"
        )


if __name__ == "__main__":
    main()
