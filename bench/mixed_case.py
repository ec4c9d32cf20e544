"""Case C1 of ``shared/acceptance/serving-cases.md`` timed against mlx_lm.server: one greedy
prompt ("Explain why the sky is blue in three sentences.", 96 tokens) sent at once with 16
other greedy prompts of 5 to 1,500 tokens (evenly spaced lengths, random common words), to
lazyserve and then to mlx_lm.server on the same weights (`bench.compare`'s model directory,
the servers started as `bench.client` starts them for it; mlx_lm.server with
``--decode-concurrency`` and ``--prompt-concurrency`` at the number of requests, its best
for this workload), never both at once:

    python -m bench.mixed_case [--model PATH] [--load-format dummy] [--others 16]
        [--max-len 1500] [--max-tokens 96] [--lazyserve-args '...'] [--json OUT]

For each server: how many of the 17 requests answered (HTTP 200, a finish reason; a
request whose connection failed counts as unanswered, with no latency), the wall time from
sending them to the last answer, each one's latency, and whether the greedy
prompt's text equals the same server's answer to it alone (sent first, which also warms the
server up). ``ratio`` is mlx_lm.server's total time / lazyserve's (higher is better for
lazyserve). mlx_lm.server ignores ``ignore_eos``, so neither server gets it: compare the
completion tokens each reports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.client import CHAT, async_client, on_server, request_body, start_lazyserve, start_mlx_lm  # noqa: E402
from bench.compare import ensure_model_dir  # noqa: E402
from bench.outcome import Outcome, send  # noqa: E402
from bench.prompts import load_tokenizer_for, synthetic_prompts  # noqa: E402

GREEDY_PROMPT = "Explain why the sky is blue in three sentences."


def other_prompts(n: int, max_len: int, tokenizer) -> list[str]:
    """`n` prompts of evenly spaced lengths from 5 to `max_len` tokens (by `tokenizer`)."""
    lengths = [5 + round(i * (max_len - 5) / max(1, n - 1)) for i in range(n)]
    return [synthetic_prompts(1, length, tokenizer=tokenizer, seed=i)[0] for i, length in enumerate(lengths)]


def body(prompt: str, max_tokens: int) -> dict:
    """A greedy, non-streamed chat request for `prompt` (no ``ignore_eos``: mlx_lm.server ignores it)."""
    return request_body(prompt, max_tokens, ignore_eos=False, stream=False)


def failed(e: BaseException) -> Outcome:
    """The outcome of a request whose connection failed with `e` (status 0: not answered)."""
    return Outcome(error=f"{type(e).__name__}: {e}"[:300])


async def run_case(url: str, others: list[str], max_tokens: int) -> dict:
    """The greedy prompt alone, then with `others` at once; returns the figures (module doc)."""
    import httpx

    async with async_client(None, connect=60) as c:
        try:
            alone = await send(c, url, CHAT, body(GREEDY_PROMPT, max_tokens))
        except httpx.HTTPError as e:
            alone = failed(e)

        async def timed(prompt: str) -> tuple[float, object]:
            out = await send(c, url, CHAT, body(prompt, max_tokens))
            return time.perf_counter(), out

        t0 = time.perf_counter()
        answers = await asyncio.gather(*(timed(p) for p in [GREEDY_PROMPT, *others]), return_exceptions=True)
        t_end = time.perf_counter()
    outcomes = [failed(a) if isinstance(a, BaseException) else a[1] for a in answers]
    latencies = [None if isinstance(a, BaseException) else a[0] - t0 for a in answers]
    return {
        "answered": sum(o.complete(1, False) for o in outcomes),
        "requests": len(outcomes),
        "total_s": max((s for s in latencies if s is not None), default=t_end - t0),
        "latency_s": latencies,
        "completion_tokens": [(o.usage or {}).get("completion_tokens") for o in outcomes],
        "errors": sorted({o.error for o in outcomes if o.error})[:5],
        "greedy_equals_alone": alone.complete(1, False) and outcomes[0].text.get(0) == alone.text.get(0),
        "greedy_text": outcomes[0].text.get(0, ""),
    }


def measure(start, others: list[str], max_tokens: int) -> dict:
    """Start a server with `start()`, run the case, stop it; the case's figures and the
    server's command line, or {"error": ...} when it did not start."""

    def work(server) -> dict:
        out = asyncio.run(run_case(server.base_url, others, max_tokens))
        return {**out, "command": " ".join(map(str, server.proc.args))}

    return on_server(start, work)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="GGUF file or model directory (default: the default model)")
    p.add_argument("--load-format", choices=["auto", "dummy"], default="auto")
    p.add_argument("--model-dir", default=None, help="the shared model directory (default: bench.compare's)")
    p.add_argument("--others", type=int, default=16, help="prompts sent with the greedy one")
    p.add_argument("--max-len", type=int, default=1500, help="tokens of the longest other prompt")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--lazyserve-args", default="", help="extra launch.py flags")
    p.add_argument("--blas-threads", type=int, default=0, help="as launch.py's, for both servers")
    p.add_argument("--startup-timeout", type=float, default=600)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    model_dir = ensure_model_dir(a.model_dir, a.model, a.load_format)
    others = other_prompts(a.others, a.max_len, load_tokenizer_for(str(model_dir)))
    logs = Path(tempfile.mkdtemp(prefix="lazyserve-mixed-logs-"))
    # mlx_lm.server at its best for 17 requests at once: its defaults (32 / 8) queue prompts past 8
    best = [f"--decode-concurrency={a.others + 1}", f"--prompt-concurrency={a.others + 1}"]
    result = {
        "command": " ".join(sys.argv),
        "model_dir": str(model_dir),
        "servers": {
            "lazyserve": measure(
                lambda: start_lazyserve(
                    model_dir, logs / "lazyserve.log", a.blas_threads, a.lazyserve_args, a.startup_timeout
                ),
                others,
                a.max_tokens,
            ),
            "mlx_lm.server": measure(
                lambda: start_mlx_lm(model_dir, logs / "mlx_lm.log", True, a.blas_threads, a.startup_timeout, best),
                others,
                a.max_tokens,
            ),
        },
    }
    ours, theirs = result["servers"]["lazyserve"], result["servers"]["mlx_lm.server"]
    result["ratio"] = theirs["total_s"] / ours["total_s"] if "total_s" in ours and "total_s" in theirs else None
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))
    for name, r in result["servers"].items():
        if "error" in r:
            print(f"{name}: did not start: {r['error'][-300:]}")
            continue
        print(
            f"{name:14s} answered {r['answered']}/{r['requests']} in {r['total_s']:.1f} s, greedy equals alone: "
            f"{r['greedy_equals_alone']}, completion tokens {sum(filter(None, r['completion_tokens']))}"
        )
    print(f"mlx_lm.server time / lazyserve time: {result['ratio']}")


if __name__ == "__main__":
    main()
