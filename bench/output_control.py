"""Decode speed of 16 concurrent requests under each kind of output control, in one run.

One server (the default model unless --model), five settings measured in alternating
rounds: all greedy; all sampled (temperature, top-p, top-k, min-p, seeds); penalties and
logit_bias on every row; 4 of the rows under a JSON schema; every row asking top-5
logprobs. Decode tokens/s of a round = the tokens generated after every request had its
first token / the time from then to the last token. Prints each setting's median and the
median of its per-round ratios to all-greedy (target: >= 0.85).

    python bench/output_control.py [--model PATH] [--requests 16] [--tokens 64] [--rounds 3]
        [--server-args "--load-format dummy"] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.client import async_client, request_body, timed_stream  # noqa: E402

PROMPTS = [
    "Write a long story about a dragon who learns to bake bread.",
    "Describe the water cycle in detail.",
    "List facts about the planets of the solar system.",
    "Explain how a bicycle works.",
]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def body(setting: str, i: int, tokens: int) -> dict:
    """The chat request row i sends under `setting`."""
    b = request_body(PROMPTS[i % len(PROMPTS)], tokens)
    if setting == "sampled":
        b.update(temperature=0.8, top_p=0.9, top_k=50, min_p=0.05, seed=i)
    elif setting == "penalties+bias":
        b.update(frequency_penalty=0.5, presence_penalty=0.5, repetition_penalty=1.1, logit_bias={"30": -5, "31": 2})
    elif setting == "json 4/16" and i < 4:
        b["response_format"] = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
    elif setting == "top-5 logprobs":
        b.update(logprobs=True, top_logprobs=5)
    return b


SETTINGS = ["greedy", "sampled", "penalties+bias", "json 4/16", "top-5 logprobs"]


async def round_(url: str, setting: str, requests: int, tokens: int) -> float:
    """Aggregate decode tokens/s of one round (see the module doc)."""
    async with async_client(600) as client:
        res = [
            (f, last, n)
            for n, f, last in await asyncio.gather(
                *(timed_stream(client, url, body(setting, i, tokens)) for i in range(requests))
            )
        ]
    start = max(r[0] for r in res)
    end = max(r[1] for r in res)
    after = 0
    for first, last, n in res:  # tokens each request produced after `start`, assuming a steady rate
        after += n * max(0.0, last - start) / max(last - first, 1e-9)
    return after / (end - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--server-args", default="")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    from tests.support.launcher import Server

    args = (["--model", a.model] if a.model else []) + shlex.split(a.server_args)
    server = Server(args, Path("/tmp/lazyserve-bench-output-control.log"))
    results: dict[str, list[float]] = {s: [] for s in SETTINGS}
    try:
        asyncio.run(round_(server.base_url, "json 4/16", 4, 8))  # warm-up, grammar compiled once
        for r in range(a.rounds):
            order = SETTINGS if r % 2 == 0 else SETTINGS[::-1]
            for s in order:
                results[s].append(asyncio.run(round_(server.base_url, s, a.requests, a.tokens)))
    finally:
        server.stop()
    print(
        f"{a.requests} concurrent requests, {a.tokens} tokens each, {a.rounds} alternating rounds; "
        f"model {a.model or 'SmolLM2-135M-Instruct'} {a.server_args}"
    )
    print("| setting | decode tok/s (median) | rounds | vs all-greedy (median of per-round ratios) |")
    print("|---|---|---|---|")
    ratios = {}
    for s in SETTINGS:
        ratios[s] = statistics.median(x / g for x, g in zip(results[s], results["greedy"]))
        print(
            f"| {s} | {statistics.median(results[s]):.1f} | {', '.join(f'{x:.1f}' for x in results[s])} | "
            f"{ratios[s]:.2f} |"
        )
    if a.json:
        Path(a.json).write_text(json.dumps({"results": results, "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
