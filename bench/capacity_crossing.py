"""What a decode batch pays as its KV grows across capacities, per capacity step.

`worker_proc.model.decode_graph.DecodeGraph` replays a trace per (batch size, KV capacity), the
capacities a multiple of its capacity step: a larger step means fewer new traces on the
serving path and more masked positions read every step. This prefills B random prompts of
`--input-len` tokens, then runs `--steps` greedy captured steps with a fresh graph (so every
capacity the batch reaches is met for the first time on the timed path, as on a server whose
warm-up traced only the first), synchronously, for each capacity step, and the raw mlx-lm
loop (`BatchKVCache`, uncompiled) beside them. Prints ms/step mean (what a stream's rate
sees) and median, the steps over 3x the median (position, ms), and whether each run's
tokens equal the first capacity step's.

    python bench/capacity_crossing.py [--model PATH] [--load-format dummy] [--batch 16,64]
        [--input-len 43] [--steps 448] [--capacity-step 64,32]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cli import model_parser  # noqa: E402


def run_steps(model, vocab: int, batch: int, input_len: int, steps: int, step) -> tuple[list[float], list[list[int]]]:
    """Per-step seconds and the greedy tokens ([steps][batch]) of `steps` synchronous decode
    steps of `batch` random prompts (seed 0) through ``step(tokens int32 [B], cache) ->
    logits [B, V]``, after a prefill into mlx-lm's `BatchKVCache`."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    mx.random.seed(0)
    cache = [BatchKVCache([0] * batch) for _ in model.layers]
    y = mx.argmax(model(mx.random.randint(0, vocab, (batch, input_len)), cache=cache)[:, -1], axis=-1).astype(mx.int32)
    mx.eval(y)
    times, tokens = [], []
    for _ in range(steps):
        t = time.perf_counter()
        y = mx.argmax(step(y, cache), axis=-1).astype(mx.int32)
        tokens.append(y.tolist())
        times.append(time.perf_counter() - t)
    return times, tokens


def main() -> None:
    p = model_parser(__doc__)
    p.add_argument("--batch", default="16,64")
    p.add_argument("--input-len", type=int, default=43)
    p.add_argument("--steps", type=int, default=448)
    p.add_argument("--capacity-step", default="64,32")
    a = p.parse_args()

    import mlx.core as mx

    from protocol.enums import ForwardMode
    from protocol.model_source import resolve_model
    from worker_proc.model.decode_graph import DecodeGraph
    from worker_proc.model.loader import load

    loaded = load(resolve_model(a.model), a.load_format)
    model, vocab = loaded.model, loaded.vocab_size
    print(f"device: {mx.default_device()}; input {a.input_len} tokens, {a.steps} synchronous steps")
    print("| batch | run | ms/step mean | ms/step median | spikes (position, ms) | tokens equal the first step's |")
    print("|---|---|---|---|---|---|")
    for b in (int(x) for x in a.batch.split(",")):
        raw = lambda y, c: model(y[:, None], cache=c)[:, -1]  # noqa: E731
        run_steps(model, vocab, b, a.input_len, 4, raw)  # kernels ready
        runs = {"raw mlx-lm loop": raw}
        for cap in (int(x) for x in a.capacity_step.split(",")):
            graph = DecodeGraph(model, b, cap)
            runs[f"captured, capacity step {cap}"] = lambda y, c, g=graph: g.run(ForwardMode.DECODE, y, c)
        reference = None
        for name, step in runs.items():
            times, tokens = run_steps(model, vocab, b, a.input_len, a.steps, step)
            if name.startswith("captured") and reference is None:
                reference = tokens
            med = statistics.median(times)
            spikes = [(a.input_len + i, round(t * 1e3, 1)) for i, t in enumerate(times) if t > 3 * med]
            same = (
                ""
                if reference is None
                else (
                    "yes"
                    if tokens == reference
                    else f"{sum(x == y for x, y in zip(tokens, reference))}/{a.steps} steps"
                )
            )
            print(f"| {b} | {name} | {statistics.mean(times) * 1e3:.2f} | {med * 1e3:.2f} | {spikes} | {same} |")


if __name__ == "__main__":
    main()
