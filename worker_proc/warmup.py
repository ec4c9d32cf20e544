"""Warm-up: a dummy request through the model runner before the worker reports ready.

The first forward passes of a process pay once for what later ones reuse (MLX's buffer
allocations, the BLAS thread pool, GPU kernels compiled on first use), which made the
first request after ``lazyserve ready`` about 1.6x slower than the second on the CPU.
`warm_up` pays it at start-up instead, through the path real requests take: for each
dummy request, alone (a one-row batch, the shapes of a first request: the BLAS has
per-shape first-call costs), an EXTEND launch, then DECODE launches, each finalized, on a
`ModelRunner` of its own, so none of its state (rows, launch ids, trace) reaches the
runner that serves.
"""

from __future__ import annotations

import time

import mlx.core as mx

from protocol.enums import ForwardMode
from protocol.messages import ForwardBatch, SamplingParams
from worker_proc.decode_graph import DecodeGraph
from worker_proc.model_loader import LoadedModel
from worker_proc.model_runner import ModelRunner

PROMPT_TOKENS = 32
"""Length of the dummy prompt, about that of a short chat request with its template."""
DECODE_STEPS = 4
ROWS = {"lazyserve-warmup-greedy": SamplingParams(temperature=0.0),
        "lazyserve-warmup-sampled": SamplingParams(seed=0)}
"""Request ids and sampling of the dummy rows: greedy, and the API's default sampling
(temperature 1), so that both the argmax and the noise graphs have run."""


def warm_up(loaded: LoadedModel, graph: DecodeGraph | None = None) -> float:
    """For each of the `ROWS` in turn: prefill `PROMPT_TOKENS` dummy tokens, decode
    `DECODE_STEPS` steps, drop the row; then `mx.clear_cache()`. With `graph`, the decode
    steps capture its one-row step (the first request's). Returns the seconds it took.

    Raises what the runner raises (`ValueError` from a launch, `RuntimeError` from a
    finalize): a model that cannot serve this request cannot serve any.
    """
    t0 = time.perf_counter()
    runner = ModelRunner(loaded, graph=graph)
    prompt = [1 + i % (loaded.vocab_size - 1) for i in range(PROMPT_TOKENS)]
    launch_id = 0
    for rid, params in ROWS.items():
        launch_id += 1
        runner.launch(launch_id, ForwardMode.EXTEND, ForwardBatch([rid], [prompt], [params], [True]))
        runner.finalize(launch_id)
        for _ in range(DECODE_STEPS):
            launch_id += 1
            runner.launch(launch_id, ForwardMode.DECODE, ForwardBatch([rid]))
            runner.finalize(launch_id)
        runner.abort([rid])
    mx.clear_cache()
    return time.perf_counter() - t0
