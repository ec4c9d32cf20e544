"""Warm-up: a dummy request through the model runner before the worker reports ready.

The first forward passes of a process pay once for what later ones reuse (MLX's buffer
allocations, the BLAS thread pool, GPU kernels compiled on first use), which made the
first request after ``lazyserve ready`` about 1.6x slower than the second on the CPU.
`warm_up` pays it at start-up instead, through the path real requests take: for each
dummy request, alone (a one-row batch, the shapes of a first request: the BLAS has
per-shape first-call costs), an EXTEND launch, then DECODE launches, each finalized, on a
`ModelRunner` of its own, so none of its state (rows, launch ids, trace) reaches the
runner that serves.

With the server's KV pool, it then takes the radix cache's path too (`warm_pool`): a
request's KV stored into the pool, a second request prefilled after that cached prefix
(gathered from the pool) while the first still decodes, the two decoded together, one
dropped (for a model with recurrent layers, through a state snapshot as the scheduler's
state pool keeps them). On the H200 the first launch of a fresh server that met a cached prefix took
3.5 s (MLX's CUDA backend preparing the gather, scatter and batch-join kernels on first
use): the first wave of 64 chat requests had a TTFT p50 of 3.6 s, the next 0.39 s. The slots
it writes are free then (the scheduler has allocated none before ready) and nothing reads
them until a real request's KV is stored there.
"""

from __future__ import annotations

import time

import mlx.core as mx
import msgspec

from protocol.enums import ForwardMode
from protocol.messages import ForwardBatch, SamplingParams
from protocol.token_mask import mask_words
from worker_proc.memory.kv_pool import KVPool
from worker_proc.memory.state_pool import StatePool
from worker_proc.model.decode_graph import DecodeGraph
from worker_proc.model.loader import LoadedModel
from worker_proc.model.runner import ModelRunner

PROMPT_TOKENS = 32
"""Length of the dummy prompt, about that of a short chat request with its template."""
DECODE_STEPS = 4
EDITED = "lazyserve-warmup-edited"
"""Request id of the dummy row that takes every part of the logits pipeline at once."""
ROWS = {
    "lazyserve-warmup-greedy": SamplingParams(temperature=0.0),
    "lazyserve-warmup-sampled": SamplingParams(seed=0),
    EDITED: SamplingParams(
        seed=0,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        logit_bias={1: 1.0},
        frequency_penalty=0.5,
        presence_penalty=0.5,
        repetition_penalty=1.1,
        min_tokens=DECODE_STEPS,
        min_tokens_ids=[0],
        top_logprobs=5,
        token_ids_logprob=[1],
        logprob_start_len=0,
    ),
}
"""Request ids and sampling of the dummy rows: greedy, the API's default sampling
(temperature 1), and `EDITED`: top-p/top-k/min-p, a logit bias, the three penalties,
min_tokens, output and prompt logprobs, and (in every launch) a grammar mask, so that each of
those graphs has run (on a GPU each meets kernels of its own: a first request asking for
logprobs or a JSON schema would otherwise prepare them while every running request waits)."""
CACHED_ROWS = ("lazyserve-warmup-stored", "lazyserve-warmup-cached")
"""Request ids of `warm_pool`'s two rows: the one stored into the pool, the one prefilled
after its cached prefix."""


def warm_up(
    loaded: LoadedModel,
    graph: DecodeGraph | None = None,
    pool: KVPool | None = None,
    states: StatePool | None = None,
    kernels: bool | None = None,
) -> float:
    """For each of the `ROWS` in turn (with `kernels` false, the greedy and sampled rows only):
    prefill `PROMPT_TOKENS` dummy tokens, decode `DECODE_STEPS` steps, drop the row; then, with
    `pool` (and, for a model with recurrent layers, the state pool `states`) and `kernels`,
    `warm_pool`; then `mx.clear_cache()`. With `graph`, the decode steps capture its one-row
    step (the first request's). kernels: whether the device prepares a kernel the first time a
    process meets it (default: on a GPU; MLX's CPU backend has no per-kernel first-use cost
    outside captured steps, so there the `EDITED` row and the pool path only add start-up, about
    1.8 s of every server's 3.1 s warm-up on the 2-core CPU). Returns the seconds it took.

    Raises what the runner raises (`ValueError` from a launch, `RuntimeError` from a
    finalize): a model that cannot serve this request cannot serve any.
    """
    t0 = time.perf_counter()
    runner = ModelRunner(loaded, graph=graph, pool=pool, states=states)
    prompt = [1 + i % (loaded.vocab_size - 1) for i in range(PROMPT_TOKENS)]
    launch_id = 0
    kernels = mx.default_device() != mx.cpu if kernels is None else kernels
    for rid, params in ROWS.items():
        if rid == EDITED and not kernels:
            continue
        mask = open_mask(loaded.vocab_size) if rid == EDITED else None
        launch_id = _run(runner, launch_id, ForwardBatch([rid], [prompt], [params], [True]), [rid], mask=mask)
        runner.abort([rid])
    if pool is not None and kernels:
        warm_pool(runner, loaded, pool, prompt, launch_id, states)
    mx.clear_cache()
    return time.perf_counter() - t0


def warm_pool(
    runner: ModelRunner,
    loaded: LoadedModel,
    pool: KVPool,
    prompt: list[int],
    launch_id: int,
    states: StatePool | None = None,
) -> bool:
    """The radix cache's path through `runner` (whose pools are `pool` and `states`), as in
    the module doc: the first of `CACHED_ROWS` prefills `prompt` (a model with recurrent
    layers snapshotting its state after the first half into state slot 1) and decodes, its
    prompt's KV is stored at pool slots 1..len(prompt); the second prefills the second half of
    `prompt` after the first half gathered from those slots (and the state restored from slot
    1), joining the running batch; both decode `DECODE_STEPS` steps, the first is dropped, the
    second decodes once more and is dropped. Launch ids follow `launch_id`. Returns False,
    doing nothing, when the pool has fewer slots than `prompt`, or the model has recurrent
    layers and no state pool (then no prefix is ever cached); True when it ran.

    Raises what the runner raises (see `warm_up`)."""
    recurrent = bool(loaded.caches.snapshot)
    if pool.size < len(prompt) or (recurrent and not (states and states.size)):
        return False
    stored, cached = CACHED_ROWS
    slots = list(range(1, len(prompt) + 1))
    half = len(prompt) // 2
    saves = {"state_save_at": [[half]], "state_save_slots": [[1]]} if recurrent else {}
    restores = {"state_restores": [1]} if recurrent else {}
    launch_id = _run(
        runner,
        launch_id,
        ForwardBatch([stored], [prompt], [SamplingParams(temperature=0.0)], [True], **saves),
        [stored],
    )
    runner.store([stored], [0], [slots])
    launch_id = _run(
        runner,
        launch_id,
        ForwardBatch(
            [cached], [prompt[half:]], [SamplingParams(seed=0)], [True], prefix_slots=[slots[:half]], **restores
        ),
        [stored, cached],
    )
    runner.abort([stored])
    _run(runner, launch_id, None, [cached], steps=1)
    runner.abort([cached])
    mx.eval(pool.arrays(), states.arrays() if states else [])
    return True


def open_mask(vocab: int) -> bytes:
    """A packed grammar mask (`protocol.token_mask` layout) allowing every token of `vocab`."""
    return b"\xff" * (4 * mask_words(vocab))


def _run(
    runner: ModelRunner,
    launch_id: int,
    extend: ForwardBatch | None,
    rows: list[str],
    steps: int = DECODE_STEPS,
    mask: bytes | None = None,
) -> int:
    """Launch and finalize `extend` (an EXTEND batch; None: none), then `steps` DECODE
    launches of the running `rows`, with launch ids after `launch_id`; with `mask`, every
    launch sends it as the grammar mask of its row 0. Returns the last launch id."""
    grammar = {"grammar_rows": [0], "grammar_masks": [mask]} if mask is not None else {}
    if extend is not None:
        launch_id += 1
        runner.launch(launch_id, ForwardMode.EXTEND, msgspec.structs.replace(extend, **grammar))
        runner.finalize(launch_id)
    for _ in range(steps):
        launch_id += 1
        runner.launch(launch_id, ForwardMode.DECODE, ForwardBatch(rows, **grammar))
        runner.finalize(launch_id)
    return launch_id
