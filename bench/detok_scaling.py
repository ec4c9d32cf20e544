"""Detokenizer replica scaling (issue 5): streamed characters per second with 1, 2 and 4
replicas, in one run, under a detokenization-bound load.

Three loads:

(a) pipeline: the real replica processes (``python -m detokenizer_proc RUN_DIR INDEX``),
    registered and fed by this process playing the scheduler with the real `DetokRouter`
    and `ReplicaControl`; the tokenizer's side is a sink process of its own (as in the
    server) that counts the characters of the `BatchStrOut` rows. A fake worker "emits"
    one token per request per step from a multilingual text (emoji, CJK, accents),
    `--requests` requests at once, each with two stop strings that never match; a window
    of `--window` steps in flight keeps the replicas saturated without queueing without
    bound. Requests end after `--tokens` tokens and new ones replace them. Detokenization
    is the only real work here.
(c) ceiling (skip with ``--no-ceiling``): the replica's render work alone
    (`DetokenizerManager.tokens` on the same batches, no sockets) in N processes at once:
    what the machine's cores give any N CPU-bound processes, the most (a) can reach.
(b) server (``--server``): `launch.py` with a tiny random model (written to a temp dir) and
    `--concurrency` streams over HTTP; characters counted at the client. Here the HTTP
    front, the model and the client share the machine's cores with the replicas.

    python bench/detok_scaling.py [--replicas 1 2 4] [--seconds 5] [--rounds 3] [--server]

Every count is measured `--rounds` times in alternating order (1 2 4, 4 2 1, ...); each
markdown table gives the median, the median of the per-round ratios to the first count and
every round's ratio. Detokenizing is CPU-bound, so replicas scale with free cores: on a
2-core machine (where the scheduler side and the sink also need CPU) 2 replicas cannot
reach 2x.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TEXT = (
    "The café on Rue 日本語 serves 🍣 and 🌶️ ramen; 한국어 menus, naïve crème brûlée ✓ 👍🏽. "
    "Numbers 12345 and symbols ∑∫√ mix with English prose about distributed systems, where each "
    "process owns one concern and the messages between them are small. "
)
SHAPE_DIR = ROOT / "bench" / "smollm2-shape"


def _cpu_s(pid: int, zmq_only: bool = False) -> float:
    """CPU seconds (user + system) process `pid` has used (Linux /proc); zmq_only: only its
    ZeroMQ background I/O threads' (named ``ZMQbg/...``)."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        if zmq_only and not stat[stat.index("(") + 1 :].startswith("ZMQbg"):
            continue
        fields = stat.rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def _sink(endpoint: str, counts, stop) -> None:
    """Load (a)'s tokenizer side, a process of its own as in the server: count the rows and
    characters of the `BatchStrOut`s on `endpoint` into counts[0] and counts[1] (a shared
    int64 array) until stop.value is set."""
    import zmq

    from protocol import codec
    from protocol.messages import BatchStrOut

    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    sock.bind(endpoint)
    decode = codec.to_tokenizer.decode
    while not stop.value:
        if not sock.poll(100):
            continue
        while True:
            try:
                msg = decode(sock.recv(zmq.NOBLOCK))
            except zmq.Again:
                break
            if isinstance(msg, BatchStrOut):
                counts[1] += sum(map(len, msg.text_deltas))
                counts[0] += len(msg.rids)
    ctx.destroy(linger=0)


def pipeline(replicas: int, seconds: float, requests: int, tokens: int, window: int, pin: bool = False) -> dict:
    """Run load (a) with `replicas` replica processes (pin: each on its own core, this
    process on core 0, with taskset); returns chars/s, tokens/s and the cores used by the
    replicas, this process (the scheduler's side) and the sink (the tokenizer's side)."""
    import multiprocessing as mp

    import zmq

    from protocol import codec, endpoints
    from protocol.config import ModelSource, ServerArgs
    from protocol.messages import DetokParams, GenerateReq, SamplingParams
    from scheduler_proc.outbox import SocketOutbox
    from scheduler_proc.replicas.control import REPLICA_MESSAGES, ReplicaControl
    from scheduler_proc.replicas.router import DetokRouter
    from scheduler_proc.req import Req
    from text.hf_tokenizer import load_tokenizer

    source = ModelSource("hf", str(SHAPE_DIR), "smollm2-shape")
    ids = load_tokenizer(source).encode(TEXT * 8, add_special_tokens=False)
    run_dir = tempfile.mkdtemp(prefix="lazyserve-bench-")
    args = ServerArgs(model=source, run_dir=run_dir, detokenizers=replicas, log_level="warning")
    args.save()
    mpc = mp.get_context("spawn")
    counts, stop = mpc.RawArray("q", 2), mpc.RawValue("b", 0)
    sink = mpc.Process(target=_sink, args=(endpoints.tokenizer(run_dir), counts, stop))
    sink.start()
    ctx = zmq.Context()
    inbox, launch_control = ctx.socket(zmq.PULL), ctx.socket(zmq.PULL)
    inbox.bind(endpoints.scheduler(run_dir))
    launch_control.bind(endpoints.control(run_dir))
    out = SocketOutbox(ctx, args)  # the scheduler's own links: to each replica, and to the tokenizer

    class _Log:
        def __getattr__(self, _):
            return lambda *a, **k: None

    router = DetokRouter(out, replicas, log=_Log())
    control = ReplicaControl(ctx, run_dir, router, _Log())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if pin:
        os.sched_setaffinity(0, {0})
    procs = [
        subprocess.Popen(
            (["taskset", "-c", str(1 + i % (os.cpu_count() - 1))] if pin else [])
            + [sys.executable, "-m", "detokenizer_proc", run_dir, str(i)],
            cwd=str(ROOT),
            env=env,
        )
        for i in range(replicas)
    ]

    def service() -> None:
        control.drain()
        while True:
            try:
                msg = codec.to_scheduler.decode(inbox.recv(zmq.NOBLOCK))
            except zmq.Again:
                break
            if isinstance(msg, REPLICA_MESSAGES):
                control.handle(msg)
        while True:
            try:
                launch_control.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
        router.tick()

    def cpu() -> tuple:
        return (
            [_cpu_s(p.pid) for p in procs],
            _cpu_s(os.getpid()),
            [_cpu_s(p.pid, True) for p in procs],
            _cpu_s(sink.pid),
            counts[0],
            counts[1],
        )

    try:
        deadline = time.monotonic() + 120
        while not all(r.pid for r in router.replicas):
            service()
            time.sleep(0.01)
            if time.monotonic() > deadline:
                raise RuntimeError("replicas did not register")
        params = DetokParams(stop=["<<END-OF-TEXT>>", "\n\n\n\n"], prompt_tail_ids=ids[:4])
        serial = 0

        def new_req() -> tuple[Req, int]:
            nonlocal serial
            serial += 1
            req = Req.from_msg(GenerateReq(f"b{serial}", ids[:4], tokens, SamplingParams(), params))
            router.start(req)
            return req, (serial * 37) % (len(ids) - tokens)

        live = [new_req() for _ in range(requests)]
        sent_steps = 0
        t0 = time.monotonic()
        warmup, first = 2.0, None
        while True:
            now = time.monotonic()
            if first is None and now - t0 > warmup:
                first, t_start = cpu(), now
            if first is not None and now - t_start > seconds:
                last, t_end = cpu(), now
                break
            if sent_steps - counts[0] // requests >= window:
                time.sleep(0.0002)  # the sink has not caught up: wait for rows to come back
                service()
                continue
            rows, ended = [], []
            for k, (req, start) in enumerate(live):
                tok = ids[start + len(req.output_ids)]
                req.check_finish(tok)
                rows.append((req, [tok]))
                if req.finished:
                    ended.append(k)
            router.tokens(rows)
            for k in ended:
                req = live[k][0]
                router.close(req)
                router.streams_closed([req.rid])
                live[k] = new_req()
            sent_steps += 1
            service()
        dt = t_end - t_start
        return {
            "chars_s": (last[5] - first[5]) / dt,
            "tokens_s": (last[4] - first[4]) / dt,
            "replica_cores": sum(b - a for a, b in zip(first[0], last[0])) / dt,
            "zmq_cores": sum(b - a for a, b in zip(first[2], last[2])) / dt,
            "driver_cores": (last[1] - first[1]) / dt,
            "sink_cores": (last[3] - first[3]) / dt,
            "load": os.getloadavg()[0],
        }
    finally:
        if pin:
            os.sched_setaffinity(0, range(os.cpu_count()))
        router.shutdown()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        stop.value = 1
        sink.join(10)
        ctx.destroy(linger=0)
        subprocess.run(["rm", "-rf", run_dir])


# ----------------------------------------------------------------------------- (c) ceiling
def _render_alone(ids: list[int], seconds: float, requests: int, tokens: int, barrier, out) -> None:
    """One process of load (c): a `DetokenizerManager` renders `BatchTokenOut`s built like
    load (a)'s (`requests` rows a step, one token a row, requests replaced after `tokens`),
    with no sockets, for `seconds` once every process has passed `barrier`; puts rows/s on
    `out`."""
    from detokenizer_proc.manager import DetokenizerManager
    from protocol.config import ModelSource
    from protocol.enums import FinishReason
    from protocol.messages import BatchTokenOut, DetokParams, DetokSeed
    from text.hf_tokenizer import load_tokenizer

    manager = DetokenizerManager(load_tokenizer(ModelSource("hf", str(SHAPE_DIR), "smollm2-shape")))
    params = DetokParams(stop=["<<END-OF-TEXT>>", "\n\n\n\n"], prompt_tail_ids=ids[:4])
    live, serial = [], 0

    def new() -> list:
        nonlocal serial
        serial += 1
        manager.seed(DetokSeed(f"c{serial}", params, 4))
        return [f"c{serial}", (serial * 37) % (len(ids) - tokens), 0]

    live = [new() for _ in range(requests)]
    barrier.wait()
    rows, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        batch = BatchTokenOut(
            [r[0] for r in live],
            [[ids[r[1] + r[2]]] for r in live],
            [r[2] + 1 for r in live],
            [None if r[2] + 1 < tokens else FinishReason.LENGTH for r in live],
        )
        manager.tokens(batch)
        rows += len(live)
        for k, r in enumerate(live):
            r[2] += 1
            if r[2] == tokens:
                live[k] = new()
    out.put(rows / (time.monotonic() - t0))


def ceiling(processes: int, seconds: float, requests: int, tokens: int) -> dict:
    """Load (c): the replica's render work alone (no sockets, no scheduler) in `processes`
    processes at once, `requests` / `processes` rows a step each. Its ratio over 1 process
    is what this machine's cores allow any N CPU-bound processes, the ceiling for (a)."""
    import multiprocessing as mp

    from protocol.config import ModelSource
    from text.hf_tokenizer import load_tokenizer

    ids = load_tokenizer(ModelSource("hf", str(SHAPE_DIR), "smollm2-shape")).encode(TEXT * 8, add_special_tokens=False)
    ctx = mp.get_context("spawn")
    q, barrier = ctx.Queue(), ctx.Barrier(processes)
    procs = [
        ctx.Process(target=_render_alone, args=(ids, seconds, max(1, requests // processes), tokens, barrier, q))
        for _ in range(processes)
    ]
    for p in procs:
        p.start()
    rates = [q.get() for _ in procs]
    for p in procs:
        p.join()
    return {"tokens_s": sum(rates), "slowest": min(rates), "fastest": max(rates)}


# ----------------------------------------------------------------------------- (b) server
async def _http_load(url: str, concurrency: int, tokens: int, seconds: float) -> tuple[int, float]:
    from bench.client import COMPLETIONS, async_client, request_body, stream_chunks

    chars = 0
    stop_at = time.monotonic() + seconds

    async def one(c, i: int) -> None:
        nonlocal chars
        while time.monotonic() < stop_at:
            body = {
                **request_body(f"Story {i}: 日本語 🍣", tokens, "completions"),
                "stop": ["<<END-OF-TEXT>>", "\n\n\n\n"],
            }
            async for chunk in stream_chunks(c, url, body, COMPLETIONS):
                chars += sum(len(choice["text"]) for choice in chunk["choices"])

    async with async_client(300, connections=concurrency + 4) as c:
        t0 = time.monotonic()
        await asyncio.gather(*(one(c, i) for i in range(concurrency)))
        return chars, time.monotonic() - t0


def server(replicas: int, seconds: float, concurrency: int, tokens: int, model: str) -> dict:
    """Run load (b) against a fresh server with `replicas` replicas."""
    from tests.support.launcher import Server

    with tempfile.TemporaryDirectory() as logs:
        srv = Server(
            ["--model", model, "--detokenizers", str(replicas), "--log-level", "warning"], Path(logs) / "server.log"
        )
        try:
            asyncio.run(_http_load(srv.base_url, concurrency, tokens, 2.0))  # warm-up
            chars, dt = asyncio.run(_http_load(srv.base_url, concurrency, tokens, seconds))
        finally:
            srv.stop()
    return {"chars_s": chars / dt}


def rounds(run: Callable[[int], dict], counts: list[int], n_rounds: int, label: str) -> dict[int, list[dict]]:
    """run(n) for each n in `counts`, `n_rounds` times, in alternating order (1 2 4, 4 2 1,
    ...) so that drift of a noisy machine falls on every count alike."""
    out: dict[int, list[dict]] = {n: [] for n in counts}
    for r in range(n_rounds):
        for n in counts if r % 2 == 0 else counts[::-1]:
            res = run(n)
            out[n].append(res)
            print(
                f"{label}, round {r + 1}, {n}: "
                + ", ".join(f"{k} {v:,.2f}" for k, v in res.items() if isinstance(v, float)),
                flush=True,
            )
    return out


def table(title: str, results: dict[int, list[dict]], key: str, cols: dict[str, str]) -> str:
    """Markdown table: per count, the median of `key` over rounds, the median of the
    per-round ratios to the first count (each ratio from one round, measured minutes
    apart at most), the ratios of each round, and the mean of each column in `cols`
    (result key -> header)."""
    base = next(iter(results))
    lines = [
        f"**{title}**",
        "",
        f"| n | {key.replace('_s', '/s')} (median) | vs {base} (median of rounds) | per round |"
        + "".join(f" {h} |" for h in cols.values()),
        "|---|---|---|---|" + "---|" * len(cols),
    ]
    for n, res in results.items():
        ratios = [r[key] / b[key] for r, b in zip(res, results[base])]
        means = [statistics.mean(r[c] for r in res) for c in cols]
        extra = "".join(f" {m:,.0f} |" if m >= 100 else f" {m:.2f} |" for m in means)
        lines.append(
            f"| {n} | {statistics.median(r[key] for r in res):,.0f} | {statistics.median(ratios):.2f}x | "
            + " / ".join(f"{x:.2f}" for x in ratios)
            + f" |{extra}"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--seconds", type=float, default=5.0, help="measured seconds per point (after 2 s warm-up)")
    p.add_argument("--rounds", type=int, default=3, help="measure every count this many times, alternating the order")
    p.add_argument("--requests", type=int, default=128, help="pipeline: concurrent requests")
    p.add_argument("--tokens", type=int, default=256, help="tokens per request")
    p.add_argument("--window", type=int, default=8, help="pipeline: steps in flight")
    p.add_argument("--pin", action="store_true", help="pipeline: pin each replica to its own core (taskset)")
    p.add_argument("--no-ceiling", action="store_true", help="skip load (c), the render work alone in N processes")
    p.add_argument("--server", action="store_true", help="also run load (b) through launch.py and HTTP")
    p.add_argument("--concurrency", type=int, default=64, help="server: concurrent streams")
    ns = p.parse_args()
    cores = os.cpu_count()
    print(f"# detokenizer scaling on {cores} CPU cores ({sys.platform}), {ns.rounds} rounds", flush=True)
    piped = rounds(
        lambda n: pipeline(n, ns.seconds, ns.requests, ns.tokens, ns.window, ns.pin), ns.replicas, ns.rounds, "pipeline"
    )
    tables = [
        table(
            f"(a) pipeline: replicas, {ns.requests} requests, fake scheduler, sink process, {cores} cores"
            + (", replicas pinned to cores" if ns.pin else ""),
            piped,
            "chars_s",
            {
                "tokens_s": "tokens/s",
                "replica_cores": "replica cores busy",
                "zmq_cores": "of which zmq I/O",
                "driver_cores": "scheduler side cores",
                "sink_cores": "sink cores",
            },
        )
    ]
    if not ns.no_ceiling:
        ceil = rounds(lambda n: ceiling(n, ns.seconds, ns.requests, ns.tokens), ns.replicas, ns.rounds, "ceiling")
        tables.append(
            table(
                f"(c) ceiling: processes rendering alone, no sockets, {cores} cores",
                ceil,
                "tokens_s",
                {"slowest": "slowest process tokens/s", "fastest": "fastest process tokens/s"},
            )
        )
    if ns.server:
        from bench.client import tiny_model

        with tempfile.TemporaryDirectory() as d:
            model = tiny_model(Path(d))
            served = rounds(
                lambda n: server(n, ns.seconds, ns.concurrency, ns.tokens, model), ns.replicas, ns.rounds, "server"
            )
        tables.append(
            table(
                f"(b) server: replicas, tiny random model, {ns.concurrency} streams over HTTP, {cores} cores",
                served,
                "chars_s",
                {},
            )
        )
    print()
    print("\n\n".join(tables))


if __name__ == "__main__":
    main()
