"""The CUDA kernels one steady decode step launches, and their device time, per runner.

A GPU decode step of a small model is bound either by the device (the kernels' own time) or
by the host thread that launches them (their count times the cost of one launch). This script
runs `--steps` steady greedy decode steps of `--batch` rows, after a prefill and 8 warm-up
steps (traces made, kernels prepared), inside the CUDA profiler's window
(``cuProfilerStart``/``cuProfilerStop``), so that Nsight Compute counts only those steps:

    ncu --clock-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \\
        --log-file OUT.csv python bench/step_kernels.py --runner R --model DIR --load-format dummy
    python bench/step_kernels.py --summarize OUT.csv --steps N

Runners (as in `bench/decode_gap.py`): ``raw`` (mlx-lm's `BatchKVCache` + ``argmax``),
``graph`` (`DecodeGraph`'s captured step + ``argmax``), ``runner`` (the worker's
`ModelRunner` with the captured step), ``uncompiled`` (`ModelRunner` without it). Each step
is evaluated before the next is built, so the window holds exactly `--steps` steps. Without
ncu it prints the window's wall time per step.
"""

from __future__ import annotations

import csv
import ctypes
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cli import model_parser  # noqa: E402

WARM_STEPS = 8


def profiler(start: bool) -> None:
    """Open (`start`) or close the CUDA profiler's window through the driver API; nothing
    where no CUDA driver is loaded."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return
    (lib.cuProfilerStart if start else lib.cuProfilerStop)()


def model_steps(model, step, batch: int, input_len: int, vocab: int):
    """A function running one greedy step of `batch` rows prefilled with `input_len` random
    tokens through `model`'s mlx-lm `BatchKVCache`s; `step(tokens [B], cache) -> logits
    [B, V]` is the step (None: the model uncompiled)."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache

    cache = [BatchKVCache([0] * batch) for _ in model.layers]
    prompts = mx.random.randint(0, vocab, (batch, input_len))
    state = {"y": mx.argmax(model(prompts, cache=cache)[:, -1], axis=-1).astype(mx.int32)}
    step = step or (lambda tokens, c: model(tokens[:, None], cache=c)[:, -1])

    def one() -> None:
        state["y"] = mx.argmax(step(state["y"], cache), axis=-1).astype(mx.int32)
        mx.eval(state["y"])

    return one


def runner_steps(runner, batch: int, input_len: int, vocab: int):
    """A function running one DECODE launch + finalize of `runner` (a `ModelRunner`) over
    `batch` rows it prefilled with `input_len`-token prompts."""
    from protocol.enums import ForwardMode
    from protocol.messages import ForwardBatch, SamplingParams

    rids = [f"r{i}" for i in range(batch)]
    prompts = [[1 + (i * 131 + j * 17) % (vocab - 1) for j in range(input_len)] for i in range(batch)]
    runner.launch(
        1, ForwardMode.EXTEND, ForwardBatch(rids, prompts, [SamplingParams(temperature=0.0)] * batch, [True] * batch)
    )
    runner.finalize(1)
    lid = [1]

    def one() -> None:
        lid[0] += 1
        runner.launch(lid[0], ForwardMode.DECODE, ForwardBatch(rids))
        runner.finalize(lid[0])

    return one


def summarize(path: Path, steps: int) -> list[str]:
    """Markdown lines from an ncu ``--csv`` log of ``gpu__time_duration.sum``: kernels and
    device microseconds per step, and the kernels that take the most time."""
    rows = [
        r
        for r in csv.DictReader(line for line in path.read_text().splitlines() if line.startswith('"'))
        if r.get("Metric Name") == "gpu__time_duration.sum"
    ]
    by_name: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[r["Metric Unit"]]
        by_name[r["Kernel Name"][:80]].append(float(r["Metric Value"].replace(",", "")) * scale)
    total = sum(sum(v) for v in by_name.values())
    lines = [
        f"{len(rows) / steps:.0f} kernels and {total / steps:.0f} us of device time per step",
        "",
        "| kernel | launches per step | us per step |",
        "|---|---|---|",
    ]
    for name, v in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:15]:
        lines.append(f"| `{name}` | {len(v) / steps:.1f} | {sum(v) / steps:.1f} |")
    return lines


def main() -> None:
    p = model_parser(__doc__)
    p.add_argument("--runner", default="runner", choices=["raw", "graph", "runner", "uncompiled"])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--input-len", type=int, default=43)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--summarize", default=None, help="an ncu --csv log to summarize (then nothing runs)")
    a = p.parse_args()
    if a.summarize:
        print("\n".join(summarize(Path(a.summarize), a.steps)))
        return

    import mlx.core as mx

    from protocol.enums import ForwardMode
    from protocol.model_source import resolve_model
    from worker_proc.model.decode_graph import DecodeGraph
    from worker_proc.model.loader import load
    from worker_proc.model.runner import ModelRunner

    loaded = load(resolve_model(a.model), a.load_format)
    vocab = loaded.vocab_size
    if a.runner in ("raw", "graph"):
        graph = DecodeGraph(loaded.model, a.batch) if a.runner == "graph" else None
        step = (lambda y, c: graph.run(ForwardMode.DECODE, y, c)) if graph else None
        one = model_steps(loaded.model, step, a.batch, a.input_len, vocab)
    else:
        graph = DecodeGraph(loaded.model, a.batch) if a.runner == "runner" else None
        one = runner_steps(ModelRunner(loaded, graph=graph), a.batch, a.input_len, vocab)
    for _ in range(WARM_STEPS):
        one()
    mx.synchronize()
    profiler(True)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        one()
    mx.synchronize()
    elapsed = time.perf_counter() - t0
    profiler(False)
    print(
        f"{a.runner}: batch {a.batch}, {a.steps} steps, {elapsed / a.steps * 1e3:.2f} ms/step (wall, steps "
        f"evaluated one by one) on {mx.default_device()}"
    )


if __name__ == "__main__":
    main()
