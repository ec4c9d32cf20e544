"""Soak and leak check: several rounds of the same mixed workload against ONE server, with
each server process sampled between and during rounds, to see state that grows while the
server runs.

    python bench/soak.py [--model DIR] [--rounds 3] [--round-s 120] [--concurrency 16]
        [--max-requests 100000] [--seed 0] [--server-arg=--max-running-requests=8 ...]
        [--json OUT]

It launches ``launch.py`` (default model unless ``--model``; ``--model tiny`` writes the
tiny random llama the tests use) on 127.0.0.1, then runs ``--rounds`` rounds; each sends
requests from the mix for ``--round-s`` seconds (at most ``--max-requests``) with at most
``--concurrency`` in flight. The mix, drawn from ``--seed`` and the same each round: chat,
completions, native ``/generate``, Anthropic ``/v1/messages`` and ``/v1/responses``,
streamed or not; n=2, logprobs, seeds, penalties, ``json_schema`` and tools, stop strings,
a long shared prefix (prefix-cache repeats), streams left after a few events, requests left
almost at once (most are still queued: an abort of a queued request), and invalid bodies
(which must get a 4xx).

Per process (launch and each child: tokenizer, scheduler, worker, detokenizer replicas) it
samples VmRSS, open fds and threads every 0.5 s; after each round it waits for `/metrics`
to be idle and samples again after ``--settle-s``. The table printed compares, per process,
the idle sample after each round: growth between the last two rounds (the first warms
caches) is the leak signal. Exit status 1 when a request failed unexpectedly, the server did
not go idle within 2 s, or a process's idle RSS grew more than ``--rss-limit`` MiB or its
fd count grew by more than `FD_SLACK` or its thread count grew between the
last two rounds. With the prefix cache on, the worker's RSS grows while the radix cache
holds more of the KV pool (pages touched for the first time): compare with
``--server-arg=--disable-radix-cache`` before calling that a leak.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


from bench.client import async_client, cmdline, healthy, served_model, sse_data, tiny_model  # noqa: E402

LONG_PREFIX = ("You are a careful assistant. " + "Answer briefly and precisely, citing nothing. " * 24).strip()
PROMPTS = [
    "Once upon a time",
    "def fib(n):\n    return",
    "東京の天気は",
    "Écris un poème 🌸 sur la mer",
    "List three colors:",
    "print('hello') # 👋",
    "1, 2, 3, 4,",
]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
INVALID = [
    ("/v1/completions", {"prompt": "Hi", "max_tokens": -1}),
    ("/v1/chat/completions", {"messages": []}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "n": 0}),
    (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "Hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}},
        },
    ),
    ("/v1/messages", {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}),
    ("/v1/responses", {"input": "Hi", "temperature": 9}),
    ("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": -3}}),
]
SAMPLE_EVERY_S = 0.5
MODEL = "default"
"""The served model name (Anthropic requests name it); `main` sets it from /v1/models."""
IDLE_S = 2.0
FD_SLACK = 2
"""Open fds an idle sample may show above the previous one: client connections the HTTP
process has not finished closing yet."""


def make_request(rng: random.Random, max_tokens: int) -> dict:
    """One request of the mix: {"path", "body", "leave", "expect"}; leave is None,
    ``("after", k)`` (close a stream after k lines) or ``("delay", s)``; expect is "ok" or
    "4xx"."""
    if rng.random() < 0.05:
        path, body = rng.choice(INVALID)
        return {"path": path, "body": {**body, "stream": rng.random() < 0.5}, "leave": None, "expect": "4xx"}
    kind = rng.choices(["chat", "completions", "generate", "messages", "responses"], [4, 2, 1, 1, 1])[0]
    prompt = rng.choice(PROMPTS)
    if rng.random() < 0.3:
        prompt = LONG_PREFIX + "\n" + prompt  # the prefix cache serves the shared part again
    stream = rng.random() < 0.5
    mt = rng.randint(1, max_tokens)
    sampled = {} if rng.random() < 0.4 else {"temperature": rng.choice([0.5, 1.0]), "top_p": 0.9}
    if sampled and rng.random() < 0.5:
        sampled["seed"] = rng.randint(0, 2**31)
    stop = rng.choice([["\n"], [".", "!"], ["the"]]) if rng.random() < 0.25 else None
    if kind in ("chat", "completions"):
        body: dict = {"max_tokens": mt, "stream": stream, **sampled}
        body.update({"messages": [{"role": "user", "content": prompt}]} if kind == "chat" else {"prompt": prompt})
        if stop:
            body["stop"] = stop
        if rng.random() < 0.1:
            body["n"] = 2
        if rng.random() < 0.1:
            body.update({"logprobs": True, "top_logprobs": 2} if kind == "chat" else {"logprobs": 2})
        if rng.random() < 0.15:
            body.update({"frequency_penalty": 0.5, "presence_penalty": 0.3, "repetition_penalty": 1.2})
        if kind == "chat" and rng.random() < 0.1:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}
        elif kind == "chat" and rng.random() < 0.1:
            body.update({"tools": TOOLS, "tool_choice": rng.choice(["auto", "required"])})
        if stream and rng.random() < 0.5:
            body["stream_options"] = {"include_usage": True}
        path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    elif kind == "generate":
        sp = {"max_new_tokens": mt, **sampled}
        if stop:
            sp["stop"] = stop
        if rng.random() < 0.1:
            sp["n"] = 2
        body = {"text": prompt, "sampling_params": sp, "stream": stream, "return_logprob": rng.random() < 0.2}
        path = "/generate"
    elif kind == "messages":
        body = {
            "model": MODEL,
            "max_tokens": mt,
            "stream": stream,
            "messages": [{"role": "user", "content": prompt}],
            **{k: v for k, v in sampled.items() if k != "seed"},
        }
        if stop:
            body["stop_sequences"] = stop
        path = "/v1/messages"
    else:
        body = {
            "input": prompt,
            "max_output_tokens": max(mt, 16),
            "stream": stream,
            **{k: v for k, v in sampled.items() if k != "seed"},
        }
        path = "/v1/responses"
    leave = None
    r = rng.random()
    if r < 0.08:
        leave = ("after", rng.randint(1, 4)) if stream else ("delay", rng.uniform(0.05, 0.8))
    elif r < 0.13:
        leave = ("delay", 0.02)  # gone before admission when the queue is long
    return {"path": path, "body": body, "leave": leave, "expect": "ok"}


async def run_one(client, url: str, req: dict, deadline_s: float) -> str:
    """Send `req`, leave as it says; returns its ending: ok, rejected (an expected 4xx),
    left, or a failure (``fail:<why>``)."""
    body, leave = req["body"], req["leave"]

    async def go() -> str:
        if not body.get("stream"):
            r = await client.post(f"{url}{req['path']}", json=body)
            return _status_ending(req, r.status_code, r.text)
        async with client.stream("POST", f"{url}{req['path']}", json=body) as r:
            if r.status_code != 200:
                return _status_ending(req, r.status_code, (await r.aread()).decode(errors="replace"))
            lines = 0
            async for payload in sse_data(r):
                lines += 1
                if payload.startswith('{"error"') and '"type"' in payload:
                    return f"fail:error event {payload[:120]}"
                if leave and leave[0] == "after" and lines >= leave[1]:
                    return "left"
            return "ok" if req["expect"] == "ok" else "fail:200 for an invalid body"

    try:
        if leave and leave[0] == "delay":
            try:
                return await asyncio.wait_for(go(), leave[1])
            except asyncio.TimeoutError:
                return "left"
        return await asyncio.wait_for(go(), deadline_s)
    except asyncio.TimeoutError:
        return "fail:hung"
    except Exception as e:  # httpx: the connection failed
        return f"fail:{type(e).__name__}"


def _status_ending(req: dict, status: int, text: str) -> str:
    if req["expect"] == "4xx":
        return "rejected" if 400 <= status < 500 else f"fail:{status} for an invalid body"
    return "ok" if status == 200 else f"fail:{status} {text[:120]}"


async def drive(
    url: str, rng: random.Random, seconds: float, max_requests: int, concurrency: int, max_tokens: int
) -> Counter:
    """Send mix requests for `seconds` (at most `max_requests`), `concurrency` in flight."""
    endings: Counter = Counter()
    stop_at = time.monotonic() + seconds
    count = 0
    async with async_client(120, connect=30, connections=concurrency) as client:

        async def lane() -> None:
            nonlocal count
            while time.monotonic() < stop_at and count < max_requests:
                count += 1
                endings[await run_one(client, url, make_request(rng, max_tokens), 120)] += 1

        await asyncio.gather(*(lane() for _ in range(concurrency)))
    return endings


def sample(pid: int) -> dict | None:
    """VmRSS (MiB), open fds and threads of `pid`; None when it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(list(Path(f"/proc/{pid}/fd").iterdir()))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"rss_mib": round(int(fields["VmRSS"].split()[0]) / 1024, 1), "fds": fds, "threads": int(fields["Threads"])}


def server_pids(root: int) -> list[int]:
    """`root` and all its descendants."""
    from tests.support.launcher import child_pids

    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(child_pids(p))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model dir; 'tiny': a tiny random llama; default: launch's")
    p.add_argument("--server-arg", action="append", default=[], help="extra launch.py argument (repeatable)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--round-s", type=float, default=120.0)
    p.add_argument("--max-requests", type=int, default=100000, help="per round")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--settle-s", type=float, default=3.0, help="seconds after idle before the idle sample")
    p.add_argument("--rss-limit", type=float, default=8.0, help="MiB a process's idle RSS may grow per round")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="/tmp/lazyserve-soak.json")
    a = p.parse_args()

    from tests.support.launcher import Server
    from tests.support.pool_state import metrics, wait_idle

    tmp, args = None, list(a.server_arg)
    if a.model == "tiny":
        tmp = tempfile.TemporaryDirectory()
        args = ["--model", tiny_model(Path(tmp.name)), *args]
    elif a.model:
        args = ["--model", a.model, *args]
    server = Server(args, Path(a.json).with_suffix(".server.log"))
    rounds, ok = [], True
    try:
        url, pids = server.base_url, server_pids(server.proc.pid)
        global MODEL
        MODEL = served_model(url)
        names = {pid: cmdline(pid) for pid in pids}
        base = {pid: sample(pid) for pid in pids}
        for k in range(a.rounds):
            rng = random.Random(a.seed)  # the same mix each round
            peak: dict[int, dict] = {}
            t0 = time.monotonic()

            async def sampler(done: asyncio.Event) -> None:
                while not done.is_set():
                    for pid in pids:
                        s = sample(pid)
                        if s:
                            peak[pid] = {key: max(v, peak.get(pid, {}).get(key, 0)) for key, v in s.items()}
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(done.wait(), SAMPLE_EVERY_S)

            async def round_() -> Counter:
                done = asyncio.Event()
                task = asyncio.create_task(sampler(done))
                try:
                    return await drive(url, rng, a.round_s, a.max_requests, a.concurrency, a.max_tokens)
                finally:
                    done.set()
                    await task

            endings = asyncio.run(round_())
            t1 = time.monotonic()
            try:
                idle_after = round(wait_idle(url, IDLE_S), 2)
            except AssertionError as e:
                idle_after, ok = str(e)[:300], False
            time.sleep(a.settle_s)
            m = metrics(url)
            idle = {pid: sample(pid) for pid in pids}
            rounds.append(
                {
                    "round": k + 1,
                    "seconds": round(t1 - t0, 1),
                    "endings": dict(endings),
                    "idle_after_s": idle_after,
                    "peak": peak,
                    "idle": idle,
                    "metrics": {key: v for key, v in m.items() if "bucket" not in key and "_sum" not in key},
                }
            )
            fails = {e: c for e, c in endings.items() if e.startswith("fail")}
            ok = ok and not fails
            print(
                f"round {k + 1}: {sum(endings.values())} requests in {t1 - t0:.0f} s {dict(endings)}; "
                f"idle after {idle_after} s; kv cached {m.get('lazyserve_kv_cached_tokens')} "
                f"free {m.get('lazyserve_kv_free_tokens')}/{m.get('lazyserve_kv_pool_tokens')}",
                flush=True,
            )
        up = healthy(url)
        ok = ok and up
    finally:
        server.stop()
        if tmp is not None:
            tmp.cleanup()
    print(
        "\n| pid | process | base RSS/fds/thr | "
        + " | ".join(f"idle after r{r['round']}" for r in rounds)
        + " | peak last round |\n|---|---|---|"
        + "---|" * len(rounds)
        + "---|"
    )
    for pid in pids:
        cells = [
            f"{r['idle'][pid]['rss_mib']}/{r['idle'][pid]['fds']}/{r['idle'][pid]['threads']}"
            if r["idle"].get(pid)
            else "gone"
            for r in rounds
        ]
        b, pk = base.get(pid) or {}, rounds[-1]["peak"].get(pid, {}) if rounds else {}
        print(
            f"| {pid} | {names[pid][:40]} | {b.get('rss_mib')}/{b.get('fds')}/{b.get('threads')} | "
            + " | ".join(cells)
            + f" | {pk.get('rss_mib')}/{pk.get('fds')}/{pk.get('threads')} |"
        )
        if len(rounds) >= 2:
            x, y = rounds[-2]["idle"].get(pid), rounds[-1]["idle"].get(pid)
            if (
                not x
                or not y
                or y["rss_mib"] - x["rss_mib"] > a.rss_limit
                or y["fds"] > x["fds"] + FD_SLACK
                or y["threads"] > x["threads"]
            ):
                ok = False
                print(f"  ^ grew between the last two rounds: {x} -> {y}")
    Path(a.json).write_text(
        json.dumps(
            {"args": vars(a), "names": names, "base": base, "rounds": rounds, "healthy": up if rounds else None},
            indent=1,
            default=str,
        )
    )
    print(f"\nwrote {a.json}; {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
