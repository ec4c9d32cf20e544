"""One architecture served by the worker against mlx-lm's own loops, in one process, paired
(issue 41's measures): decode and long-prompt prefill, and for sliding-window models the
KV bytes a long context holds.

- decode tok/s at each `--batch`: the worker's `ModelRunner` (its captured decode step where
  the architecture has one, launches chained as the overlap schedule runs them, no IPC)
  against the raw mlx-lm batch loop on the model's own batch caches
  (`bench.raw_decode.decode_rate`), alternating for `--rounds` rounds after an untimed one;
- prefill seconds of one `--prefill-len` prompt: the worker in EXTEND launches of
  `--chunk` tokens (the scheduler's ``--chunked-prefill-size``) against mlx-lm's
  ``generate_step`` (its prefill in steps of 2,048 tokens) up to the first token;
- with `--kv-context N` (a model with window layers): the bytes of KV one request holds at
  N positions of context, running (the running batch's buffers at their largest, growth
  capacity included, over a prefill of N tokens and decodes past a window cut, per position
  then held) and cached (the pool's full-attention layers plus window snapshots every
  `--chunk` tokens), against full-history storage (every attention layer keeping every
  position, no growth capacity).

    python bench/family_speed.py --model DIR [--load-format dummy] [--batch 1,16,64]
        [--input-len 128] [--steps 32] [--rounds 3] [--prefill-len 8192] [--chunk 2048]
        [--kv-context 8192] [--json OUT]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cli import model_parser  # noqa: E402
from bench.decode_graph import alternated_rates, time_decode  # noqa: E402
from bench.raw_decode import decode_rate  # noqa: E402


def worker_prefill(runner, ids: list[int], chunk: int) -> float:
    """Seconds for `runner` to prefill `ids` in EXTEND launches of `chunk` tokens, each
    finalized before the next (as the scheduler sends a long prompt's chunks), up to its
    first token."""
    from protocol.enums import ForwardMode
    from protocol.messages import ForwardBatch, SamplingParams

    t0 = time.perf_counter()
    for lid, start in enumerate(range(0, len(ids), chunk), 1):
        final = start + chunk >= len(ids)
        params = SamplingParams(temperature=0.0) if start == 0 else None
        runner.launch(lid, ForwardMode.EXTEND, ForwardBatch(["p"], [ids[start : start + chunk]], [params], [final]))
        runner.finalize(lid)
    elapsed = time.perf_counter() - t0
    runner.abort(["p"])
    return elapsed


def mlx_lm_prefill(model, ids: list[int]) -> float:
    """Seconds for mlx-lm's ``generate_step`` to yield the first token of `ids` (greedy)."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    t0 = time.perf_counter()
    for _ in generate_step(mx.array(ids), model, max_tokens=1, sampler=lambda x: mx.argmax(x, -1)):
        break
    return time.perf_counter() - t0


def attention_bytes_per_position(model, dtype) -> list[int]:
    """Bytes one position of KV takes in each attention layer (full or window) of `model`,
    from the caches one token leaves."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    probe = make_prompt_cache(model)
    model(mx.array([[0]], dtype=mx.int32), cache=probe)
    return [c.keys.shape[1] * (c.keys.shape[3] + c.values.shape[3]) * dtype.size for c in probe if hasattr(c, "keys")]


def kv_bytes(loaded, context: int, chunk: int) -> dict:
    """`--kv-context`'s measure (see the module doc) for one request of `context` positions."""
    import mlx.core as mx

    from protocol.enums import ForwardMode
    from protocol.messages import ForwardBatch, SamplingParams
    from worker_proc.memory.kv_pool import bytes_per_token
    from worker_proc.memory.state_pool import StatePool, state_rows
    from worker_proc.memory.window_cache import WINDOW_SLACK
    from worker_proc.model.runner import ModelRunner

    per_position = sum(attention_bytes_per_position(loaded.model, loaded.dtype))
    runner = ModelRunner(loaded)
    ids = [1 + (j * 31) % (loaded.vocab_size - 1) for j in range(context)]
    lid = 0
    for lid, start in enumerate(range(0, context, chunk), 1):
        final = start + chunk >= context
        params = SamplingParams(temperature=0.0) if start == 0 else None
        runner.launch(lid, ForwardMode.EXTEND, ForwardBatch(["k"], [ids[start : start + chunk]], [params], [final]))
        runner.finalize(lid)
    peak, at = 0, context
    for step in range(1, WINDOW_SLACK + 8):  # past a window cut
        lid += 1
        runner.launch(lid, ForwardMode.DECODE, ForwardBatch(["k"]))
        runner.finalize(lid)
        held = sum(c.keys.nbytes + c.values.nbytes for c in runner.batch.cache if hasattr(c, "keys"))
        if held > peak:
            peak, at = held, context + step
    mx.eval([c.keys for c in runner.batch.cache if hasattr(c, "keys")])
    snapshot = StatePool.bytes_per_slot(state_rows(loaded.model, loaded.caches))
    cached = bytes_per_token(loaded.model, loaded.dtype) * context + snapshot * (context // chunk + 1)
    return {
        "context": context,
        "full_history_bytes_per_position": per_position,
        "running_peak_bytes": peak,
        "running_peak_positions": at,
        "running_vs_full_history": peak / (per_position * at),
        "cached_bytes": cached,
        "cached_vs_full_history": cached / (per_position * context),
        "snapshot_bytes": snapshot,
    }


def main() -> None:
    p = model_parser(__doc__)
    p.add_argument("--batch", default="1,16,64")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--prefill-len", type=int, default=8192, help="0: no prefill measure")
    p.add_argument("--chunk", type=int, default=2048)
    p.add_argument("--kv-context", type=int, default=0, help="0: no KV bytes measure")
    p.add_argument("--json", default=None)
    p.add_argument("--no-graph", action="store_true", help="the worker's decode steps uncompiled")
    a = p.parse_args()

    import mlx.core as mx

    from protocol.model_source import resolve_model
    from worker_proc.model.decode_graph import DecodeGraph, supports
    from worker_proc.model.loader import load
    from worker_proc.model.runner import ModelRunner

    loaded = load(resolve_model(a.model), a.load_format)
    family = loaded.config.get("model_type")
    batches = [int(b) for b in a.batch.split(",")]
    graph = DecodeGraph(loaded.model, max(batches)) if supports(loaded.model) and not a.no_graph else None
    runner = ModelRunner(loaded, graph=graph)
    vocab = loaded.vocab_size
    runs = {
        "raw mlx-lm": lambda b, n: decode_rate(loaded.model, b, a.input_len, n, vocab),
        "worker": lambda b, n: b / time_decode(runner, b, a.input_len, n, vocab, overlap=True),
    }
    rates = alternated_rates(runs, batches, a.steps, a.rounds)
    out: dict = {"family": family, "device": str(mx.default_device()), "graph": graph is not None, "decode": {}}
    print(f"{family} on {mx.default_device()}: decode graph {'on' if graph else 'off'}")
    print("| batch | raw mlx-lm tok/s | worker tok/s | worker / raw |")
    print("|---|---|---|---|")
    for b in batches:
        raw, ours = statistics.median(rates["raw mlx-lm", b]), statistics.median(rates["worker", b])
        out["decode"][b] = {"raw": raw, "worker": ours, "ratio": ours / raw}
        print(f"| {b} | {raw:,.0f} | {ours:,.0f} | {ours / raw:.2f} |")
    if a.prefill_len:
        ids = [1 + (j * 131) % (vocab - 1) for j in range(a.prefill_len)]
        worker_prefill(runner, ids[:256], a.chunk)  # warm both
        mlx_lm_prefill(loaded.model, ids[:256])
        ours, theirs = [], []
        for _ in range(a.rounds):
            ours.append(worker_prefill(runner, ids, a.chunk))
            theirs.append(mlx_lm_prefill(loaded.model, ids))
        o, t = statistics.median(ours), statistics.median(theirs)
        out["prefill"] = {"tokens": a.prefill_len, "worker_s": o, "mlx_lm_s": t, "ratio": o / t}
        print(f"prefill {a.prefill_len} tokens: worker {o:.3f} s, mlx-lm {t:.3f} s, worker / mlx-lm {o / t:.2f}")
    if a.kv_context:
        out["kv"] = kv_bytes(loaded, a.kv_context, a.chunk)
        print("KV bytes:", json.dumps(out["kv"]))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
