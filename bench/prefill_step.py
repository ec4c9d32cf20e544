"""Prefill speed by model-call length (`worker_proc.model.forward.prefill_step`), side by side.

Prefills one prompt of `--tokens` tokens through the worker's `prefill_rows` with
calls of each `--steps` length, alternating, `--rounds` times; prints the median seconds
and tokens/s of each and the ratio to the first step.

    python bench/prefill_step.py [--model PATH] [--load-format dummy] [--tokens 2048] [--steps 2048 512]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--steps", type=int, nargs="+", default=[2048, 512])
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    from worker_proc.cpu.blas import reexec_env

    if (env := reexec_env()) is not None:
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from protocol.model_source import resolve_model
    from worker_proc.model import batched_prefill
    from worker_proc.model.loader import load

    model = load(resolve_model(a.model), a.load_format).model
    ids = [100 + (i * 37) % 30000 for i in range(a.tokens)]
    times: dict[int, list[float]] = {s: [] for s in a.steps}
    for _ in range(a.rounds):
        for step in a.steps:
            with mock.patch.object(batched_prefill, "prefill_step", lambda step=step: step):
                cache = make_prompt_cache(model)
                t0 = time.perf_counter()
                mx.eval(batched_prefill.prefill_rows(model, [ids], [cache]))
                times[step].append(time.perf_counter() - t0)
    base = statistics.median(times[a.steps[0]])
    print(f"device: {mx.default_device()}; {a.tokens} tokens; {a.rounds} rounds, alternating")
    print("| call length | median s | tok/s | speed vs first |")
    print("|---|---|---|---|")
    for step in a.steps:
        med = statistics.median(times[step])
        print(f"| {step} | {med:.2f} | {a.tokens / med:.0f} | {base / med:.2f}x |")


if __name__ == "__main__":
    main()
