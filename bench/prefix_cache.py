"""Prefix-cache benchmark (issue: KV memory), radix cache on vs off, side by side in one run.

Shared-prefix workload: a 1,000-token system prompt, 32 requests with different 50-token
questions, 32 output tokens each, 8 at a time. Reports prompt tokens received vs computed
(from /metrics), TTFT p50 (first streamed chunk) and total time.
Non-shared workload: 8 different short prompts at once, 64 tokens each: decode tokens/s.

    python bench/prefix_cache.py [--model PATH] [--load-format dummy] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SYSTEM = ("You are a careful assistant who answers questions about the history of bread, ovens, grains, yeast and "
          "bakeries across the world, from the Neolithic era to modern industrial baking. ")
QUESTION = "Question {i}: what would a baker in city number {i} have eaten for breakfast on day {i}? Please answer. "


def workload(tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    """32 shared-prefix prompts (1,000 + 50 tokens) and 8 unrelated short prompts, as token ids."""
    system = tokenizer.encode(SYSTEM * 40, add_special_tokens=False)[:1000]
    shared = []
    for i in range(32):
        q = tokenizer.encode(QUESTION.format(i=i) * 4, add_special_tokens=False)[:50]
        shared.append(system + q)
    other = [tokenizer.encode(f"Story {i}: once upon a time in land {i * 7},", add_special_tokens=False) for i in range(8)]
    return shared, other


async def _one(client, url: str, prompt: list[int], max_tokens: int) -> tuple[float, float, int]:
    """(ttft_s, total_s, completion_tokens) of one streamed request."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, n = None, 0
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    n = chunk["usage"]["completion_tokens"]
                elif ttft is None:
                    ttft = time.perf_counter() - t0
    return ttft, time.perf_counter() - t0, n


async def _run(url: str, prompts: list[list[int]], max_tokens: int, concurrency: int) -> tuple[list, float]:
    import httpx

    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=3600) as client:
        async def guarded(p):
            async with sem:
                return await _one(client, url, p, max_tokens)
        t0 = time.perf_counter()
        res = await asyncio.gather(*(guarded(p) for p in prompts))
    return res, time.perf_counter() - t0


def _metrics(url: str) -> dict[str, float]:
    import re

    import httpx

    text = httpx.get(f"{url}/metrics").text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(lazyserve_\w+?)(?:_total)? ([0-9.e+-]+)$", text, re.M)}


def measure(model_args: list[str], radix: bool, shared, other, log_dir: Path) -> dict:
    from tests.launcher import Server

    flags = [] if radix else ["--disable-radix-cache"]
    server = Server([*model_args, *flags], log_dir / f"server-radix-{radix}.log")
    try:
        asyncio.run(_run(server.base_url, [other[0]], 4, 1))  # warm-up (unrelated prompt)
        before = _metrics(server.base_url)
        res, total = asyncio.run(_run(server.base_url, shared, 32, 8))
        after = _metrics(server.base_url)
        dec, dec_total = asyncio.run(_run(server.base_url, other, 64, 8))
    finally:
        server.stop()
    received = after["lazyserve_prompt_tokens"] - before["lazyserve_prompt_tokens"]
    cached = after["lazyserve_prefix_cache_hit_tokens"] - before["lazyserve_prefix_cache_hit_tokens"]
    decode_tokens = sum(n for _, _, n in dec)
    decode_time = statistics.median(t - f for f, t, _ in dec)
    return {
        "received": received, "computed": received - cached, "reused": cached / received,
        "ttft_p50": statistics.median(t for t, _, _ in res), "total": total,
        "decode_tok_s": decode_tokens / dec_total, "decode_per_req_tok_s": 63 / decode_time,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--load-format", default="auto")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    from protocol.model_source import resolve_model
    from tokenizer_proc.hf_tokenizer import load_tokenizer

    tokenizer = load_tokenizer(resolve_model(a.model))
    shared, other = workload(tokenizer)
    model_args = (["--model", a.model] if a.model else []) + ["--load-format", a.load_format]
    log_dir = Path("/tmp/lazyserve-prefix-bench")
    log_dir.mkdir(exist_ok=True)
    on = measure(model_args, True, shared, other, log_dir)
    off = measure(model_args, False, shared, other, log_dir)
    lines = [
        f"model: {a.model or 'SmolLM2-135M-Instruct'} ({a.load_format}); python bench/prefix_cache.py {' '.join(sys.argv[1:])}",
        "",
        "Shared prefix: 32 requests = 1,000-token system prompt + 50-token question, 32 output tokens, concurrency 8.",
        "",
        "| radix cache | prompt tokens received | prefill tokens computed | reused | TTFT p50 | total time |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in (("on", on), ("off", off)):
        lines.append(f"| {name} | {r['received']:.0f} | {r['computed']:.0f} | {r['reused']:.1%} | "
                     f"{r['ttft_p50'] * 1e3:.0f} ms | {r['total']:.1f} s |")
    lines += [
        "",
        f"TTFT p50 off / on: {off['ttft_p50'] / on['ttft_p50']:.1f}x; total time off / on: {off['total'] / on['total']:.1f}x",
        "",
        "Non-shared: 8 different short prompts at once, 64 output tokens each.",
        "",
        "| radix cache | decode tok/s (all requests) |",
        "|---|---|",
        f"| on | {on['decode_tok_s']:.1f} |",
        f"| off | {off['decode_tok_s']:.1f} |",
        "",
        f"decode on / off: {on['decode_tok_s'] / off['decode_tok_s']:.2f}",
    ]
    text = "\n".join(lines)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
