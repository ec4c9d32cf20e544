"""Single-request decode speed: lazyserve (HTTP, all processes) against a plain mlx-lm loop.

Both run the same model loaded the same way (`worker_proc.model.loader.load`) with the same
BLAS preloaded and the same BLAS thread settings (``--blas-threads``, passed to launch.py),
alternating, in one run. Decode speed = (tokens - 1) / (time of the last
token - time of the first token), so prefill is excluded from both.

    python bench/decode_speed.py [--model PATH] [--tokens 256] [--rounds 3] [--blas-threads N]
        [--server-flag=--enable-mamba-extra-buffer ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.prompts import chat_ids  # noqa: E402

PROMPT = "Write a long story about a dragon who learns to bake bread."


def reference_loop(model_arg: str | None, tokens: int) -> float:
    """Plain mlx-lm greedy loop; returns decode tokens/s."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from protocol.model_source import resolve_model
    from text.hf_tokenizer import load_tokenizer
    from worker_proc.model.loader import load

    source = resolve_model(model_arg)
    tok = load_tokenizer(source)
    model = load(source).model
    ids = chat_ids(tok, PROMPT)
    cache = make_prompt_cache(model)
    y = mx.argmax(model(mx.array(ids)[None], cache=cache)[:, -1], axis=-1)
    mx.eval(y)
    t0 = time.perf_counter()
    for _ in range(tokens - 1):
        y = mx.argmax(model(y[None], cache=cache)[:, -1], axis=-1)
        mx.async_eval(y)
        y.item()
    return (tokens - 1) / (time.perf_counter() - t0)


def server_decode(url: str, tokens: int) -> float:
    """One streamed request with ignore_eos; returns decode tokens/s seen by the client."""
    import asyncio

    from bench.client import async_client, request_body, timed_stream

    async def run() -> tuple[int, float, float]:
        async with async_client(600) as client:
            return await timed_stream(client, url, request_body(PROMPT, tokens))

    n, first, last = asyncio.run(run())
    return (n - 1) / (last - first)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--blas-threads", type=int, default=0, help="passed to launch.py (-1: the BLAS defaults)")
    p.add_argument("--server-flag", action="append", default=[], help="an extra launch.py flag (repeatable)")
    p.add_argument("--reference-only", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.reference_only:
        print(json.dumps({"tok_s": reference_loop(a.model, a.tokens)}))
        return

    from bench.blas_env import mlx_process_env
    from tests.support.launcher import Server

    env = mlx_process_env(a.blas_threads)
    blas = env.get("LD_PRELOAD") if env.get("LD_PRELOAD") != os.environ.get("LD_PRELOAD") else None
    threads = {k: v for k, v in env.items() if k != "LD_PRELOAD" and os.environ.get(k) != v}
    model_args = ["--model", a.model] if a.model else []
    server = Server(
        [*model_args, "--blas-threads", str(a.blas_threads), *a.server_flag], Path("/tmp/lazyserve-bench.log")
    )
    ours, ref = [], []
    try:
        server_decode(server.base_url, 16)  # warm-up
        for _ in range(a.rounds):
            ours.append(server_decode(server.base_url, a.tokens))
            out = subprocess.run(
                [sys.executable, __file__, "--reference-only", "--tokens", str(a.tokens), *model_args],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            ref.append(json.loads(out.stdout.strip().splitlines()[-1])["tok_s"])
    finally:
        server.stop()
    o, r = statistics.median(ours), statistics.median(ref)
    print(
        f"model: {a.model or 'SmolLM2-135M-Instruct (default)'}; BLAS preload: {blas}; BLAS thread env: {threads}; "
        f"{a.tokens} tokens, {a.rounds} rounds; server flags: {a.server_flag}"
    )
    print("| runner | decode tok/s (median) | rounds |")
    print("|---|---|---|")
    print(f"| lazyserve, 1 request over HTTP | {o:.1f} | {', '.join(f'{x:.1f}' for x in ours)} |")
    print(f"| plain mlx-lm loop | {r:.1f} | {', '.join(f'{x:.1f}' for x in ref)} |")
    print(f"ratio lazyserve / mlx-lm loop: {o / r:.2f}")


if __name__ == "__main__":
    main()
