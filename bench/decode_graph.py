"""Compiled decode (`worker_proc.model.decode_graph`) against uncompiled, in one process, paired.

The worker's `ModelRunner` prefills B prompts of `--input-len` tokens and times `--steps`
DECODE launches (launch + finalize, as the worker runs them, without IPC), once with a
`DecodeGraph` and once without, alternating for `--rounds` rounds; the captured traces are
made in a round not timed. Prints ms/step medians and the speed ratio per batch size.

    python bench/decode_graph.py [--model PATH] [--load-format dummy] [--batch 1,16,64]
        [--input-len 100] [--steps 32] [--rounds 3] [--capacity-step N]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cli import model_parser  # noqa: E402


def time_decode(runner, batch: int, input_len: int, steps: int, vocab: int, overlap: bool = False) -> float:
    """Seconds per DECODE launch of `batch` fresh rows of `runner` (a `ModelRunner`), after
    their prefill; `overlap`: chain step N+1 (``chain_decode``) before finalizing step N, as the
    overlap schedule runs it, else finalize each step before building the next."""
    from protocol.enums import ForwardMode
    from protocol.messages import ForwardBatch, SamplingParams

    rids = [f"r{i}" for i in range(batch)]
    prompts = [[1 + (i * 131 + j * 17) % (vocab - 1) for j in range(input_len)] for i in range(batch)]
    runner.launch(
        1, ForwardMode.EXTEND, ForwardBatch(rids, prompts, [SamplingParams(temperature=0.0)] * batch, [True] * batch)
    )
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
    return elapsed / steps


def alternated_rates(runs: dict, batches: list[int], steps: int, rounds: int) -> dict[tuple[str, int], list[float]]:
    """Each of `runs` (name -> ``run(batch, steps) -> tok/s``) at each batch size, once for 8
    steps untimed (traces and kernels prepared outside the timed rounds), then `rounds`
    times in turn: {(name, batch): [tok/s per round]}."""
    for b in batches:
        for run in runs.values():
            run(b, 8)
    rates: dict[tuple[str, int], list[float]] = {(k, b): [] for k in runs for b in batches}
    for _ in range(rounds):
        for b in batches:
            for k, run in runs.items():
                rates[k, b].append(run(b, steps))
    return rates


def main() -> None:
    p = model_parser(__doc__)
    p.add_argument("--batch", default="1,16,64")
    p.add_argument("--input-len", type=int, default=100)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--capacity-step", type=int, default=None)
    a = p.parse_args()

    import mlx.core as mx

    from protocol.model_source import resolve_model
    from worker_proc.model.decode_graph import DecodeGraph
    from worker_proc.model.loader import load
    from worker_proc.model.runner import ModelRunner

    loaded = load(resolve_model(a.model), a.load_format)
    batches = [int(b) for b in a.batch.split(",")]
    graph = DecodeGraph(loaded.model, max(batches), a.capacity_step)
    runners = {"compiled": ModelRunner(loaded, graph=graph), "uncompiled": ModelRunner(loaded)}
    for b in batches:  # capture (and warm both) outside the timed rounds
        for runner in runners.values():
            time_decode(runner, b, a.input_len, 4, loaded.vocab_size)
    times = {(k, b): [] for k in runners for b in batches}
    for _ in range(a.rounds):
        for b in batches:
            for k, runner in runners.items():
                times[k, b].append(time_decode(runner, b, a.input_len, a.steps, loaded.vocab_size))
    print(
        f"device: {mx.default_device()}; input {a.input_len} tokens, {a.steps} steps, {a.rounds} rounds, "
        f"capacity step {graph.capacity_step}"
    )
    print("| batch | uncompiled ms/step | compiled ms/step | compiled speed-up |")
    print("|---|---|---|---|")
    for b in batches:
        u, c = statistics.median(times["uncompiled", b]), statistics.median(times["compiled", b])
        print(f"| {b} | {u * 1e3:.2f} | {c * 1e3:.2f} | {u / c:.2f}x |")


if __name__ == "__main__":
    main()
