"""Prefix-cache benchmark (issue: KV memory), radix cache on vs off, side by side in one run.

Shared-prefix workload: a 1,000-token system prompt, 32 requests with different 50-token
questions, 32 output tokens each, 8 at a time. Reports prompt tokens received vs computed
(from /metrics), TTFT p50 (first streamed chunk) and total time.
Non-shared workload: 8 different short prompts at once, 64 tokens each: decode tokens/s,
in `--rounds` rounds per server with both servers up, interleaved (on, off, off, on, ...)
so that drift on a noisy machine hits both alike; reports each round's on/off ratio.

    python bench/prefix_cache.py [--model PATH] [--load-format dummy] [--rounds 6] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cli import emit  # noqa: E402
from bench.client import COMPLETIONS, async_client, record_stream, request_body  # noqa: E402
from tests.support.pool_state import metrics, wait_metric  # noqa: E402

SYSTEM = (
    "You are a careful assistant who answers questions about the history of bread, ovens, grains, yeast and "
    "bakeries across the world, from the Neolithic era to modern industrial baking. "
)
QUESTION = "Question {i}: what would a baker in city number {i} have eaten for breakfast on day {i}? Please answer. "


def workload(tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    """32 shared-prefix prompts (1,000 + 50 tokens) and 8 unrelated short prompts, as token ids."""
    system = tokenizer.encode(SYSTEM * 40, add_special_tokens=False)[:1000]
    shared = []
    for i in range(32):
        q = tokenizer.encode(QUESTION.format(i=i) * 4, add_special_tokens=False)[:50]
        shared.append(system + q)
    other = [
        tokenizer.encode(f"Story {i}: once upon a time in land {i * 7},", add_special_tokens=False) for i in range(8)
    ]
    return shared, other


async def _one(client, url: str, prompt: list[int], max_tokens: int) -> tuple[float, float, int]:
    """(ttft_s, total_s, completion_tokens) of one streamed request."""
    rec = await record_stream(client, url, request_body(prompt, max_tokens, "completions"), COMPLETIONS)
    return rec.chunk_times[0] - rec.start, rec.end - rec.start, rec.usage["completion_tokens"]


async def _run(url: str, prompts: list[list[int]], max_tokens: int, concurrency: int) -> tuple[list, float]:
    sem = asyncio.Semaphore(concurrency)
    async with async_client(3600) as client:

        async def guarded(p):
            async with sem:
                return await _one(client, url, p, max_tokens)

        t0 = time.perf_counter()
        res = await asyncio.gather(*(guarded(p) for p in prompts))
    return res, time.perf_counter() - t0


def settled_metrics(url: str, before: dict[str, float], requests: int) -> dict[str, float]:
    """/metrics once the scheduler has reported `requests` more finished requests than
    `before` shows (it reports about once a second: a sample taken right after the last
    answer can miss the last prompts)."""
    done = before.get("lazyserve_requests_finished", 0) + requests
    return wait_metric(url, lambda m: m.get("lazyserve_requests_finished", 0) >= done, timeout=30)


def shared_run(url: str, shared) -> dict:
    """The shared-prefix workload on a warm server: prompt tokens received and reused
    (from /metrics), TTFT p50 and total seconds."""
    before = metrics(url)
    res, total = asyncio.run(_run(url, shared, 32, 8))
    after = settled_metrics(url, before, len(shared))
    received = after["lazyserve_admitted_prompt_tokens"] - before["lazyserve_admitted_prompt_tokens"]
    cached = after["lazyserve_prefix_cache_hit_tokens"] - before["lazyserve_prefix_cache_hit_tokens"]
    return {
        "received": received,
        "computed": received - cached,
        "reused": cached / received,
        "ttft_p50": statistics.median(t for t, _, _ in res),
        "total": total,
    }


def decode_tok_s(url: str, other) -> float:
    """Completion tokens per second of the non-shared workload (8 prompts at once, 64 tokens)."""
    res, total = asyncio.run(_run(url, other, 64, 8))
    return sum(n for _, _, n in res) / total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--rounds", type=int, default=6, help="non-shared decode rounds per server, interleaved")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    from protocol.model_source import resolve_model
    from tests.support.launcher import Server
    from text.hf_tokenizer import load_tokenizer

    tokenizer = load_tokenizer(resolve_model(a.model))
    shared, other = workload(tokenizer)
    model_args = (["--model", a.model] if a.model else []) + ["--load-format", a.load_format]
    log_dir = Path("/tmp/lazyserve-prefix-bench")
    log_dir.mkdir(exist_ok=True)
    servers = {
        "on": Server(model_args, log_dir / "server-radix-on.log"),
        "off": Server([*model_args, "--disable-radix-cache"], log_dir / "server-radix-off.log"),
    }
    try:
        for s in servers.values():
            asyncio.run(_run(s.base_url, [other[0]], 4, 1))  # warm-up (unrelated prompt)
        sh = {name: shared_run(s.base_url, shared) for name, s in servers.items()}
        dec: dict[str, list[float]] = {"on": [], "off": []}
        for r in range(a.rounds):  # interleaved, alternating which goes first, against drift
            for name in ("on", "off") if r % 2 == 0 else ("off", "on"):
                dec[name].append(decode_tok_s(servers[name].base_url, other))
    finally:
        for s in servers.values():
            s.stop()
    on, off = sh["on"], sh["off"]
    ratios = [x / y for x, y in zip(dec["on"], dec["off"])]
    lines = [
        f"model: {a.model or 'SmolLM2-135M-Instruct'} ({a.load_format}); python bench/prefix_cache.py {' '.join(sys.argv[1:])}",
        "",
        "Shared prefix: 32 requests = 1,000-token system prompt + 50-token question, 32 output tokens, concurrency 8.",
        "",
        "| radix cache | prompt tokens received | prefill tokens computed | reused | TTFT p50 | total time |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in (("on", on), ("off", off)):
        lines.append(
            f"| {name} | {r['received']:.0f} | {r['computed']:.0f} | {r['reused']:.1%} | "
            f"{r['ttft_p50'] * 1e3:.0f} ms | {r['total']:.1f} s |"
        )
    lines += [
        "",
        f"TTFT p50 off / on: {off['ttft_p50'] / on['ttft_p50']:.1f}x; total time off / on: {off['total'] / on['total']:.1f}x",
        "",
        (
            f"Non-shared: 8 different short prompts at once, 64 output tokens each; both servers up (the on server after "
            f"the shared workload), {a.rounds} rounds each, interleaved."
        ),
        "",
        "| round | radix on tok/s | radix off tok/s | on / off |",
        "|---|---|---|---|",
        *(f"| {i + 1} | {x:.1f} | {y:.1f} | {x / y:.2f} |" for i, (x, y) in enumerate(zip(dec["on"], dec["off"]))),
        "",
        (
            f"decode on / off: median of rounds {statistics.median(ratios):.2f}; "
            f"totals {statistics.mean(dec['on']) / statistics.mean(dec['off']):.2f}"
        ),
    ]
    emit(lines, a.out)


if __name__ == "__main__":
    main()
