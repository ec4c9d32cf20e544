"""lazyserve against mlx_lm.server and the raw mlx-lm batched decode loop, on the same
weights, the same prompts and the same sampling (greedy), one after the other (never two
at once):

    python -m bench.compare --concurrency 1,16,64 --num-prompts N --input-len L --output-len O
        [--shared-prefix-len P] [--load-format dummy] [--model PATH] [--model-dir DIR]
        [--stock-mlx-lm] [--blas-threads N] [--lazyserve-args '...'] --json OUT [--plot OUT.png]

1. Writes a model directory both servers load (`bench.make_shape_dir.write_model_dir`): the
   weights as lazyserve loads `--model` (default: the default model, a GGUF mlx-lm cannot
   read), or with ``--load-format dummy`` random weights saved once, in lazyserve's compute
   dtype. Reused when `--model-dir` already holds the same source.
2. Starts ``launch.py --model DIR``, then mlx_lm.server with a listen backlog of 1024
   (`bench.mlx_lm_server_backlog`; with ``--stock-mlx-lm`` also the stock server, whose
   connection resets at high concurrency are recorded as failures), each with its defaults
   (mlx_lm.server: --decode-concurrency 32, --prompt-concurrency 8, --prefill-step-size 2048,
   --prompt-cache-size 10) and the BLAS setup of lazyserve's worker (`bench.blas_env`); after a
   warm-up, runs `bench.serving` at each concurrency.
3. Times `bench.raw_decode` at batch = each concurrency, on prompts of the chat prompts'
   length (by the model's tokenizer and chat template), for output-len - 1 steps, in a
   subprocess while lazyserve's server stands idle, right before and right after each of
   lazyserve's runs at that concurrency (``--rounds`` runs each, so raw, ours, raw, ours, raw
   at each concurrency). These machines drift (the raw loop moved by 35-53% within minutes on
   lent H200s), so each of our runs is divided by the mean of the two raw runs beside it and
   a ratio is the median over the rounds; the JSON keeps every raw run (``raw_decode_runs``
   {c: [tok/s, ...]}) and every round (``servers.lazyserve.rounds``).

The order is: at each concurrency the raw loop and lazyserve alternated, then mlx_lm.server.
Throughput and TTFT against mlx_lm.server use lazyserve's first round at each concurrency
(``servers.lazyserve.runs``), which meets the same conditions as mlx_lm.server's one run.

The JSON keeps every run and a ``ratios`` object, each "higher is better for lazyserve":
``batch1_decode_vs_raw`` (per-stream decode rate at concurrency 1 / raw batch-1 rate),
``decode_vs_raw`` {c: aggregate decode tok/s / raw at batch c}, ``steady_decode_vs_raw`` {c:
decode tok/s while all c streams decode (`bench.serving_metrics.steady_decode_rate`: no
prefill or ramp, like the raw rate) / raw at batch c}, each the median over the rounds of the
paired ratios above, ``throughput`` {c: output
tok/s / mlx_lm.server's}, ``ttft_p50`` {c: mlx_lm.server's TTFT p50 / ours}.
mlx_lm.server ignores ``ignore_eos``, so its requests can stop early at EOS: compare
``mean_output_tokens`` (throughputs count the tokens each server reports).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.blas_env import mlx_process_env  # noqa: E402
from bench.client import on_server, request_body, start_lazyserve, start_mlx_lm  # noqa: E402
from bench.make_shape_dir import SOURCE_FILE  # noqa: E402
from bench.prompts import chat_ids, load_tokenizer_for, synthetic_prompts  # noqa: E402
from bench.serving import run  # noqa: E402

LAZYSERVE, MLX_LM, MLX_LM_STOCK = "lazyserve", "mlx_lm.server", "mlx_lm.server (stock backlog)"


def ensure_model_dir(model_dir: str | None, model: str | None, load_format: str) -> Path:
    """`model_dir` (default: ``lazyserve-compare-<model's name>[-random]`` in the temp dir),
    holding `model`'s weights (real, or random for load_format "dummy") as written by
    ``bench/make_shape_dir.py``, in a subprocess; kept when it already holds the same source.
    Raises `subprocess.CalledProcessError` when writing fails."""
    weights = "random" if load_format == "dummy" else "real"
    tag = (Path(model).resolve().name if model else "default") + ("-random" if weights == "random" else "")
    out = Path(model_dir or Path(tempfile.gettempdir()) / f"lazyserve-compare-{tag}")
    name = str(Path(model).resolve()) if model else "default"
    marker = out / SOURCE_FILE
    if marker.exists() and (out / "model.safetensors").exists():
        old = json.loads(marker.read_text())
        if old.get("model") == name and old.get("weights") == weights and old.get("shape") is None:
            return out
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "make_shape_dir.py"),
            str(out),
            "--weights",
            weights,
            *(["--model", name] if model else []),
        ],
        check=True,
        cwd=str(ROOT),
    )
    return out


def measure(
    start: Callable,
    bodies: list[dict],
    concurrencies: list[int],
    num_prompts: int,
    rounds: int = 1,
    between: Callable[[int], None] | None = None,
) -> dict:
    """`bench.client.on_server`: start a server with `start()`, warm it up (2 short requests),
    run the first max(num_prompts, c) of `bodies` `rounds` times at each concurrency c, stop
    it. `between(c)` is called before the first and after every run at c (the server idle
    meanwhile). Returns {"runs": {c: first round's figures}, "rounds": {c: [figures per
    round]}, "log": path} or {"error": ...} when it did not start."""

    def work(server) -> dict:
        warm = [dict(b, max_tokens=4) for b in bodies[:2]]
        run(server.base_url, warm, 2, progress=False)
        every: dict[int, list[dict]] = {}
        for c in concurrencies:
            for i in range(rounds + 1):
                if between is not None:
                    between(c)
                if i < rounds:
                    every.setdefault(c, []).append(run(server.base_url, bodies[: max(num_prompts, c)], c))
        return {"runs": {c: r[0] for c, r in every.items()}, "rounds": every, "log": str(server.log_path)}

    return on_server(start, work)


def raw_rates(model_dir: Path, batches: list[int], input_len: int, steps: int, blas_threads: int) -> dict[int, float]:
    """`bench.raw_decode`'s {batch: decode tok/s}, run in a subprocess with the worker's BLAS setup."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.raw_decode",
            "--model",
            str(model_dir),
            "--batch",
            ",".join(map(str, batches)),
            "--input-len",
            str(input_len),
            "--steps",
            str(steps),
        ],
        env=mlx_process_env(blas_threads),
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        check=True,
    )
    return {int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def chat_prompt_len(tokenizer, prompts: list[str]) -> int:
    """Mean length in tokens (rounded) of `prompts` sent as one user message each, with
    `tokenizer`'s chat template and generation prompt: the KV length lazyserve decodes on
    (it prefills less when its prefix cache hits). Raises `ValueError` when the tokenizer has
    no chat template (the chat requests of the comparison would fail too)."""
    return round(sum(len(chat_ids(tokenizer, p)) for p in prompts) / len(prompts))


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def paired_ratio(values: list[float | None], raw: list[float | None]) -> float | None:
    """Median over i of values[i] / mean(raw[i], raw[i + 1]): each run against the raw runs
    timed right before and after it (len(raw) == len(values) + 1; a failed raw run is None and
    leaves only its other neighbour). None when no pair has both sides."""
    out = []
    for i, v in enumerate(values):
        beside = [r for r in raw[i : i + 2] if r]
        q = _div(v, sum(beside) / len(beside) if beside else None)
        if q is not None:
            out.append(q)
    return statistics.median(out) if out else None


def ratios(ours: dict, rounds: dict, theirs: dict, raw_runs: dict[int, list[float | None]]) -> dict:
    """The ``ratios`` object (module doc) from lazyserve's first runs {c: figures}, all its
    rounds {c: [figures]}, mlx_lm.server's runs {c: figures} and the raw runs {c: [tok/s or
    None]} timed beside lazyserve's rounds."""
    ttft = lambda r: (r["ttft_ms"] or {}).get("p50")  # noqa: E731
    per_stream = lambda r: (r["per_stream_decode_tok_s"] or {}).get("median")  # noqa: E731
    return {
        "batch1_decode_vs_raw": paired_ratio([per_stream(r) for r in rounds[1]], raw_runs.get(1, []))
        if 1 in rounds
        else None,
        "decode_vs_raw": {
            c: paired_ratio([r["decode_throughput"] for r in rs], raw_runs.get(c, [])) for c, rs in rounds.items()
        },
        "steady_decode_vs_raw": {
            c: paired_ratio([r.get("steady_decode_throughput") for r in rs], raw_runs.get(c, []))
            for c, rs in rounds.items()
        },
        "throughput": {
            c: _div(r["output_throughput"], theirs[c]["output_throughput"]) for c, r in ours.items() if c in theirs
        },
        "ttft_p50": {c: _div(ttft(theirs[c]), ttft(r)) for c, r in ours.items() if c in theirs},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", default="1,16,64", help="comma-separated concurrencies")
    p.add_argument(
        "--num-prompts",
        type=int,
        required=True,
        help="requests per concurrency level, at least the concurrency (one full wave)",
    )
    p.add_argument("--lazyserve-args", default="", help="extra launch.py flags, e.g. '--disable-decode-graph'")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--shared-prefix-len", type=int, default=0)
    p.add_argument(
        "--load-format",
        choices=["auto", "dummy"],
        default="auto",
        help="dummy: random weights, saved once so that every runner reads the same",
    )
    p.add_argument("--model", default=None, help="GGUF file or model directory (default: the default model)")
    p.add_argument(
        "--model-dir",
        default=None,
        help="where to write the shared model directory (default: one in the temp dir per source)",
    )
    p.add_argument("--stock-mlx-lm", action="store_true", help="also run mlx_lm.server with its stock backlog of 5")
    p.add_argument("--blas-threads", type=int, default=0, help="as launch.py's, for every runner")
    p.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="lazyserve's runs at each concurrency, each between two raw-loop runs (>= 1)",
    )
    p.add_argument("--startup-timeout", type=float, default=600)
    p.add_argument("--json", required=True)
    p.add_argument("--plot", default=None, help="PNG of throughput and TTFT p50 against concurrency")
    a = p.parse_args()
    if a.rounds < 1:
        p.error(f"--rounds must be >= 1, got {a.rounds}")
    concurrencies = [int(c) for c in a.concurrency.split(",")]

    model_dir = ensure_model_dir(a.model_dir, a.model, a.load_format)
    tokenizer = load_tokenizer_for(str(model_dir))
    prompts = synthetic_prompts(max(a.num_prompts, *concurrencies), a.input_len, a.shared_prefix_len, tokenizer)
    bodies = [request_body(pr, a.output_len) for pr in prompts]
    logs = Path(tempfile.mkdtemp(prefix="lazyserve-compare-logs-"))

    prompt_len = chat_prompt_len(tokenizer, prompts)
    raw_steps = max(1, a.output_len - 1)
    raw_runs: dict[int, list[float | None]] = {}
    raw_errors: list[str] = []

    def time_raw(c: int) -> None:
        """Append `raw_rates` at batch c to raw_runs[c] (None, its stderr's tail kept, when it fails)."""
        try:
            rate = raw_rates(model_dir, [c], prompt_len, raw_steps, a.blas_threads)[c]
        except subprocess.CalledProcessError as e:
            print(f"the raw mlx-lm loop failed: {(e.stderr or '')[-2000:]}", file=sys.stderr)
            raw_errors.append((e.stderr or "")[-2000:])
            rate = None
        raw_runs.setdefault(c, []).append(rate)

    servers = {
        LAZYSERVE: measure(
            lambda: start_lazyserve(
                model_dir, logs / "lazyserve.log", a.blas_threads, a.lazyserve_args, a.startup_timeout
            ),
            bodies,
            concurrencies,
            a.num_prompts,
            a.rounds,
            time_raw,
        )
    }
    raw = {c: statistics.mean(ok) for c, rs in raw_runs.items() if (ok := [r for r in rs if r])}
    servers[MLX_LM] = measure(
        lambda: start_mlx_lm(model_dir, logs / "mlx_lm.log", True, a.blas_threads, a.startup_timeout),
        bodies,
        concurrencies,
        a.num_prompts,
    )
    if a.stock_mlx_lm:
        servers[MLX_LM_STOCK] = measure(
            lambda: start_mlx_lm(model_dir, logs / "mlx_lm_stock.log", False, a.blas_threads, a.startup_timeout),
            bodies,
            concurrencies,
            a.num_prompts,
        )

    ours, theirs = servers[LAZYSERVE].get("runs", {}), servers[MLX_LM].get("runs", {})

    result = {
        "model": a.model or "default",
        "weights": "random" if a.load_format == "dummy" else "real",
        "model_dir": str(model_dir),
        "workload": {
            "num_prompts": {c: max(a.num_prompts, c) for c in concurrencies},
            "lazyserve_args": a.lazyserve_args,
            "input_len": a.input_len,
            "output_len": a.output_len,
            "shared_prefix_len": a.shared_prefix_len,
            "concurrency": concurrencies,
            "temperature": 0,
            "raw_prompt_len": prompt_len,
            "raw_steps": raw_steps,
            "rounds": a.rounds,
        },
        "command": " ".join(sys.argv),
        "servers": servers,
        "raw_decode_tok_s": raw,
        "raw_decode_runs": raw_runs,
        "raw_decode_errors": raw_errors,
        "ratios": ratios(ours, servers[LAZYSERVE].get("rounds", {}), theirs, raw_runs),
    }
    Path(a.json).write_text(json.dumps(result, indent=1))
    if a.plot:
        from bench.compare_plot import plot

        plot(result, a.plot)
    print(json.dumps(result["ratios"], indent=1))
    for name, s in servers.items():
        for c, r in s.get("runs", {}).items():
            print(
                f"{name:32s} c={c:<4d} ok={r['completed']:<4d} failed={r['failed']:<3d} "
                f"out tok/s={r['output_throughput']:.1f} ttft p50={(r['ttft_ms'] or {}).get('p50', 0):.0f} ms"
            )
        if "error" in s:
            print(f"{name}: did not start: {s['error'][-300:]}")
    print(f"raw decode tok/s, runs beside lazyserve's rounds: {raw_runs}")


if __name__ == "__main__":
    main()
