"""Aggregate decode speed of concurrent streams on an idle machine and with one core busy.

Starts the server once, then for each round and each stream count (6 and 16 by default)
measures aggregate decode tokens/s of that many concurrent streamed greedy requests
(``ignore_eos``) twice, alternating: with the machine idle, and with one core held by a
spin loop in another process (bounded in time, killed after the measurement). Aggregate
decode tok/s = sum over streams of (completion tokens - 1) / (last token of any stream -
first token of any stream), so prefill is excluded. Prints medians and busy/idle ratios.

    python bench/busy_core.py [--model PATH] [--streams 6,16] [--tokens 32] [--rounds 2] [--blas-threads N]

``--blas-threads`` is passed to launch.py: 0 (default) is the thread policy launch chooses,
-1 the BLAS libraries' own defaults (the behaviour before that policy).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.client import async_client, request_body, timed_stream  # noqa: E402

PROMPT = "Write a long story about a dragon who learns to bake bread."
SPIN_LIMIT_S = 900
"""The spin loop ends on its own after this many seconds, should it outlive the benchmark."""
SPIN_CODE = f"import time\nend = time.monotonic() + {SPIN_LIMIT_S}\nwhile time.monotonic() < end:\n    pass\n"


async def aggregate_decode(url: str, streams: int, tokens: int) -> float:
    """Aggregate decode tokens/s of `streams` concurrent requests of `tokens` tokens each."""
    async with async_client(1200, connections=streams) as client:
        results = await asyncio.gather(
            *(timed_stream(client, url, request_body(PROMPT, tokens)) for _ in range(streams))
        )
    decoded = sum(n - 1 for n, _, _ in results)
    return decoded / (max(last for _, _, last in results) - min(first for _, first, _ in results))


@contextlib.contextmanager
def spinning():
    """Hold one core busy with a spin loop in another process while the block runs (the loop
    is killed at its end, and ends by itself after `SPIN_LIMIT_S`)."""
    spin = subprocess.Popen([sys.executable, "-c", SPIN_CODE])
    try:
        yield spin
    finally:
        spin.kill()
        spin.wait()


def measure(url: str, streams: int, tokens: int, busy: bool) -> float:
    """`aggregate_decode`, with a spin loop holding one core in another process when `busy`."""
    with spinning() if busy else contextlib.nullcontext():
        if busy:
            time.sleep(0.5)  # let it take its core
        return asyncio.run(aggregate_decode(url, streams, tokens))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--streams", default="6,16", help="comma-separated concurrent stream counts")
    p.add_argument("--tokens", type=int, default=32, help="completion tokens per request")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--blas-threads", type=int, default=0, help="passed to launch.py (-1: the old behaviour)")
    a = p.parse_args()

    from tests.support.launcher import Server

    counts = [int(x) for x in a.streams.split(",")]
    launch_args = ["--blas-threads", str(a.blas_threads), *(["--model", a.model] if a.model else [])]
    server = Server(launch_args, Path("/tmp/lazyserve-busy-core.log"))
    idle: dict[int, list[float]] = {n: [] for n in counts}
    busy: dict[int, list[float]] = {n: [] for n in counts}
    try:
        ready = next(line for line in server.log().splitlines() if "proc=worker" in line and "ready" in line)
        for n in counts:
            measure(server.base_url, n, 8, busy=False)  # warm-up at this batch size
        for _ in range(a.rounds):
            for n in counts:
                idle[n].append(measure(server.base_url, n, a.tokens, busy=False))
                busy[n].append(measure(server.base_url, n, a.tokens, busy=True))
                print(f"streams {n}: idle {idle[n][-1]:.1f}, busy {busy[n][-1]:.1f} tok/s", flush=True)
    finally:
        server.stop()
    print(f"--blas-threads {a.blas_threads}; {a.tokens} tokens per request, {a.rounds} rounds; worker: {ready.strip()}")
    print("| streams | idle tok/s (median) | one core busy tok/s (median) | busy / idle | rounds idle | rounds busy |")
    print("|---|---|---|---|---|---|")
    for n in counts:
        i, b = statistics.median(idle[n]), statistics.median(busy[n])
        print(
            f"| {n} | {i:.1f} | {b:.1f} | {b / i:.2f} | {', '.join(f'{x:.1f}' for x in idle[n])} "
            f"| {', '.join(f'{x:.1f}' for x in busy[n])} |"
        )


if __name__ == "__main__":
    main()
