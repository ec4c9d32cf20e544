"""lazyserve against mlx_lm.server and the raw mlx-lm decode loops at equal settings, on the
same weights, the same prompts and the same sampling (greedy), one after the other (never two
at once):

    python -m bench.compare --concurrency 1,16,64 --num-prompts N --input-len L --output-len O
        [--shared-prefix-len P] [--load-format dummy] [--model PATH | --shape NAME] [--model-dir DIR]
        [--no-stock-mlx-lm] [--blas-threads N] [--lazyserve-args '...'] [--speculative NGRAM
        [--spec-prompts]] --json OUT [--plot OUT.png]

Equal settings mean (issue 40): every server at its best documented settings for the
workload, every server warmed the same way, the raw baselines timed the way users run them,
and every command line in the JSON:

1. Writes a model directory both servers load (`bench.make_shape_dir.write_model_dir`): the
   weights as lazyserve loads `--model` (default: the default model, a GGUF mlx-lm cannot
   read), or with ``--load-format dummy`` random weights saved once, in lazyserve's compute
   dtype; with ``--shape`` a public architecture's config (`bench.make_shape_dir.SHAPES`:
   Llama-3.1-8B, Qwen3-30B-A3B, ...) with random weights. Reused when `--model-dir` already
   holds the same source.
2. Starts ``launch.py --model DIR`` at its defaults; then mlx_lm.server at its best for the
   workload, ``--decode-concurrency`` and ``--prompt-concurrency`` both the largest
   concurrency (its defaults, 32 and 8, queue the streams past them: at 64 streams half
   wait for the others to finish), and then, as a second, labelled column, mlx_lm.server at
   its stock settings (unless ``--no-stock-mlx-lm``). Both mlx_lm.servers listen with a
   backlog of 1024 (`bench.mlx_lm_server_backlog`: the stock backlog of 5 resets connections
   at 64 clients), and every server has the BLAS setup of lazyserve's worker (`bench.blas_env`).
3. Warms every server the same way: before the timed runs at concurrency c, one untimed
   round of c requests (prompts of the same length, not the timed ones, so no prefix cache
   serves the timed run) at that concurrency, so that no server meets a batch shape for the
   first time inside a timed run. Then runs `bench.serving` at each concurrency.
4. Times `bench.raw_decode` at batch = each concurrency through mlx-lm's `BatchKVCache`, and
   at batch 1 also the plain cache through mlx-lm's ``generate_step`` (what
   ``mlx_lm.generate`` runs), on prompts of the chat prompts' length (by the model's tokenizer
   and chat template), for output-len - 1 steps, in a subprocess while lazyserve's server
   stands idle, right before and right after each of lazyserve's runs at that concurrency
   (``--rounds`` runs each, so raw, ours, raw, ours, raw at each concurrency). These machines
   drift (the raw loop moved by 35-53% within minutes on lent H200s), so each of our runs is
   divided by the mean of the two raw runs beside it and a ratio is the median over the
   rounds; the JSON keeps every raw run (``raw_decode_runs`` {c: [tok/s, ...]}, the plain
   loop's under "plain") and every round (``servers.lazyserve.rounds``).

The order is: at each concurrency the raw loops and lazyserve alternated, then the
mlx_lm.servers. Throughput and TTFT against mlx_lm.server use lazyserve's first round at each
concurrency (``servers.lazyserve.runs``), which meets the same conditions as each
mlx_lm.server's one run.

With ``--speculative ALGO`` (issue 42) lazyserve is also started with
``--speculative-algorithm ALGO`` (a column of its own, warmed and run like the others) and the
ratios gain ``speculative_throughput`` and ``speculative_ttft_p50`` {c: with / without
speculation}; ``--spec-prompts`` takes the prompts of `bench.spec_prompts` (output that
repeats its input, and free text; cycled) instead of the synthetic ones, on which prompt
lookup finds little to draft.

The JSON keeps every run, each server's command line (``servers.NAME.command``), the
versions (``versions``), the ``targets`` of issue 40 and a ``ratios`` object:
``batch1_decode_vs_raw`` (per-stream decode rate at concurrency 1 / the plain batch-1 loop's;
``batch1_decode_vs_raw_batch_cache`` the same against the batch cache's), ``decode_vs_raw``
{c: aggregate decode tok/s / raw at batch c}, ``steady_decode_vs_raw`` {c: decode tok/s while
all c streams decode (`bench.serving_metrics.steady_decode_rate`: no prefill or ramp, like
the raw rate) / raw at batch c}, each the median over the rounds of the paired ratios above,
``throughput`` {c: output tok/s / mlx_lm.server's at its best}, ``throughput_vs_stock`` {c:
the same against the stock settings}: all higher is better for lazyserve; ``ttft_p50`` {c:
our TTFT p50 / mlx_lm.server's at its best}: lower is better (the target is at most 0.7).
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
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.blas_env import mlx_process_env  # noqa: E402
from bench.client import on_server, request_body, start_lazyserve, start_mlx_lm  # noqa: E402
from bench.make_shape_dir import SHAPES, SOURCE_FILE  # noqa: E402
from bench.prompts import chat_ids, load_tokenizer_for, synthetic_prompts  # noqa: E402
from bench.serving import run  # noqa: E402

LAZYSERVE, MLX_LM, MLX_LM_STOCK = "lazyserve", "mlx_lm.server", "mlx_lm.server (stock settings)"
SPECULATIVE = "lazyserve (speculative {})"
TARGETS = {
    "throughput": {"16": 1.5, "64": 2.0},
    "ttft_p50": {"16": 0.7, "64": 0.7},
    "steady_decode_vs_raw": {"16": 1.0, "64": 1.0},
    "batch1_decode_vs_raw": 1.0,
}
"""Issue 40's targets for the ``ratios`` of the same names (ttft_p50: at most; the others: at least)."""


def ensure_model_dir(model_dir: str | None, model: str | None, load_format: str, shape: str | None = None) -> Path:
    """`model_dir` (default: ``lazyserve-compare-<model's name or shape>[-random]`` in the temp
    dir), holding `model`'s weights (real, or random for load_format "dummy"), or with `shape`
    that architecture with random weights and `model`'s tokenizer, as written by
    ``bench/make_shape_dir.py``, in a subprocess; kept when it already holds the same source.
    Raises `subprocess.CalledProcessError` when writing fails."""
    weights = "random" if load_format == "dummy" or shape else "real"
    tag = shape or (Path(model).resolve().name if model else "default")
    tag += "-random" if weights == "random" else ""
    out = Path(model_dir or Path(tempfile.gettempdir()) / f"lazyserve-compare-{tag}")
    name = str(Path(model).resolve()) if model else "default"
    marker = out / SOURCE_FILE
    if marker.exists() and any(out.glob("*.safetensors")):
        old = json.loads(marker.read_text())
        if old.get("model") == name and old.get("weights") == weights and old.get("shape") == shape:
            return out
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "make_shape_dir.py"),
            str(out),
            "--weights",
            weights,
            *(["--model", name] if model else []),
            *(["--shape", shape] if shape else []),
        ],
        check=True,
        cwd=str(ROOT),
    )
    return out


def measure(
    start: Callable,
    bodies: list[dict],
    warm_bodies: list[dict],
    concurrencies: list[int],
    num_prompts: int,
    rounds: int = 1,
    between: Callable[[int], None] | None = None,
) -> dict:
    """`bench.client.on_server`: start a server with `start()`; at each concurrency c, warm
    it with one untimed round of the first c of `warm_bodies` at c, then run the first
    max(num_prompts, c) of `bodies` `rounds` times at c; stop it. `between(c)` is called
    before the first and after every timed run at c (the server idle meanwhile). Returns
    {"runs": {c: first round's figures}, "rounds": {c: [figures per round]}, "warm_s": {c:
    seconds of the warm-up round}, "log": path, "command": its command line} or {"error": ...}
    when it did not start."""

    def work(server) -> dict:
        every: dict[int, list[dict]] = {}
        warm_s: dict[int, float] = {}
        for c in concurrencies:
            t0 = time.perf_counter()
            run(server.base_url, warm_bodies[:c], c, progress=False)
            warm_s[c] = round(time.perf_counter() - t0, 2)
            for i in range(rounds + 1):
                if between is not None:
                    between(c)
                if i < rounds:
                    every.setdefault(c, []).append(run(server.base_url, bodies[: max(num_prompts, c)], c))
        return {
            "runs": {c: r[0] for c, r in every.items()},
            "rounds": every,
            "warm_s": warm_s,
            "log": str(server.log_path),
            "command": " ".join(map(str, server.proc.args)),
        }

    return on_server(start, work)


def raw_rates(
    model_dir: Path, batches: list[int], input_len: int, steps: int, blas_threads: int, plain: bool = False
) -> dict:
    """`bench.raw_decode`'s {batch: decode tok/s} (with `plain`, also "plain": the plain
    batch-1 loop's), run in a subprocess with the worker's BLAS setup."""
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
            *(["--plain"] if plain else []),
        ],
        env=mlx_process_env(blas_threads),
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        check=True,
    )
    return {k if k == "plain" else int(k): v for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


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


def ratios(ours: dict, rounds: dict, theirs: dict, stock: dict, raw_runs: dict) -> dict:
    """The ``ratios`` object (module doc) from lazyserve's first runs {c: figures}, all its
    rounds {c: [figures]}, mlx_lm.server's runs at its best and at its stock settings {c:
    figures} and the raw runs {c or "plain": [tok/s or None]} timed beside lazyserve's rounds."""
    ttft = lambda r: (r["ttft_ms"] or {}).get("p50")  # noqa: E731
    per_stream = lambda r: (r["per_stream_decode_tok_s"] or {}).get("median")  # noqa: E731
    batch1 = [per_stream(r) for r in rounds.get(1, [])]
    return {
        "batch1_decode_vs_raw": paired_ratio(batch1, raw_runs.get("plain", [])) if 1 in rounds else None,
        "batch1_decode_vs_raw_batch_cache": paired_ratio(batch1, raw_runs.get(1, [])) if 1 in rounds else None,
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
        "throughput_vs_stock": {
            c: _div(r["output_throughput"], stock[c]["output_throughput"]) for c, r in ours.items() if c in stock
        },
        "ttft_p50": {c: _div(ttft(r), ttft(theirs[c])) for c, r in ours.items() if c in theirs},
    }


def versions() -> dict[str, str]:
    """The versions compared: lazyserve's commit (with "+dirty" for uncommitted changes),
    mlx-lm's and MLX's."""
    import importlib.metadata

    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=str(ROOT), capture_output=True, text=True)
        return out.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = "+dirty" if git("status", "--porcelain", "--untracked-files=no") else ""
    found = {"lazyserve": commit + dirty}
    for name in ("mlx-lm", "mlx"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "unknown"
    return found


def device_name() -> str:
    """The GPU's name (nvidia-smi) or, without one, the CPU's model and core count."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except OSError:
        pass
    import os
    import platform

    return f"CPU {platform.processor() or platform.machine()}, {os.cpu_count()} cores"


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
        "--shape",
        default=None,
        choices=sorted(SHAPES),
        help="a public architecture with random weights (its tokenizer: --model's, padded)",
    )
    p.add_argument(
        "--model-dir",
        default=None,
        help="where to write the shared model directory (default: one in the temp dir per source)",
    )
    p.add_argument(
        "--no-stock-mlx-lm",
        action="store_true",
        help="skip the second mlx_lm.server column (its stock --decode-concurrency 32 --prompt-concurrency 8)",
    )
    p.add_argument("--blas-threads", type=int, default=0, help="as launch.py's, for every runner")
    p.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="lazyserve's runs at each concurrency, each between two raw-loop runs (>= 1)",
    )
    p.add_argument("--startup-timeout", type=float, default=600)
    p.add_argument("--speculative", default=None, choices=["NGRAM"], help="also run lazyserve with this algorithm")
    p.add_argument("--spec-prompts", action="store_true", help="the prompts of bench.spec_prompts, cycled")
    p.add_argument("--json", required=True)
    p.add_argument("--plot", default=None, help="PNG of throughput and TTFT p50 against concurrency")
    a = p.parse_args()
    if a.rounds < 1:
        p.error(f"--rounds must be >= 1, got {a.rounds}")
    concurrencies = [int(c) for c in a.concurrency.split(",")]

    model_dir = ensure_model_dir(a.model_dir, a.model, a.load_format, a.shape)
    tokenizer = load_tokenizer_for(str(model_dir))
    count = max(a.num_prompts, *concurrencies)
    if a.spec_prompts:
        from bench.spec_prompts import WORKLOADS

        pool = [pr for prs in WORKLOADS.values() for pr in prs]
        prompts = [pool[i % len(pool)] for i in range(count)]
        warm = [f"Answer briefly. {pool[i % len(pool)]}" for i in range(max(concurrencies))]
    else:
        prompts = synthetic_prompts(count, a.input_len, a.shared_prefix_len, tokenizer)
        warm = synthetic_prompts(max(concurrencies), a.input_len, a.shared_prefix_len, tokenizer, seed=1)
    bodies = [request_body(pr, a.output_len) for pr in prompts]
    warm_bodies = [request_body(pr, a.output_len) for pr in warm]
    logs = Path(tempfile.mkdtemp(prefix="lazyserve-compare-logs-"))

    prompt_len = chat_prompt_len(tokenizer, prompts)
    raw_steps = max(1, a.output_len - 1)
    raw_runs: dict = {}
    raw_errors: list[str] = []

    def time_raw(c: int) -> None:
        """Append `raw_rates` at batch c to raw_runs[c], and at batch 1 the plain loop's to
        raw_runs["plain"] (None, its stderr's tail kept, when it fails)."""
        try:
            rates = raw_rates(model_dir, [c], prompt_len, raw_steps, a.blas_threads, plain=c == 1)
        except subprocess.CalledProcessError as e:
            print(f"the raw mlx-lm loop failed: {(e.stderr or '')[-2000:]}", file=sys.stderr)
            raw_errors.append((e.stderr or "")[-2000:])
            rates = {c: None, "plain": None}
        raw_runs.setdefault(c, []).append(rates[c])
        if c == 1:
            raw_runs.setdefault("plain", []).append(rates["plain"])

    servers = {
        LAZYSERVE: measure(
            lambda: start_lazyserve(
                model_dir, logs / "lazyserve.log", a.blas_threads, a.lazyserve_args, a.startup_timeout
            ),
            bodies,
            warm_bodies,
            concurrencies,
            a.num_prompts,
            a.rounds,
            time_raw,
        )
    }
    if a.speculative:
        flags = f"{a.lazyserve_args} --speculative-algorithm {a.speculative}"
        servers[SPECULATIVE.format(a.speculative)] = measure(
            lambda: start_lazyserve(model_dir, logs / "lazyserve_spec.log", a.blas_threads, flags, a.startup_timeout),
            bodies,
            warm_bodies,
            concurrencies,
            a.num_prompts,
        )
    raw = {c: statistics.mean(ok) for c, rs in raw_runs.items() if (ok := [r for r in rs if r])}
    best = [f"--decode-concurrency={max(concurrencies)}", f"--prompt-concurrency={max(concurrencies)}"]
    servers[MLX_LM] = measure(
        lambda: start_mlx_lm(model_dir, logs / "mlx_lm.log", True, a.blas_threads, a.startup_timeout, best),
        bodies,
        warm_bodies,
        concurrencies,
        a.num_prompts,
    )
    if not a.no_stock_mlx_lm:
        servers[MLX_LM_STOCK] = measure(
            lambda: start_mlx_lm(model_dir, logs / "mlx_lm_stock.log", True, a.blas_threads, a.startup_timeout),
            bodies,
            warm_bodies,
            concurrencies,
            a.num_prompts,
        )

    ours, theirs = servers[LAZYSERVE].get("runs", {}), servers[MLX_LM].get("runs", {})
    stock = servers.get(MLX_LM_STOCK, {}).get("runs", {})

    result = {
        "model": a.shape or a.model or "default",
        "weights": "random" if a.load_format == "dummy" or a.shape else "real",
        "device": device_name(),
        "versions": versions(),
        "targets": TARGETS,
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
        "ratios": ratios(ours, servers[LAZYSERVE].get("rounds", {}), theirs, stock, raw_runs),
    }
    if a.speculative:
        spec = servers[SPECULATIVE.format(a.speculative)].get("runs", {})
        ttft = lambda r: (r["ttft_ms"] or {}).get("p50")  # noqa: E731
        result["ratios"]["speculative_throughput"] = {
            c: _div(r["output_throughput"], ours[c]["output_throughput"]) for c, r in spec.items() if c in ours
        }
        result["ratios"]["speculative_ttft_p50"] = {
            c: _div(ttft(r), ttft(ours[c])) for c, r in spec.items() if c in ours
        }
        result["workload"]["spec_prompts"] = a.spec_prompts
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
