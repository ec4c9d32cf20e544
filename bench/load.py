"""Load and soak check (issue 14 item 7): N requests at concurrency C with a mix of
parameters and random client disconnects; every request must end exactly once, none lost
or hung, the pool must be idle afterwards and the server processes' memory steady.

    python bench/load.py [--url URL | --model DIR] [--num-requests 2000] [--concurrency 32]
        [--disconnect-rate 0.1] [--invalid-rate 0.05] [--max-tokens 64] [--deadline-s 120]
        [--seed 0] [--server-arg=--max-running-requests=16 ...] [--json OUT]

Without ``--url`` it launches a server (``launch.py``) on ``--model`` (default: a tiny
random-weight llama written to a temporary directory, as the tests use) and samples the
resident memory (VmRSS) of launch and of each of its child processes every 0.5 s. With
``--url`` it drives that server and samples the processes given by ``--pid`` (none: memory
is not checked).

The mix, drawn from ``--seed``: chat or completions, streamed or not, greedy or sampled
(temperature, top_p, seed), stop strings, n=2, logprobs, max_tokens 1..``--max-tokens``;
``--invalid-rate`` of the requests are malformed and must get a 400; ``--disconnect-rate``
of the rest are left by the client: a stream closed after k data lines (k in 0..5), a plain
request closed after a random delay (before its answer, if it had not come yet).

Each request ends one way: ``length`` or ``stop`` (a clean end, `bench.outcome.Outcome.complete`),
``rejected`` (an expected 400), ``disconnected`` (by us), or a failure: ``error`` (an
unexpected status or error event), ``broken`` (a breach of the stream contract), ``lost``
(the connection failed), ``hung`` (no end within ``--deadline-s``). Checks, each failing
the exit status: no failure; every request recorded exactly once; `/metrics` idle within
2 s of the last request (`tests.support.pool_state.wait_idle`); the server still healthy; for each
process, mean RSS of the last quarter of the run at most 10% above the first quarter's.
Prints a summary and writes everything (one record per request) as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.client import ENDPOINTS, async_client, cmdline, healthy, rss_kib, tiny_model  # noqa: E402
from bench.outcome import Outcome, send  # noqa: E402

PROMPTS = [
    "Once upon a time",
    "def fib(n):\n    return",
    "東京の天気は",
    "Écris un poème 🌸 sur la mer",
    "List three colors:",
    "print('hello') # 👋",
    "Ein kurzer Satz über Brot.",
    "1, 2, 3, 4,",
]
STOPS = [["e"], ["\n"], [".", "!"], ["the", "a"], ["😀"]]
INVALID = [  # (endpoint, body): each must get a 400
    ("completions", {"prompt": "Hi", "max_tokens": -1}),
    ("completions", {"prompt": "Hi", "temperature": -0.5}),
    ("completions", {"prompt": "Hi", "top_p": 1.5}),
    ("completions", {"max_tokens": 4}),
    ("chat", {"messages": []}),
    ("chat", {"messages": [{"role": "user", "content": "Hi"}], "n": 0}),
    ("chat", {"messages": [{"role": "wizard", "content": "Hi"}]}),
]
IDLE_S = 2.0
RSS_GROWTH_LIMIT = 0.10
SAMPLE_EVERY_S = 0.5


def make_request(rng: random.Random, i: int, max_tokens: int, disconnect_rate: float, invalid_rate: float) -> dict:
    """Request `i` of the mix: {"id", "endpoint", "body", "n", "invalid", "leave"} where leave
    is None, ``("after", k)`` (close a stream after k data lines) or ``("delay", s)``."""
    if rng.random() < invalid_rate:
        endpoint, body = rng.choice(INVALID)
        return {
            "id": i,
            "endpoint": endpoint,
            "body": {**body, "stream": rng.random() < 0.5},
            "n": 1,
            "invalid": True,
            "leave": None,
        }
    endpoint = rng.choice(["chat", "completions"])
    prompt = rng.choice(PROMPTS)
    body: dict = {"max_tokens": rng.randint(1, max_tokens), "stream": rng.random() < 0.5}
    body.update({"messages": [{"role": "user", "content": prompt}]} if endpoint == "chat" else {"prompt": prompt})
    if rng.random() < 0.4:
        body["temperature"] = 0
    else:
        body["temperature"] = rng.choice([0.5, 0.8, 1.0])
        if rng.random() < 0.5:
            body["top_p"] = rng.choice([0.5, 0.9])
        if rng.random() < 0.5:
            body["seed"] = rng.randint(0, 2**31)
    if rng.random() < 0.3:
        body["stop"] = rng.choice(STOPS)
    n = 2 if rng.random() < 0.1 else 1
    if n == 2:
        body["n"] = 2
    if rng.random() < 0.1:
        body.update({"logprobs": True, "top_logprobs": 2} if endpoint == "chat" else {"logprobs": 2})
    if body["stream"] and rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    leave = None
    if rng.random() < disconnect_rate:
        leave = ("after", rng.randint(0, 5)) if body["stream"] else ("delay", rng.uniform(0.02, 1.0))
    return {"id": i, "endpoint": endpoint, "body": body, "n": n, "invalid": False, "leave": leave}


def classify(req: dict, out: Outcome) -> str:
    """The request's ending (see the module docstring) from what its client saw."""
    if out.closed_early:
        return "disconnected"
    if req["invalid"]:
        return "rejected" if out.status == 400 and out.error and not out.problems else "error"
    if out.complete(req["n"], req["body"]["stream"]):
        return "stop" if "stop" in out.finish.values() else "length"
    return "broken" if out.problems else "error"


async def run_one(client, url: str, req: dict, deadline_s: float) -> dict:
    """Send `req`, leave as it says, and return its record: the request plus ``ending``,
    ``status``, ``finish``, ``error``, ``problems``, ``seconds``."""
    path = ENDPOINTS[req["endpoint"]]
    leave = req["leave"]
    t0 = time.monotonic()
    close_after = leave[1] if leave and leave[0] == "after" else None
    work = send(client, url, path, req["body"], close_after)
    try:
        if leave and leave[0] == "delay":
            try:
                out = await asyncio.wait_for(work, leave[1])
            except asyncio.TimeoutError:
                out = Outcome(closed_early=True)
        else:
            out = await asyncio.wait_for(work, deadline_s)
        ending = classify(req, out)
    except asyncio.TimeoutError:
        out, ending = Outcome(error=f"no end within {deadline_s:g} s"), "hung"
    except Exception as e:  # httpx errors: the connection failed
        out, ending = Outcome(error=f"{type(e).__name__}: {e}"[:300]), "lost"
    return {
        **req,
        "ending": ending,
        "status": out.status,
        "finish": out.finish,
        "error": out.error,
        "problems": out.problems,
        "seconds": round(time.monotonic() - t0, 3),
    }


async def drive(url: str, reqs: list[dict], concurrency: int, deadline_s: float) -> list[dict]:
    """Run `reqs` with at most `concurrency` in flight; returns their records in order."""
    from tqdm import tqdm

    gate = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(reqs), file=sys.stderr, mininterval=2)
    async with async_client(deadline_s, connect=30, connections=concurrency) as client:

        async def one(req: dict) -> dict:
            async with gate:
                rec = await run_one(client, url, req, deadline_s)
                bar.update()
                return rec

        records = await asyncio.gather(*(one(r) for r in reqs))
    bar.close()
    return records


class RssSampler:
    """Samples VmRSS (kB) of `pids` every `SAMPLE_EVERY_S` in a thread; a process that is
    gone stops being sampled. samples: pid -> [(monotonic s, kB)]; names: pid -> cmdline."""

    def __init__(self, pids: list[int]) -> None:
        self.samples: dict[int, list[tuple[float, int]]] = {p: [] for p in pids}
        self.names = {p: cmdline(p) for p in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            for pid, series in self.samples.items():
                kb = rss_kib(pid)
                if kb is not None:
                    series.append((now, kb))
            self._stop.wait(SAMPLE_EVERY_S)

    def quarters(self, t0: float, t1: float) -> dict[int, dict]:
        """Per pid: name, mean RSS in MiB of samples in the first and the last quarter of
        [t0, t1], the growth (last / first - 1), the RSS now (``idle_mib``: call it once the
        server is idle) and the series (seconds since t0, MiB)."""
        q = (t1 - t0) / 4
        out = {}
        for pid, series in self.samples.items():
            first = [kb for t, kb in series if t0 <= t < t0 + q]
            last = [kb for t, kb in series if t1 - q < t <= t1]
            if first and last:
                a, b = sum(first) / len(first) / 1024, sum(last) / len(last) / 1024
                out[pid] = {
                    "name": self.names[pid],
                    "first_mib": round(a, 1),
                    "last_mib": round(b, 1),
                    "growth": round(b / a - 1, 4),
                    "idle_mib": round((rss_kib(pid) or 0) / 1024, 1),
                    "series": [(round(t - t0, 1), round(kb / 1024, 1)) for t, kb in series],
                }
        return out


def report(
    records: list[dict], n: int, duration: float, idle: tuple[bool, str], healthy: bool, rss: dict[int, dict] | None
) -> dict:
    """The summary: endings counted, the checks (name -> (passed, detail)) and the memory table."""
    endings = Counter(r["ending"] for r in records)
    failures = {k: endings[k] for k in ("error", "broken", "lost", "hung")}
    checks = {
        "every request ended exactly once": (
            len(records) == n and len({r["id"] for r in records}) == n,
            f"{len(records)} records for {n} requests",
        ),
        "no failure (error, broken, lost, hung)": (sum(failures.values()) == 0, str(failures)),
        f"pool idle within {IDLE_S:g} s": idle,
        "server healthy afterwards": (healthy, "GET /health"),
    }
    if rss is not None:
        worst = max((v["growth"] for v in rss.values()), default=0.0)
        checks[f"RSS growth under {RSS_GROWTH_LIMIT:.0%}"] = (
            bool(rss) and worst < RSS_GROWTH_LIMIT,
            f"worst {worst:+.1%} over {len(rss)} processes",
        )
    return {
        "requests": n,
        "duration_s": round(duration, 1),
        "endings": dict(endings),
        "disconnects_sent": sum(1 for r in records if r["leave"]),
        "invalid_sent": sum(1 for r in records if r["invalid"]),
        "checks": {k: {"passed": ok, "detail": d} for k, (ok, d) in checks.items()},
        "rss": rss,
    }


def print_summary(s: dict) -> None:
    """The summary as markdown tables."""
    print(
        f"\n{s['requests']} requests in {s['duration_s']} s ({s['disconnects_sent']} set to disconnect, "
        f"{s['invalid_sent']} invalid)\n"
    )
    print("| ending | requests |\n|---|---|")
    for k, v in sorted(s["endings"].items()):
        print(f"| {k} | {v} |")
    print("\n| check | passed | detail |\n|---|---|---|")
    for k, c in s["checks"].items():
        print(f"| {k} | {'yes' if c['passed'] else 'NO'} | {c['detail']} |")
    if s["rss"]:
        print(
            "\n| pid | process | RSS first quarter MiB | RSS last quarter MiB | growth | RSS once idle MiB |\n"
            "|---|---|---|---|---|---|"
        )
        for pid, v in s["rss"].items():
            print(
                f"| {pid} | {v['name']} | {v['first_mib']} | {v['last_mib']} | {v['growth']:+.1%} | {v['idle_mib']} |"
            )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=None, help="a running server (default: launch one)")
    p.add_argument("--model", default=None, help="model for the launched server (default: a tiny random llama)")
    p.add_argument("--server-arg", action="append", default=[], help="extra launch.py argument (repeatable)")
    p.add_argument("--pid", type=int, action="append", default=[], help="with --url: a server process to sample")
    p.add_argument("--num-requests", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--disconnect-rate", type=float, default=0.1)
    p.add_argument("--invalid-rate", type=float, default=0.05)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--deadline-s", type=float, default=120.0, help="a request not ended by then is hung")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="/tmp/lazyserve-load.json")
    a = p.parse_args()

    from tests.support.launcher import Server
    from tests.support.pool_state import wait_idle

    rng = random.Random(a.seed)
    reqs = [make_request(rng, i, a.max_tokens, a.disconnect_rate, a.invalid_rate) for i in range(a.num_requests)]
    server, tmp = None, None
    try:
        if a.url is None:
            model = a.model
            if model is None:
                tmp = tempfile.TemporaryDirectory()
                model = tiny_model(Path(tmp.name))
            server = Server(["--model", model, *a.server_arg], Path(a.json).with_suffix(".server.log"))
            url, pids = server.base_url, [server.proc.pid, *server.children]
        else:
            url, pids = a.url.rstrip("/"), a.pid
        with RssSampler(pids) as sampler:
            t0 = time.monotonic()
            records = asyncio.run(drive(url, reqs, a.concurrency, a.deadline_s))
            t1 = time.monotonic()
        try:
            idle = (True, f"idle after {wait_idle(url, IDLE_S):.2f} s")
        except AssertionError as e:
            idle = (False, str(e)[:300])
        summary = report(
            records, a.num_requests, t1 - t0, idle, healthy(url), sampler.quarters(t0, t1) if pids else None
        )
    finally:
        if server is not None:
            server.stop()
        if tmp is not None:
            tmp.cleanup()
    summary["args"] = vars(a)
    Path(a.json).write_text(json.dumps({**summary, "records": records}, indent=1, default=str))
    print_summary(summary)
    print(f"\nwrote {a.json}")
    return 0 if all(c["passed"] for c in summary["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
