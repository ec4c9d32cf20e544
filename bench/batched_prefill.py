"""Batched prefill against one model call per request, in one process, paired (issue 13).

Prefills `--rows` prompts of about `--input-len` tokens (lengths spread by a few tokens, as
chat prompts are) with `worker_proc.model.batched_prefill.prefill_rows`: all rows in one call, and
each row in a call of its own (what the worker did before), alternating for `--rounds`
rounds after one untimed round of each. Prints milliseconds per prefill and the ratio.

    python bench/batched_prefill.py [--model PATH] [--load-format dummy] [--rows 1,16,64]
        [--input-len 43] [--rounds 3]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cli import model_parser  # noqa: E402


def main() -> None:
    p = model_parser(__doc__)
    p.add_argument("--rows", default="1,16,64")
    p.add_argument("--input-len", type=int, default=43)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()

    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from protocol.model_source import resolve_model
    from worker_proc.model.batched_prefill import prefill_rows
    from worker_proc.model.loader import load

    model = load(resolve_model(a.model), a.load_format).model
    vocab = model.args.vocab_size

    def run(rows: int, together: bool) -> float:
        prompts = [[1 + (i * 131 + j * 17) % (vocab - 1) for j in range(a.input_len - i % 4)] for i in range(rows)]
        t0 = time.perf_counter()
        if together:
            mx.eval(prefill_rows(model, prompts, [make_prompt_cache(model) for _ in prompts]))
        else:
            mx.eval([prefill_rows(model, [ids], [make_prompt_cache(model)]) for ids in prompts])
        return time.perf_counter() - t0

    sizes = [int(r) for r in a.rows.split(",")]
    times = {(r, t): [] for r in sizes for t in (True, False)}
    for rnd in range(a.rounds + 1):
        for r in sizes:
            for together in (True, False):
                s = run(r, together)
                if rnd:
                    times[r, together].append(s)
    print(f"device: {mx.default_device()}; prompts of {a.input_len - 3}-{a.input_len} tokens, {a.rounds} rounds")
    print("| rows | one call per row, ms | one batched call, ms | speed-up |")
    print("|---|---|---|---|")
    for r in sizes:
        solo, batched = statistics.median(times[r, False]), statistics.median(times[r, True])
        print(f"| {r} | {solo * 1e3:.1f} | {batched * 1e3:.1f} | {solo / batched:.2f}x |")


if __name__ == "__main__":
    main()
