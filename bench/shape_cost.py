"""What a new prefill shape costs, first time against second (issue 13).

Runs EXTEND launches of the worker's `ModelRunner` (rows x prompt tokens, no cached prefix)
followed by one DECODE, each shape twice in a row, and prints the milliseconds of each. On
MLX's CUDA backend the first call of a shape prepares its kernels; the bucketing of
`worker_proc.model.batched_prefill` and the warm-up of `worker_proc.model.shape_warmup` exist because
of this cost. `--no-buckets` measures the unbucketed shapes.

    python bench/shape_cost.py [--model PATH] [--load-format dummy] [--shapes 16x43,16x50,17x43,33x90]
        [--no-buckets]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cli import model_parser  # noqa: E402


def main() -> None:
    p = model_parser(__doc__)
    p.add_argument("--shapes", default="16x43,16x50,16x61,17x43,23x43,32x43,33x90,16x300")
    p.add_argument("--no-buckets", action="store_true")
    a = p.parse_args()

    import mlx.core as mx

    from protocol.enums import ForwardMode
    from protocol.messages import ForwardBatch, SamplingParams
    from protocol.model_source import resolve_model
    from worker_proc.model import batched_prefill
    from worker_proc.model.loader import load
    from worker_proc.model.runner import ModelRunner

    loaded = load(resolve_model(a.model), a.load_format)
    runner = ModelRunner(loaded)
    lid = 0
    print(f"device: {mx.default_device()}; buckets {'off' if a.no_buckets else 'as the server runs them'}")
    print("| rows x tokens | prefill ms, 1st | prefill ms, 2nd | decode ms, 1st | decode ms, 2nd |")
    print("|---|---|---|---|---|")
    with mock.patch.object(
        batched_prefill, "buckets_on", (lambda: False) if a.no_buckets else batched_prefill.buckets_on
    ):
        for shape in a.shapes.split(","):
            rows, width = (int(x) for x in shape.split("x"))
            cells = []
            for rep in range(2):
                rids = [f"r{rep}-{i}" for i in range(rows)]
                prompts = [
                    [1 + (i * 131 + j * 17) % (loaded.vocab_size - 1) for j in range(width)] for i in range(rows)
                ]
                lid += 1
                t0 = time.perf_counter()
                runner.launch(
                    lid,
                    ForwardMode.EXTEND,
                    ForwardBatch(rids, prompts, [SamplingParams(temperature=0.0)] * rows, [True] * rows),
                )
                runner.finalize(lid)
                t1 = time.perf_counter()
                lid += 1
                runner.launch(lid, ForwardMode.DECODE, ForwardBatch(rids))
                runner.finalize(lid)
                cells.append(((t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3))
                runner.abort(rids)
            print(f"| {shape} | {cells[0][0]:.1f} | {cells[1][0]:.1f} | {cells[0][1]:.1f} | {cells[1][1]:.1f} |")


if __name__ == "__main__":
    main()
