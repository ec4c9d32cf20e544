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
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cli import model_parser  # noqa: E402
from bench.raw_decode import decode_rate  # noqa: E402


def graph_argmax_rate(graph, model, batch: int, input_len: int, steps: int, vocab: int) -> float:
    """Decode tok/s of `DecodeGraph.run` + ``argmax``, one step queued ahead (as `decode_rate`)."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    from protocol.enums import ForwardMode

    prompts = mx.random.randint(0, vocab, (batch, input_len))
    cache = [BatchKVCache([0] * batch) for _ in model.layers]
    y = mx.argmax(model(prompts, cache=cache)[:, -1], axis=-1).astype(mx.int32)
    mx.eval(y)
    t0 = time.perf_counter()
    for _ in range(steps):
        nxt = mx.argmax(graph.run(ForwardMode.DECODE, y, cache), axis=-1).astype(mx.int32)
        mx.async_eval(nxt)
        y.tolist()
        y = nxt
    y.tolist()
    return batch * steps / (time.perf_counter() - t0)


def runner_rate(runner, batch: int, input_len: int, steps: int, vocab: int, overlap: bool) -> float:
    """Decode tok/s of `steps` DECODE launches of `runner` (a `ModelRunner`) after a prefill
    of `batch` prompts; `overlap`: chain step N+1 before finalizing step N."""
    from protocol.enums import ForwardMode
    from protocol.messages import ForwardBatch, SamplingParams

    rids = [f"r{i}" for i in range(batch)]
    prompts = [[1 + (i * 131 + j * 17) % (vocab - 1) for j in range(input_len)] for i in range(batch)]
    runner.launch(1, ForwardMode.EXTEND, ForwardBatch(rids, prompts, [SamplingParams(temperature=0.0)] * batch,
                                                      [True] * batch))
    runner.finalize(1)
    t0 = time.perf_counter()
    if overlap:
        runner.launch(2, ForwardMode.DECODE, ForwardBatch(rids))
        for lid in range(3, steps + 2):
            runner.chain_decode(lid, lid - 1)
            runner.finalize(lid - 1)
        runner.finalize(steps + 1)
    else:
        for lid in range(2, steps + 2):
            runner.launch(lid, ForwardMode.DECODE, ForwardBatch(rids))
            runner.finalize(lid)
    elapsed = time.perf_counter() - t0
    runner.abort(rids)
    return batch * steps / elapsed


def main() -> None:
    p = model_parser(__doc__)
    p.add_argument("--batch", default="16,64")
    p.add_argument("--input-len", type=int, default=43)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()

    import mlx.core as mx

    from protocol.model_source import resolve_model
    from worker_proc.decode_graph import DecodeGraph
    from worker_proc.model_loader import load
    from worker_proc.model_runner import ModelRunner

    loaded = load(resolve_model(a.model), a.load_format)
    model, vocab = loaded.model, loaded.vocab_size
    batches = [int(b) for b in a.batch.split(",")]
    graph = DecodeGraph(model, max(batches))
    compiled, uncompiled = ModelRunner(loaded, graph=graph), ModelRunner(loaded)
    runs = {
        "raw": lambda b, n: decode_rate(model, b, a.input_len, n, vocab),
        "graph+argmax": lambda b, n: graph_argmax_rate(graph, model, b, a.input_len, n, vocab),
        "runner": lambda b, n: runner_rate(compiled, b, a.input_len, n, vocab, overlap=True),
        "runner sync": lambda b, n: runner_rate(compiled, b, a.input_len, n, vocab, overlap=False),
        "runner uncompiled": lambda b, n: runner_rate(uncompiled, b, a.input_len, n, vocab, overlap=True),
    }
    for b in batches:  # traces and kernels prepared outside the timed rounds
        for run in runs.values():
            run(b, 8)
    rates: dict[tuple[str, int], list[float]] = {(k, b): [] for k in runs for b in batches}
    for _ in range(a.rounds):
        for b in batches:
            for k, run in runs.items():
                rates[k, b].append(run(b, a.steps))
    print(f"device: {mx.default_device()}; input {a.input_len} tokens, {a.steps} steps, {a.rounds} rounds")
    print("| batch | " + " | ".join(f"{k} tok/s (vs raw)" for k in runs) + " |")
    print("|---|" + "---|" * len(runs))
    for b in batches:
        raw = statistics.median(rates["raw", b])
        cells = [f"{statistics.median(rates[k, b]):,.0f} ({statistics.median(rates[k, b]) / raw:.2f})" for k in runs]
        print(f"| {b} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
