"""First request against second: does the first request after ``lazyserve ready`` pay for
start-up work (graph building, allocations) that later requests do not?

Each round starts launch.py afresh, reads the idle worker's resident memory, then times
two chat requests end to end (send to full answer), each an 8-token greedy answer
(``ignore_eos``) to a different prompt of the same shape, so the second gets no
prefix-cache hit. Prints each round and the medians, with the CPU seconds the server's
processes spent on each request (user + system, from /proc), which other load on the
machine disturbs less than the wall-clock latency.

    python bench/first_request.py [--model PATH] [--tokens 8] [--rounds 3] [--server-args "..."]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPTS = ("What is the capital of France?", "What is the capital of Italy?")


def server_cpu_s(launch_pid: int) -> float:
    """CPU seconds (user + system) used so far by the children of `launch_pid`."""
    from tests.support.launcher import child_pids

    total = 0
    for pid in child_pids(launch_pid):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / os.sysconf("SC_CLK_TCK")


def timed_request(url: str, prompt: str, tokens: int) -> float:
    """Seconds from sending a non-streamed chat request to its whole answer. Raises
    `RuntimeError` unless it is a 200 with `tokens` completion tokens."""
    import httpx

    from bench.client import CHAT, request_body

    body = request_body(prompt, tokens, stream=False)
    t0 = time.perf_counter()
    r = httpx.post(f"{url}{CHAT}", json=body, timeout=300)
    elapsed = time.perf_counter() - t0
    if r.status_code != 200 or r.json()["usage"]["completion_tokens"] != tokens:
        raise RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}")
    return elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3, help="server starts (default: 3)")
    p.add_argument("--server-args", default="", help="more launch.py flags, one string")
    a = p.parse_args()

    from bench.client import rss_kib
    from tests.support.launcher import Server

    model_args = ["--model", a.model] if a.model else []
    walls: list[list[float]] = [[], []]
    cpus: list[list[float]] = [[], []]
    rss = []
    for i in range(a.rounds):
        server = Server([*model_args, *shlex.split(a.server_args)], Path("/tmp/lazyserve-first-request.log"))
        try:
            rss.append(rss_kib(server.child("worker")) / 1024)
            for k, prompt in enumerate(PROMPTS):
                cpu0 = server_cpu_s(server.proc.pid)
                walls[k].append(timed_request(server.base_url, prompt, a.tokens))
                cpus[k].append(server_cpu_s(server.proc.pid) - cpu0)
        finally:
            server.stop()
        print(
            f"round {i + 1}: request 1 {walls[0][-1] * 1e3:.0f} ms ({cpus[0][-1]:.2f} CPU s), "
            f"request 2 {walls[1][-1] * 1e3:.0f} ms ({cpus[1][-1]:.2f} CPU s), idle worker VmRSS {rss[-1]:.0f} MiB",
            flush=True,
        )
    (w1, w2), (c1, c2) = ([statistics.median(x) for x in pair] for pair in (walls, cpus))
    print(
        f"model: {a.model or 'SmolLM2-135M-Instruct (default)'}; {a.tokens}-token greedy answers; "
        f"medians of {a.rounds} server starts: request 1 {w1 * 1e3:.0f} ms / {c1:.2f} CPU s, "
        f"request 2 {w2 * 1e3:.0f} ms / {c2:.2f} CPU s; ratio 1st/2nd {w1 / w2:.2f} wall, {c1 / c2:.2f} CPU; "
        f"idle worker VmRSS {statistics.median(rss):.0f} MiB"
    )


if __name__ == "__main__":
    main()
