"""Overlap benchmark (issue: overlap pipeline): steady-state decode with 1 and 16 requests.

Reports, in one run on one machine:
  (a) worker idle fraction = 1 - T_device / T_served, where T_served is the median interval
      between consecutive DECODE launches becoming ready, from timestamps taken in the worker
      (``LAZYSERVE_WORKER_TRACE``), and T_device is the median step time of the same batch
      size decoded in-process with chained launches and no process boundary (the device-bound
      step); "worker waiting": the seconds the worker sat in poll for the message that
      started each decode, over the steady-state span; the share of decodes whose previous
      launch was finalized early (`worker_proc.finalize_order`); and the share of finalizes that had to
      block (the device was still busy);
  (b) the process-boundary cost per step: encode + send + receive + decode of a ChainDecode,
      a Finalize and a LaunchResult of B rows over ipc:// to a second process and back;
  (c) decode tokens/s through HTTP with overlap on and off, measured side by side.

    python bench/overlap.py [--model PATH] [--load-format dummy] [--tokens 128]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cli import emit  # noqa: E402
from bench.client import async_client, record_stream, request_body  # noqa: E402

PROMPT = "Write a long story about a dragon who learns to bake bread."


# ----------------------------------------------------------------------------- (b) boundary
def _echo_worker(endpoint_in: str, endpoint_out: str, n: int, rows: int) -> None:
    import zmq

    from protocol import codec
    from protocol.messages import Finalize, LaunchResult

    ctx = zmq.Context()
    pull, push = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    pull.bind(endpoint_in)
    push.connect(endpoint_out)
    rids = [f"req-{i:04d}-{'x' * 24}" for i in range(rows)]
    for _ in range(n * 2):
        msg = codec.to_worker.decode(pull.recv())
        if isinstance(msg, Finalize):
            push.send(codec.encoder.encode(LaunchResult(msg.launch_id, rids, list(range(rows)))))


def boundary_cost_us(rows: int, n: int = 3000) -> float:
    """Median microseconds for one step's messages through a real second process."""
    import zmq

    from protocol import codec
    from protocol.messages import ChainDecode, Finalize

    tmp = tempfile.mkdtemp(prefix="lazyserve-bench-")
    a, b = f"ipc://{tmp}/in", f"ipc://{tmp}/out"
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind(b)
    proc = mp.get_context("spawn").Process(target=_echo_worker, args=(a, b, n, rows))
    proc.start()
    push = ctx.socket(zmq.PUSH)
    push.connect(a)
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        push.send(codec.encoder.encode(ChainDecode(i + 1, i)))
        push.send(codec.encoder.encode(Finalize(i)))
        codec.from_worker.decode(pull.recv())
        times.append(time.perf_counter() - t0)
    proc.join()
    ctx.destroy()
    return statistics.median(times[n // 10 :]) * 1e6


# ----------------------------------------------------------------------------- (a) device step
def device_step_s(model_arg: str | None, load_format: str, rows: int, steps: int = 48) -> float:
    """Median step time of chained in-process decodes of `rows` requests (no IPC)."""
    from protocol.enums import ForwardMode
    from protocol.messages import ForwardBatch, SamplingParams
    from protocol.model_source import resolve_model
    from worker_proc.model.loader import load
    from worker_proc.model.runner import ModelRunner

    runner = ModelRunner(load(resolve_model(model_arg), load_format))
    rids = [f"r{i}" for i in range(rows)]
    prompt = list(range(100, 140))
    runner.launch(
        0,
        ForwardMode.EXTEND,
        ForwardBatch(rids, [prompt] * rows, [SamplingParams(temperature=0)] * rows, [True] * rows),
    )
    runner.launch(1, ForwardMode.DECODE, ForwardBatch(rids))
    runner.finalize(0)
    prev, stamps = 1, []
    for lid in range(2, steps + 2):
        runner.chain_decode(lid, prev)
        runner.finalize(prev)
        stamps.append(time.perf_counter())
        prev = lid
    runner.finalize(prev)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return statistics.median(gaps[len(gaps) // 4 :])


# ----------------------------------------------------------------------------- (c) serving
async def _load(url: str, concurrency: int, tokens: int) -> float:
    """Decode tokens/s over the middle of a run of `concurrency` identical long streams."""
    async with async_client(3600) as client:
        recs = await asyncio.gather(
            *(record_stream(client, url, request_body(PROMPT, tokens)) for _ in range(concurrency))
        )
    stamps = sorted(t for rec in recs for t in rec.chunk_times)
    lo, hi = len(stamps) // 5, len(stamps) * 4 // 5  # steady state: drop ramp-up and tail
    return (hi - lo) / (stamps[hi] - stamps[lo])


def served(model_args: list[str], overlap: bool, tokens: int, trace_dir: Path) -> dict:
    """Start a server, run 1 then 16 concurrent streams; returns tok/s and worker trace stats."""
    from tests.support.launcher import Server

    results = {}
    for conc in (1, 16):
        trace = trace_dir / f"trace-{'on' if overlap else 'off'}-{conc}.jsonl"
        os.environ["LAZYSERVE_WORKER_TRACE"] = str(trace)
        flags = [] if overlap else ["--disable-overlap-schedule"]
        server = Server(
            [*model_args, *flags, "--max-running-requests", "16"], trace_dir / f"server-{overlap}-{conc}.log"
        )
        try:
            asyncio.run(_load(server.base_url, 2, 16))  # warm-up
            trace.write_text("")
            tok_s = asyncio.run(_load(server.base_url, conc, tokens))
        finally:
            server.stop()
            os.environ.pop("LAZYSERVE_WORKER_TRACE", None)
        recs = [json.loads(x) for x in trace.read_text().splitlines() if x]
        dec = [r for r in recs if r["mode"] == "DECODE" and r["rows"] == conc]
        gaps = [b["ready"] - a["ready"] for a, b in zip(dec, dec[1:]) if b["id"] == a["id"] + 1]
        blocked = [r for r in dec if r["ready"] - r.get("wait", r["ready"]) > 50e-6]
        steady = dec[len(dec) // 4 :]
        span = steady[-1]["ready"] - steady[0]["ready"] if len(steady) > 1 else float("nan")
        results[conc] = {
            "tok_s": tok_s,
            "served_step_s": statistics.median(gaps[len(gaps) // 4 :]) if len(gaps) > 4 else float("nan"),
            "blocked_share": len(blocked) / max(1, len(dec)),
            "waited_share": sum(r.get("waited", 0.0) for r in steady[1:]) / span,
            "finalize_early_share": sum(bool(r.get("finalize_early")) for r in steady) / max(1, len(steady)),
        }
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--out", default=None, help="also write the table to this markdown file")
    a = p.parse_args()
    from worker_proc.cpu.blas import reexec_env

    if (env := reexec_env()) is not None:
        os.execve(sys.executable, [sys.executable, *sys.argv], env)
    import mlx.core as mx

    model_args = (["--model", a.model] if a.model else []) + ["--load-format", a.load_format]
    trace_dir = Path(tempfile.mkdtemp(prefix="lazyserve-overlap-"))
    dev = {b: device_step_s(a.model, a.load_format, b) for b in (1, 16)}
    bnd = {b: boundary_cost_us(b) for b in (1, 16)}
    on = served(model_args, True, a.tokens, trace_dir)
    off = served(model_args, False, a.tokens, trace_dir)
    lines = [
        f"device: {mx.default_device()}; model: {a.model or 'SmolLM2-135M-Instruct'} ({a.load_format}); "
        f"{a.tokens} tokens per request; python bench/overlap.py {' '.join(sys.argv[1:])}",
        "",
        "| requests | device step (in-process) | served step, overlap on | idle, overlap on | worker waiting, on "
        "| finalize-early steps, on | finalizes that blocked, on "
        "| served step, overlap off | idle, overlap off | boundary cost per step | tok/s on | tok/s off | on / off |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for b in (1, 16):
        idle_on = max(0.0, 1 - dev[b] / on[b]["served_step_s"])
        idle_off = max(0.0, 1 - dev[b] / off[b]["served_step_s"])
        lines.append(
            f"| {b} | {dev[b] * 1e3:.2f} ms | {on[b]['served_step_s'] * 1e3:.2f} ms | {idle_on:.1%} | "
            f"{on[b]['waited_share']:.1%} | {on[b]['finalize_early_share']:.0%} | {on[b]['blocked_share']:.0%} | {off[b]['served_step_s'] * 1e3:.2f} ms | {idle_off:.1%} | {bnd[b]:.0f} µs | "
            f"{on[b]['tok_s']:.1f} | {off[b]['tok_s']:.1f} | {on[b]['tok_s'] / off[b]['tok_s']:.2f} |"
        )
    emit(lines, a.out)


if __name__ == "__main__":
    main()
