"""Warm-up: a dummy request through the model runner before the worker reports ready.

The first forward passes of a process pay once for what later ones reuse (MLX's buffer
allocations, the BLAS thread pool, GPU kernels compiled on first use), which made the
first request after ``lazyserve ready`` about 1.6x slower than the second on the CPU.
`warm_up` pays it at start-up instead, through the path real requests take: an EXTEND
launch, then DECODE launches, each finalized, on a `ModelRunner` of its own, so none of
its state (rows, launch ids, trace) reaches the runner that serves.
"""

from __future__ import annotations

import time

import mlx.core as mx

from protocol.enums import ForwardMode
from protocol.messages import ForwardBatch, SamplingParams
from worker_proc.model_loader import LoadedModel
from worker_proc.model_runner import ModelRunner

PROMPT_TOKENS = 32
"""Length of the dummy prompt, about that of a short chat request with its template."""
DECODE_STEPS = 4
ROWS = {"lazyserve-warmup-greedy": SamplingParams(temperature=0.0),
        "lazyserve-warmup-sampled": SamplingParams(seed=0)}
"""Request ids and sampling of the dummy rows: greedy, and the API's default sampling
(temperature 1), so that both the argmax and the noise graphs have run."""


def warm_up(loaded: LoadedModel) -> float:
    """Prefill `PROMPT_TOKENS` dummy tokens in the `ROWS`, decode `DECODE_STEPS` steps,
    drop the rows, then `mx.clear_cache()`; returns the seconds it took.

    Raises what the runner raises (`ValueError` from a launch, `RuntimeError` from a
    finalize): a model that cannot serve this request cannot serve any.
    """
    t0 = time.perf_counter()
    runner = ModelRunner(loaded)
    rids = list(ROWS)
    prompt = [1 + i % (loaded.vocab_size - 1) for i in range(PROMPT_TOKENS)]
    runner.launch(1, ForwardMode.EXTEND, ForwardBatch(rids, [prompt] * len(rids), list(ROWS.values()),
                                                       [True] * len(rids)))
    runner.finalize(1)
    for launch_id in range(2, 2 + DECODE_STEPS):
        runner.launch(launch_id, ForwardMode.DECODE, ForwardBatch(rids))
        runner.finalize(launch_id)
    runner.abort(rids)
    mx.clear_cache()
    return time.perf_counter() - t0
