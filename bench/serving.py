"""Serving benchmark for any OpenAI-compatible server: N streamed requests, at most C in
flight, with synthetic prompts of about L tokens (optionally sharing a P-token prefix) or the
prompts of a JSONL file, each asking O tokens at temperature 0 (``ignore_eos`` too, which
lazyserve and vLLM honour and mlx_lm.server ignores). Writes the figures of
`bench.serving_metrics.summarize` as JSON.

    python -m bench.serving --url http://127.0.0.1:PORT [--model NAME] --num-prompts N
        --concurrency C --input-len L --output-len O [--shared-prefix-len P]
        [--dataset FILE.jsonl] [--endpoint chat|completions] [--tokenizer PATH|default]
        [--no-ignore-eos] [--client-procs K] --json OUT

Prompt lengths are exact by `--tokenizer` (a model directory or GGUF as lazyserve loads it,
or ``default``), else one common word per token; the chat template adds its own tokens, so
``mean_prompt_tokens`` (from the server's usage) is the length actually served.

One client process parses about 6,000 SSE chunks a second on this machine's cores (measured
against a server that sends whole responses at once), less than 64 streams of a fast GPU
receive: the streams are spread over K client processes (``--client-procs``; by default one
per `STREAMS_PER_PROC` streams), which start together and time with the one monotonic clock
every process shares (``time.perf_counter``, CLOCK_MONOTONIC on Linux).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import queue
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tqdm import tqdm  # noqa: E402

from bench.client import ENDPOINTS, StreamRecord, async_client, record_stream, request_body  # noqa: E402
from bench.prompts import jsonl_prompts, load_tokenizer_for, synthetic_prompts  # noqa: E402
from bench.serving_metrics import first_wave, summarize  # noqa: E402

STREAMS_PER_PROC = 16
"""Concurrent streams one client process takes at most when ``--client-procs`` is not given."""
START_TIMEOUT_S = 60.0
"""Seconds the client processes have to reach the common start (a fork and a Barrier wait)."""


class ProgressBar(tqdm):
    """tqdm without its monitor thread (which outlives the bar), so that `run` never forks
    client processes while a thread of tqdm may hold a lock."""

    monitor_interval = 0


async def _streams(
    url: str, bodies: list[dict], concurrency: int, endpoint: str, done: Callable[[], object]
) -> tuple[list[StreamRecord], list[str]]:
    """Send `bodies` with at most `concurrency` in flight; returns (records, errors: one message
    per failed request: connection error, non-200, error event). ``done()`` is called once per
    finished request."""
    import httpx

    records: list[StreamRecord] = []
    errors: list[str] = []
    gate = asyncio.Semaphore(concurrency)
    async with async_client(None, connect=60, connections=concurrency) as client:

        async def one(body: dict) -> None:
            async with gate:
                try:
                    records.append(await record_stream(client, url, body, ENDPOINTS[endpoint]))
                except (httpx.HTTPError, RuntimeError) as e:
                    errors.append(f"{type(e).__name__}: {e}"[:300])
                done()

        await asyncio.gather(*(one(b) for b in bodies))
    return records, errors


def _client_proc(
    url: str, bodies: list[dict], concurrency: int, endpoint: str, start: mp.Barrier, done: mp.Queue, out: mp.Queue
) -> None:
    """One client process of `run`: waits at `start` for the others (`START_TIMEOUT_S` at
    most), then sends its share and puts (records, errors) on `out`."""
    start.wait(START_TIMEOUT_S)
    out.put(asyncio.run(_streams(url, bodies, concurrency, endpoint, partial(done.put, 1))))


def _run_in_procs(
    url: str, bodies: list[dict], concurrency: int, endpoint: str, procs: int, timeout_s: float | None, new_bar
) -> tuple[list[StreamRecord], list[str], float]:
    """`run` from `procs` forked client processes (the i-th sends every procs-th body with its
    share of `concurrency`); returns (records, errors, seconds from the common start to the
    last answer). The progress bar (``new_bar()``) is made after the fork. Every child is killed and joined on the way out. Raises
    `RuntimeError` when a client process dies or they do not all start within
    `START_TIMEOUT_S`, `TimeoutError` after `timeout_s` seconds (None: no limit)."""
    ctx = mp.get_context("fork")
    start, done, out = ctx.Barrier(procs + 1), ctx.Queue(), ctx.Queue()
    children = [
        ctx.Process(
            target=_client_proc,
            daemon=True,
            args=(url, bodies[i::procs], concurrency // procs + (i < concurrency % procs), endpoint, start, done, out),
        )
        for i in range(procs)
    ]
    for c in children:
        c.start()
    bar = new_bar()
    try:
        try:
            start.wait(START_TIMEOUT_S)
        except threading.BrokenBarrierError:
            raise RuntimeError(f"the client processes did not all start within {START_TIMEOUT_S:.0f} s") from None
        t0 = time.perf_counter()
        records, errors, finished = [], [], 0
        while finished < procs:
            if timeout_s is not None and time.perf_counter() - t0 > timeout_s:
                raise TimeoutError(f"the requests were not done within {timeout_s:.0f} s")
            while not done.empty():
                bar.update(done.get())
            try:
                recs, errs = out.get(timeout=0.2)
            except queue.Empty:
                if any(c.exitcode not in (None, 0) for c in children):
                    raise RuntimeError("a client process died") from None
                continue
            records += recs
            errors += errs
            finished += 1
        duration = time.perf_counter() - t0
        for c in children:
            c.join()
        while not done.empty():
            bar.update(done.get())
        return records, errors, duration
    finally:
        for c in children:
            c.kill()  # a no-op for a child that has exited
            c.join()
        bar.close()


def run(
    url: str,
    bodies: list[dict],
    concurrency: int,
    endpoint: str = "chat",
    progress: bool = True,
    client_procs: int = 0,
    timeout_s: float | None = None,
) -> dict:
    """Send `bodies` to the server at `url` with at most `concurrency` in flight, from
    `client_procs` processes (0: one per `STREAMS_PER_PROC` streams; each takes every k-th
    body and its share of the concurrency); returns `summarize`'s figures plus ``first_wave`` (`first_wave`),
    ``concurrency``, ``num_prompts`` and ``client_procs``. A request that fails is counted
    as failed, not raised. Raises `RuntimeError` when a client process dies (or does not
    start), `TimeoutError` when the requests are not all done within `timeout_s` seconds
    (None: no limit); no client process is left running either way."""
    procs = max(1, min(client_procs or math.ceil(concurrency / STREAMS_PER_PROC), concurrency, len(bodies)))
    new_bar = partial(ProgressBar, total=len(bodies), desc=f"c={concurrency}", disable=not progress, file=sys.stderr)
    if procs == 1:
        with new_bar() as bar:
            t0 = time.perf_counter()
            try:
                records, errors = asyncio.run(
                    asyncio.wait_for(_streams(url, bodies, concurrency, endpoint, bar.update), timeout_s)
                )
            except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
                raise TimeoutError(f"the requests were not done within {timeout_s:.0f} s") from None
            duration = time.perf_counter() - t0
    else:
        records, errors, duration = _run_in_procs(url, bodies, concurrency, endpoint, procs, timeout_s, new_bar)
    return {
        "concurrency": concurrency,
        "num_prompts": len(bodies),
        "client_procs": procs,
        **summarize(records, errors, duration),
        "first_wave": first_wave(records, concurrency),
    }


def parser() -> argparse.ArgumentParser:
    """The command line (also the workload options `bench.compare` passes on)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="server root, e.g. http://127.0.0.1:30000")
    p.add_argument("--model", default=None, help="the request's model field (omitted when not given)")
    p.add_argument("--num-prompts", type=int, required=True)
    p.add_argument("--concurrency", type=int, required=True, help="requests in flight at most")
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens (synthetic prompts)")
    p.add_argument("--output-len", type=int, required=True, help="max_tokens of every request")
    p.add_argument("--shared-prefix-len", type=int, default=0, help="leading prompt tokens all prompts share")
    p.add_argument("--dataset", default=None, help='JSONL file of {"prompt": ...} rows instead of synthetic prompts')
    p.add_argument("--endpoint", choices=sorted(ENDPOINTS), default="chat")
    p.add_argument("--tokenizer", default=None, help="model dir/GGUF (or 'default') whose tokenizer sizes the prompts")
    p.add_argument("--no-ignore-eos", action="store_true", help="do not send ignore_eos (for servers that reject it)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic prompts")
    p.add_argument(
        "--client-procs",
        type=int,
        default=0,
        help=f"client processes the streams are spread over (default: one per {STREAMS_PER_PROC})",
    )
    p.add_argument("--json", required=True, help="output file")
    return p


def main() -> None:
    a = parser().parse_args()
    if a.dataset:
        prompts = jsonl_prompts(a.dataset, a.num_prompts)
    else:
        tok = load_tokenizer_for(a.tokenizer) if a.tokenizer else None
        prompts = synthetic_prompts(a.num_prompts, a.input_len, a.shared_prefix_len, tok, a.seed)
    bodies = [request_body(p, a.output_len, a.endpoint, a.model, not a.no_ignore_eos) for p in prompts]
    result = run(a.url.rstrip("/"), bodies, a.concurrency, a.endpoint, client_procs=a.client_procs)
    result["args"] = vars(a)
    Path(a.json).write_text(json.dumps(result, indent=1))
    print(
        json.dumps(
            {k: result[k] for k in ("completed", "failed", "output_throughput", "ttft_ms", "itl_ms", "first_wave")}
        )
    )


if __name__ == "__main__":
    main()
