"""Tensor parallel on this machine: decode tok/s and TTFT for ``--tp 1`` against ``--tp N``,
greedy output equality, and the per-step all-reduce time of the ring backend.

The model is the default model's shape (30 layers, hidden 576) with 8 query / 2 KV heads so
that it divides by 2 (the real one has 9 / 3), random weights (``--load-format dummy``; every
rank draws the same ones), unless ``--model`` names another. Each ``--tp`` runs its own
server in turn, the same requests: TTFT = median time to the first token of `--ttft-rounds`
requests of a 128-token prompt (fresh each time: no prefix cache hit); decode tok/s = (tokens
- 1) / (last - first token) of one streamed greedy request of ``--tokens`` tokens, median of
``--rounds``. Equality: the greedy token ids of 3 prompts (8 tokens) against ``--tp 1``'s.
All-reduce: 2 ranks on loopback each time ``all_sum`` of a float32 [1, hidden] array (one
decode row), as the sharded model does twice per layer per step.

    python bench/tensor_parallel.py [--tp 2] [--tokens 128] [--rounds 3] [--model PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ALLSUM_CALLS = 400


def write_model(out: Path) -> Path:
    """The default model's config and tokenizer in `out`, with 8 query / 2 KV heads."""
    from bench.make_shape_dir import write_model_dir

    write_model_dir(out)
    config = json.loads((out / "config.json").read_text())
    config.update(num_attention_heads=8, num_key_value_heads=2, head_dim=config["hidden_size"] // 8)
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def allsum_rank(hidden: int) -> None:
    """One rank of the all-reduce probe: prints the mean seconds of one all_sum (rank 0)."""
    import mlx.core as mx

    group = mx.distributed.init(strict=True, backend="ring")
    x = mx.ones((1, hidden))
    for _ in range(20):
        mx.eval(mx.distributed.all_sum(x, group=group))
    t0 = time.perf_counter()
    for _ in range(ALLSUM_CALLS):
        mx.eval(mx.distributed.all_sum(x, group=group))
    if group.rank() == 0:
        print(json.dumps({"allsum_s": (time.perf_counter() - t0) / ALLSUM_CALLS}))


def allsum_seconds(ranks: int, hidden: int) -> float:
    """Mean seconds of one [1, hidden] all_sum over `ranks` ring ranks on loopback."""
    from worker_proc.tp.setup import rank_env, write_hostfile

    with tempfile.TemporaryDirectory() as d:
        hostfile = write_hostfile(Path(d) / "hosts.json", ranks)
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--allsum-rank", str(hidden)],
                text=True,
                stdout=subprocess.PIPE,
                env={**os.environ, **rank_env(r, hostfile)},
            )
            for r in range(ranks)
        ]
        outs = [p.communicate(timeout=120)[0] for p in procs]
    return json.loads(outs[0].strip().splitlines()[-1])["allsum_s"]


def prompt_ids(n: int, salt: int) -> list[int]:
    return [100 + (i * 7919 + salt * 104729) % 40000 for i in range(n)]


async def measure(url: str, tokens: int, rounds: int, ttft_rounds: int) -> dict:
    """TTFTs, decode tok/s per round, and greedy ids of 3 prompts, from the server at `url`."""
    import httpx

    from bench.client import COMPLETIONS, async_client, greedy_ids, record_stream, request_body

    async with async_client(600) as c:

        async def completion(ids: list[int], n: int):
            return await record_stream(c, url, request_body(ids, n, "completions"), COMPLETIONS)

        await completion(prompt_ids(64, 99), 16)  # warm-up
        ttft = []
        for k in range(ttft_rounds):
            rec = await completion(prompt_ids(128, 10 + k), 1)
            ttft.append(rec.chunk_times[0] - rec.start)
        decode = []
        for k in range(rounds):
            rec = await completion(prompt_ids(16, 50 + k), tokens)
            decode.append((len(rec.chunk_times) - 1) / (rec.chunk_times[-1] - rec.chunk_times[0]))
    with httpx.Client(timeout=600) as s:
        ids = [greedy_ids(s, url, prompt_ids(8 + 13 * k, 70 + k), 8) for k in range(3)]
    return {"ttft": ttft, "decode": decode, "ids": ids}


def run_server(model: str, load_format: str, tp: int, a: argparse.Namespace) -> dict:
    from tests.support.launcher import Server

    server = Server(
        ["--model", model, "--load-format", load_format, "--tp", str(tp), "--max-running-requests", "4"],
        Path(f"/tmp/lazyserve-bench-tp{tp}.log"),
    )
    try:
        return asyncio.run(measure(server.base_url, a.tokens, a.rounds, a.ttft_rounds))
    finally:
        server.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a model directory or GGUF (default: the 8/2-head shape above)")
    p.add_argument("--tp", type=int, default=2, help="the ranks compared with --tp 1 (default: 2)")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ttft-rounds", type=int, default=5)
    p.add_argument("--allsum-rank", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.allsum_rank is not None:
        allsum_rank(a.allsum_rank)
        return
    from bench.make_shape_dir import _shape_config
    from protocol.model_source import resolve_model

    with tempfile.TemporaryDirectory() as d:
        model, load_format = (a.model, "auto") if a.model else (str(write_model(Path(d) / "model")), "dummy")
        config = _shape_config(resolve_model(model))
        results = {tp: run_server(model, load_format, tp, a) for tp in (1, a.tp)}
    layers, hidden = config["num_hidden_layers"], config["hidden_size"]
    allsum = allsum_seconds(a.tp, hidden)
    print(
        f"model: {model if a.model else 'default-model shape, 8/2 heads, random weights'} "
        f"({config['num_attention_heads']} / {config['num_key_value_heads']} heads); {os.cpu_count()} cores; {a.tokens} decode tokens x {a.rounds} rounds; "
        f"TTFT: 128-token prompt x {a.ttft_rounds}"
    )
    print("| --tp | decode tok/s (median) | rounds | TTFT ms (median) | greedy ids == --tp 1 |")
    print("|---|---|---|---|---|")
    for tp, r in results.items():
        same = "reference" if tp == 1 else str(r["ids"] == results[1]["ids"])
        print(
            f"| {tp} | {statistics.median(r['decode']):.1f} | {', '.join(f'{x:.1f}' for x in r['decode'])} | "
            f"{statistics.median(r['ttft']) * 1e3:.0f} | {same} |"
        )
    print(
        f"all_sum of [1, {hidden}] float32 over {a.tp} ring ranks: {allsum * 1e6:.0f} us; x {2 * layers} per decode "
        f"step ({layers} layers x 2) = {2 * layers * allsum * 1e3:.1f} ms per step"
    )


if __name__ == "__main__":
    main()
