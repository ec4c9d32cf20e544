"""Detokenizer replica scaling (issue 5): streamed characters per second with 1, 2 and 4
replicas, in one run, under a detokenization-bound load.

Two loads:

(a) pipeline: the real replica processes (``python -m detokenizer_proc RUN_DIR INDEX``),
    registered and fed by this process playing the scheduler with the real `DetokRouter`
    and `ReplicaControl`, and playing the tokenizer (a sink that counts the characters of
    the `BatchStrOut` rows). A fake worker "emits" one token per request per step from a
    multilingual text (emoji, CJK, accents), `--requests` requests at once, each with two
    stop strings that never match; a window of `--window` steps in flight keeps the
    replicas saturated without queueing without bound. Requests end after `--tokens`
    tokens and new ones replace them. Detokenization is the only real work here.
(b) server (``--server``): `launch.py` with a tiny random model (written to a temp dir) and
    `--concurrency` streams over HTTP; characters counted at the client. Here the HTTP
    front, the model and the client share the machine's cores with the replicas.

    python bench/detok_scaling.py [--replicas 1 2 4] [--seconds 8] [--server]

Prints a markdown table; the ratio column is chars/s over the 1-replica run. Detokenizing
is CPU-bound Python, so replicas scale with free cores: on a 2-core machine (where the
producer and sink also need CPU) 2 replicas cannot reach 2x.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TEXT = ("The café on Rue 日本語 serves 🍣 and 🌶️ ramen; 한국어 menus, naïve crème brûlée ✓ 👍🏽. "
        "Numbers 12345 and symbols ∑∫√ mix with English prose about distributed systems, where each "
        "process owns one concern and the messages between them are small. ")
SHAPE_DIR = ROOT / "bench" / "smollm2-shape"


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pipeline(replicas: int, seconds: float, requests: int, tokens: int, window: int, pin: bool = False) -> dict:
    """Run load (a) with `replicas` replica processes (pin: each on its own core, this
    process on core 0, with taskset); returns chars/s, tokens/s and the cores used."""
    import zmq

    from protocol import codec, endpoints
    from protocol.config import ModelSource, ServerArgs
    from protocol.messages import BatchStrOut, DetokParams, GenerateReq, SamplingParams
    from scheduler_proc.detok_router import DetokRouter
    from scheduler_proc.proc import SocketOutbox
    from scheduler_proc.replica_control import REPLICA_MESSAGES, ReplicaControl
    from scheduler_proc.req import Req
    from tokenizer_proc.hf_tokenizer import load_tokenizer

    source = ModelSource("hf", str(SHAPE_DIR), "smollm2-shape")
    ids = load_tokenizer(source).encode(TEXT * 8, add_special_tokens=False)
    run_dir = tempfile.mkdtemp(prefix="lazyserve-bench-")
    args = ServerArgs(model=source, run_dir=run_dir, detokenizers=replicas, log_level="warning")
    args.save()
    ctx = zmq.Context()
    inbox, sink, launch_control = ctx.socket(zmq.PULL), ctx.socket(zmq.PULL), ctx.socket(zmq.PULL)
    inbox.bind(endpoints.scheduler(run_dir))
    sink.bind(endpoints.tokenizer(run_dir))
    launch_control.bind(endpoints.control(run_dir))
    out = SocketOutbox(ctx, args)  # the scheduler's own links: to each replica, and to the sink

    class _Log:
        def __getattr__(self, _):
            return lambda *a, **k: None

    router = DetokRouter(out, replicas, log=_Log())
    control = ReplicaControl(ctx, run_dir, router, _Log())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if pin:
        os.sched_setaffinity(0, {0})
    procs = [subprocess.Popen((["taskset", "-c", str(1 + i % (os.cpu_count() - 1))] if pin else [])
                              + [sys.executable, "-m", "detokenizer_proc", run_dir, str(i)], cwd=str(ROOT), env=env)
             for i in range(replicas)]

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

    try:
        deadline = time.monotonic() + 120
        while not all(r.pid for r in router.replicas):
            service()
            time.sleep(0.01)
            if time.monotonic() > deadline:
                raise RuntimeError("replicas did not register")
        params = DetokParams(stop=["<<END-OF-TEXT>>", "\n\n\n\n"], prompt_tail_ids=ids[:4])
        live: list[tuple[Req, int]] = []
        serial = 0

        def new_req() -> tuple[Req, int]:
            nonlocal serial
            serial += 1
            req = Req.from_msg(GenerateReq(f"b{serial}", ids[:4], tokens, SamplingParams(), params))
            router.start(req)
            return req, (serial * 37) % (len(ids) - tokens)

        live = [new_req() for _ in range(requests)]
        sent_steps = rows_in = chars = 0
        t_start = t_end = None
        measured = {"chars": 0, "rows": 0}
        poller = zmq.Poller()
        poller.register(sink, zmq.POLLIN)
        t0 = time.monotonic()
        warmup = 2.0
        while True:
            now = time.monotonic()
            if t_start is None and now - t0 > warmup:
                t_start, measured = now, {"chars": 0, "rows": 0}
                cpu0 = [_cpu_s(p.pid) for p in procs], _cpu_s(os.getpid())
            if t_start is not None and now - t_start > seconds:
                t_end = now
                cpu1 = [_cpu_s(p.pid) for p in procs], _cpu_s(os.getpid())
                break
            if sent_steps - rows_in // requests < window:
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
                continue
            if poller.poll(100):
                while True:
                    try:
                        msg = codec.to_tokenizer.decode(sink.recv(zmq.NOBLOCK))
                    except zmq.Again:
                        break
                    if isinstance(msg, BatchStrOut):
                        n = sum(len(t) for t in msg.text_deltas)
                        rows_in += len(msg.rids)
                        chars += n
                        measured["chars"] += n
                        measured["rows"] += len(msg.rids)
            service()
        dt = t_end - t_start
        replica_cpu = sum(b - a for a, b in zip(cpu0[0], cpu1[0])) / dt
        return {"replicas": replicas, "chars_s": measured["chars"] / dt, "tokens_s": measured["rows"] / dt,
                "replica_cores": replica_cpu, "driver_cores": (cpu1[1] - cpu0[1]) / dt,
                "load": os.getloadavg()[0]}
    finally:
        if pin:
            os.sched_setaffinity(0, range(os.cpu_count()))
        router.shutdown()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        ctx.destroy(linger=0)
        subprocess.run(["rm", "-rf", run_dir])


# ----------------------------------------------------------------------------- (b) server
def _tiny_model(path: Path) -> Path:
    import json as _json

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models.llama import Model, ModelArgs

    from protocol.model_source import resolve_model
    from tests.conftest import TINY_CONFIG
    from tokenizer_proc.hf_tokenizer import load_tokenizer

    mx.random.seed(0)
    model = Model(ModelArgs.from_dict(TINY_CONFIG))
    mx.save_safetensors(str(path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (path / "config.json").write_text(_json.dumps(TINY_CONFIG))
    load_tokenizer(resolve_model(None)).save_pretrained(str(path))
    return path


async def _http_load(url: str, concurrency: int, tokens: int, seconds: float) -> tuple[int, float]:
    import httpx

    chars = 0
    stop_at = time.monotonic() + seconds

    async def one(c, i: int) -> None:
        nonlocal chars
        while time.monotonic() < stop_at:
            body = {"prompt": f"Story {i}: 日本語 🍣", "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
                    "stream": True, "stop": ["<<END-OF-TEXT>>", "\n\n\n\n"]}
            async with c.stream("POST", f"{url}/v1/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        chars += len(json.loads(line[6:])["choices"][0]["text"])

    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=concurrency + 4)) as c:
        t0 = time.monotonic()
        await asyncio.gather(*(one(c, i) for i in range(concurrency)))
        return chars, time.monotonic() - t0


def server(replicas: int, seconds: float, concurrency: int, tokens: int, model: Path) -> dict:
    """Run load (b) against a fresh server with `replicas` replicas."""
    from tests.launcher import Server

    with tempfile.TemporaryDirectory() as logs:
        srv = Server(["--model", str(model), "--detokenizers", str(replicas), "--log-level", "warning"],
                     Path(logs) / "server.log")
        try:
            asyncio.run(_http_load(srv.base_url, concurrency, tokens, 2.0))  # warm-up
            chars, dt = asyncio.run(_http_load(srv.base_url, concurrency, tokens, seconds))
        finally:
            srv.stop()
    return {"replicas": replicas, "chars_s": chars / dt}


def table(title: str, rows: list[dict], pipeline_cols: bool) -> str:
    """Markdown table; pipeline_cols adds tokens/s and the cores the replicas and this
    process (scheduler + sink) kept busy."""
    base = rows[0]["chars_s"]
    extra = " tokens/s | replica cores busy | driver cores busy |" if pipeline_cols else ""
    lines = [f"**{title}**", "", "| replicas | streamed chars/s | vs 1 replica |" + extra,
             "|---|---|---|" + ("---|---|---|" if pipeline_cols else "")]
    for r in rows:
        cols = (f" {r['tokens_s']:,.0f} | {r['replica_cores']:.2f} | {r['driver_cores']:.2f} |"
                if pipeline_cols else "")
        lines.append(f"| {r['replicas']} | {r['chars_s']:,.0f} | {r['chars_s'] / base:.2f}x |{cols}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds per point (after 2 s warm-up)")
    p.add_argument("--requests", type=int, default=128, help="pipeline: concurrent requests")
    p.add_argument("--tokens", type=int, default=256, help="tokens per request")
    p.add_argument("--window", type=int, default=8, help="pipeline: steps in flight")
    p.add_argument("--pin", action="store_true", help="pipeline: pin each replica to its own core (taskset)")
    p.add_argument("--server", action="store_true", help="also run load (b) through launch.py and HTTP")
    p.add_argument("--concurrency", type=int, default=64, help="server: concurrent streams")
    ns = p.parse_args()
    print(f"# detokenizer scaling on {os.cpu_count()} CPU cores ({sys.platform})", flush=True)
    rows = []
    for n in ns.replicas:
        rows.append(pipeline(n, ns.seconds, ns.requests, ns.tokens, ns.window, ns.pin))
        r = rows[-1]
        print(f"pipeline, {n} replicas: {r['chars_s']:,.0f} chars/s; replicas used {r['replica_cores']:.2f} cores, "
              f"this process {r['driver_cores']:.2f}; load average {r['load']:.1f}", flush=True)
    print()
    pinned = ", replicas pinned to cores" if ns.pin else ""
    print(table(f"(a) pipeline: {ns.requests} requests, fake scheduler and sink, {os.cpu_count()} cores{pinned}",
                rows, True))
    if ns.server:
        with tempfile.TemporaryDirectory() as d:
            model = _tiny_model(Path(d))
            srows = []
            for n in ns.replicas:
                srows.append(server(n, ns.seconds, ns.concurrency, ns.tokens, model))
                print(f"server, {n} replicas: {srows[-1]['chars_s']:,.0f} chars/s", flush=True)
        print()
        print(table(f"(b) server: tiny random model, {ns.concurrency} streams over HTTP, {os.cpu_count()} cores",
                    srows, False))


if __name__ == "__main__":
    main()
