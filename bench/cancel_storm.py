"""What cancelled work costs the others: N streamed requests of long prompts, each closed
0-3 ms after it was sent (a client that gave up, a retry storm), then one short request,
whose time to first token is compared with its idle one:

    python -m bench.cancel_storm [--model PATH] [--cancelled 25] [--prompt-tokens 3000]
        [--short-tokens 16] [--idle-runs 3] [--lazyserve-args '...'] [--url URL] [--json OUT]

Starts lazyserve (``launch.py``, the default model unless `--model`) unless `--url` names a
running server. Prints the short request's idle TTFT (median of `--idle-runs`), its TTFT after
the storm, their difference, and the worker's model-call size in tokens that the difference
is to be compared with (one call: the most a cancelled prompt may cost the others), and
how many of the cancelled prompts' tokens the scheduler admitted before their aborts reached
it (``cancelled_prompt_tokens_admitted``, from ``/metrics``: 0 when every abort came first).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from bench.client import COMPLETIONS, async_client, record_stream  # noqa: E402
from tests.support.pool_state import metrics, wait_idle  # noqa: E402


def long_prompt(tokens: int, seed: int) -> list[int]:
    """A prompt of `tokens` random token ids (ids 1,000-9,999: ordinary tokens of any
    tokenizer this is run with), distinct per seed, so that no prefix is cached."""
    rng = random.Random(seed)
    return [rng.randrange(1000, 10000) for _ in range(tokens)]


async def ttft(client: httpx.AsyncClient, url: str, prompt: list[int]) -> float:
    """Seconds from sending the short greedy completions request to its first content."""
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True, "ignore_eos": True}
    rec = await record_stream(client, url, body, COMPLETIONS)
    return rec.chunk_times[0] - rec.start


async def cancel(url: str, prompt: list[int], rng: random.Random) -> None:
    """Send a streamed request for `prompt` whole over a socket of its own, then close the
    socket 0-3 ms later (before any token): the client that gave up."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"prompt": prompt, "max_tokens": 64, "temperature": 0, "stream": True}).encode()
    head = (
        f"POST {COMPLETIONS} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head + body)
    await writer.drain()
    await asyncio.sleep(rng.uniform(0, 0.003))
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


STATS_S = 1.5
"""A little more than the interval at which the scheduler sends its counters (1 s)."""


def settled(url: str, finished: float | None, deadline_s: float = 30) -> dict[str, float]:
    """`url`'s ``/metrics`` once it is idle and (when `finished` is given) reports that many
    requests finished (the scheduler's counters arrive about once a second). Raises
    `AssertionError` past the deadline."""
    wait_idle(url, deadline_s)
    t0 = time.monotonic()
    while True:
        m = metrics(url)
        if finished is None or m.get("lazyserve_requests_finished", 0) >= finished:
            return m
        if time.monotonic() - t0 > deadline_s:
            raise AssertionError(f"{finished:g} requests not reported finished: {m}")
        time.sleep(0.1)


async def storm(url: str, a: argparse.Namespace) -> dict:
    rng = random.Random(0)
    short = long_prompt(a.short_tokens, 10_000)
    async with async_client(600, connections=a.cancelled + 4) as client:
        await ttft(client, url, short)  # warm: the short prompt's shapes
        idle = [await ttft(client, url, long_prompt(a.short_tokens, 20_000 + i)) for i in range(a.idle_runs)]
        before = settled(url, None)
        t0 = time.perf_counter()
        await asyncio.gather(*(cancel(url, long_prompt(a.prompt_tokens, i), rng) for i in range(a.cancelled)))
        sent_s = time.perf_counter() - t0
        after = await ttft(client, url, long_prompt(a.short_tokens, 30_000))
    settled(url, before["lazyserve_requests_finished"] + 1)  # the short request, at least
    time.sleep(STATS_S)  # the scheduler's counters of the cancelled ones, if any ran
    after_m = metrics(url)
    admitted = after_m["lazyserve_admitted_prompt_tokens"] - before["lazyserve_admitted_prompt_tokens"]
    info = httpx.get(f"{url}/get_server_info", timeout=30).json()
    return {
        "idle_ttft_s": idle,
        "idle_ttft_median_s": statistics.median(idle),
        "after_storm_ttft_s": after,
        "extra_s": after - statistics.median(idle),
        "storm_sent_s": sent_s,
        "cancelled_prompt_tokens_admitted": admitted - a.short_tokens,
        "prefill_call_tokens": info.get("prefill_call_tokens"),
        "chunked_prefill_size": info.get("chunked_prefill_size"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--url", default=None, help="a running server (default: start one)")
    p.add_argument("--cancelled", type=int, default=25, help="requests sent and closed at once")
    p.add_argument("--prompt-tokens", type=int, default=3000)
    p.add_argument("--short-tokens", type=int, default=16)
    p.add_argument("--idle-runs", type=int, default=3)
    p.add_argument("--lazyserve-args", default="")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if a.url:
        result = asyncio.run(storm(a.url, a))
    else:
        from tests.support.launcher import Server

        args = (["--model", a.model] if a.model else []) + a.lazyserve_args.split()
        server = Server(args, Path(f"/tmp/cancel_storm_{int(time.time())}.log"), 900)
        try:
            result = asyncio.run(storm(server.base_url, a))
        finally:
            server.stop()
    result["command"] = " ".join(sys.argv)
    print(json.dumps(result, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
