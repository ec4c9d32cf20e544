"""Where a served decode step loses to the raw mlx-lm loop, measured in one process, paired.

For each batch size B, B prompts of `--input-len` tokens are prefilled and `--steps` greedy
steps timed, alternating for `--rounds` rounds, by five runners of increasing distance from
the raw loop (`bench.raw_decode.decode_rate`):

- ``raw``: mlx-lm's `BatchKVCache`, ``argmax``, one step queued ahead (the ceiling);
- ``graph+argmax``: the same loop through `DecodeGraph`'s captured step (fixed-capacity KV,
  mask over the capacity) and a plain ``argmax`` (what capture itself costs or saves);
- ``runner``: the worker's `ModelRunner` (captured step + the sampling pipeline + running
  batch bookkeeping), chained as the overlap schedule runs it: step N+1 built and queued
  (``chain_decode``) before step N is finalized;
- ``runner sync``: the same, each step finalized before the next is built (no overlap);
- ``runner uncompiled``: ``runner`` without the captured step.

Prints decode tok/s medians and each runner's ratio to ``raw``:

    python bench/decode_gap.py [--model PATH] [--load-format dummy] [--batch 16,64]
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


def main() -> None:
    p = model_parser(__doc__)
    p.add_argument("--batch", default="16,64")
    p.add_argument("--input-len", type=int, default=43)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()

    import mlx.core as mx

    from protocol.enums import ForwardMode
    from protocol.model_source import resolve_model
    from worker_proc.model.decode_graph import DecodeGraph
    from worker_proc.model.loader import load
    from worker_proc.model.runner import ModelRunner

    loaded = load(resolve_model(a.model), a.load_format)
    model, vocab = loaded.model, loaded.vocab_size
    batches = [int(b) for b in a.batch.split(",")]
    graph = DecodeGraph(model, max(batches))
    compiled, uncompiled = ModelRunner(loaded, graph=graph), ModelRunner(loaded)
    runs = {
        "raw": lambda b, n: decode_rate(model, b, a.input_len, n, vocab),
        "graph+argmax": lambda b, n: decode_rate(
            model, b, a.input_len, n, vocab, step=lambda y, c: graph.run(ForwardMode.DECODE, y, c)
        ),
        "runner": lambda b, n: b / time_decode(compiled, b, a.input_len, n, vocab, overlap=True),
        "runner sync": lambda b, n: b / time_decode(compiled, b, a.input_len, n, vocab),
        "runner uncompiled": lambda b, n: b / time_decode(uncompiled, b, a.input_len, n, vocab, overlap=True),
    }
    rates = alternated_rates(runs, batches, a.steps, a.rounds)
    print(f"device: {mx.default_device()}; input {a.input_len} tokens, {a.steps} steps, {a.rounds} rounds")
    print("| batch | " + " | ".join(f"{k} tok/s (vs raw)" for k in runs) + " |")
    print("|---|" + "---|" * len(runs))
    for b in batches:
        raw = statistics.median(rates["raw", b])
        cells = [f"{statistics.median(rates[k, b]):,.0f} ({statistics.median(rates[k, b]) / raw:.2f})" for k in runs]
        print(f"| {b} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
