"""Profile of one steady-state decode step, split by process and phase.

    python bench/step_profile.py [--concurrency 64] [--output-len 256] [--input-len 43]
        [--model DIR --load-format dummy] [--server-flag=--disable-decode-graph ...]
        [--json OUT]

Starts lazyserve with ``LAZYSERVE_TRACE_DIR`` set (every process then writes its own JSONL
trace: `protocol.trace`), sends `--concurrency` streamed requests at once that each decode
`--output-len` tokens (ignore_eos), so the server sits in decode at batch C, then joins the
traces per step (`bench.step_join`) and prints the median of each component in ms per step,
its share of the served step (median interval between consecutive DECODE results), and the
steady tokens/s. Components overlap in time (the device runs while the scheduler works), so
shares do not add up to 100%. Every stage has a deadline; failures exit with a message.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.client import request_body  # noqa: E402
from bench.prompts import synthetic_prompts  # noqa: E402
from bench.serving import run  # noqa: E402
from bench.step_join import COMPONENTS, components, load, median_or_none, served_steps, steady_decodes  # noqa: E402
from protocol.trace import TRACE_DIR_ENV  # noqa: E402


def check_clock() -> str:
    """Confirm that perf_counter readings of two processes are comparable: a child's reading
    must fall between two of this process's. Returns the clock's description; raises
    `SystemExit` when it does not hold."""
    before = time.perf_counter()
    child = float(
        subprocess.run(
            [sys.executable, "-c", "import time; print(time.perf_counter())"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
    )
    after = time.perf_counter()
    if not before <= child <= after:
        raise SystemExit(
            f"perf_counter is not shared between processes here ({before} / {child} / {after}); "
            f"the cross-process transit times would be meaningless"
        )
    return f"{time.get_clock_info('perf_counter').implementation}, cross-process check passed"


def drive(url: str, concurrency: int, input_len: int, output_len: int, timeout_s: float) -> dict:
    """Send `concurrency` streamed requests at once and wait for all (at most `timeout_s`);
    returns `bench.serving.run`'s figures. Raises `SystemExit` when any request failed or
    the deadline passed."""
    bodies = [request_body(p, output_len) for p in synthetic_prompts(concurrency, input_len)]
    try:
        result = run(url, bodies, concurrency, progress=False, timeout_s=timeout_s)
    except TimeoutError:
        raise SystemExit(f"the {concurrency} requests did not finish within --timeout {timeout_s:.0f} s") from None
    if result["failed"]:
        raise SystemExit(f"{result['failed']} of {concurrency} requests failed: {result['errors']}")
    return result


def summarize_steps(trace_dir: Path, concurrency: int, skip: int) -> dict:
    """Median ms per step of each component, the served step (median and mean), the steady tok/s and the share
    of steps built while the worker's order was finalize-early (`worker_proc.finalize_order`;
    a step whose Finalize was not right behind its ChainDecode still ran chain first) from the traces in
    `trace_dir`. Raises `SystemExit` when the traces hold no steady decode."""
    recs = load(trace_dir)
    missing = [k for k, v in recs.items() if not v]
    if recs["worker"] == []:
        raise SystemExit(f"no worker trace in {trace_dir}: was the server started from this tree?")
    dec = steady_decodes(recs["worker"], concurrency, skip)
    steps = served_steps(dec)
    if len(steps) < 3:
        sizes = sorted({r.get("rows") for r in recs["worker"] if r.get("mode") == "DECODE"})
        raise SystemExit(
            f"only {len(steps)} consecutive DECODE steps with {concurrency} rows after skipping {skip} "
            f"(DECODE batch sizes seen: {sizes}); raise --output-len, or check --max-running-requests"
        )
    step_s = median_or_none(steps)
    parts = components(recs, dec)
    rows = {
        key: {
            "label": label,
            "median_ms": None if (m := median_or_none(parts[key])) is None else m * 1e3,
            "share": None if m is None else m / step_s,
            "samples": len(parts[key]),
        }
        for key, label in COMPONENTS
    }
    return {
        "served_step_ms": step_s * 1e3,
        "served_step_mean_ms": sum(steps) / len(steps) * 1e3,
        "steady_tok_s": concurrency / step_s,
        "steps": len(steps),
        "decodes": len(dec),
        "finalize_early_share": sum(bool(r.get("finalize_early")) for r in dec) / len(dec),
        "components": rows,
        "missing_traces": missing,
    }


def table(summary: dict) -> str:
    """The markdown table of `summarize_steps`'s figures."""
    lines = ["| component | median ms per step | share of served step | steps |", "|---|---|---|---|"]
    for row in summary["components"].values():
        ms = "n/a" if row["median_ms"] is None else f"{row['median_ms']:.3f}"
        share = "n/a" if row["share"] is None else f"{row['share']:.1%}"
        lines.append(f"| {row['label']} | {ms} | {share} | {row['samples']} |")
    lines.append(
        f"| **served step** (median interval between DECODE results) | {summary['served_step_ms']:.3f} "
        f"| 100% | {summary['steps']} |"
    )
    lines.append(
        f"\nserved step mean (counts the slow steps the median hides, such as a new trace): "
        f"{summary['served_step_mean_ms']:.3f} ms"
    )
    lines.append(f"steps built while the order was finalize-early: {summary['finalize_early_share']:.0%}")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=64, help="requests in flight: the decode batch size")
    p.add_argument("--output-len", type=int, default=256, help="tokens each request decodes (ignore_eos)")
    p.add_argument("--input-len", type=int, default=43, help="prompt words (about tokens) per request")
    p.add_argument("--model", default=None, help="model dir (default: lazyserve's default model)")
    p.add_argument("--load-format", default="auto", help="auto, or dummy (random weights of the dir's shape)")
    p.add_argument(
        "--server-flag",
        action="append",
        default=[],
        metavar="FLAG",
        help="passed to launch.py, e.g. --server-flag=--disable-decode-graph (repeatable)",
    )
    p.add_argument("--skip-steps", type=int, default=None, help="first C-row decodes left out (default: 10%%)")
    p.add_argument("--startup-timeout", type=float, default=600, help="seconds for the server to become healthy")
    p.add_argument("--timeout", type=float, default=1200, help="seconds for the requests to finish")
    p.add_argument("--trace-dir", default=None, help="where the traces go (default: a new temporary dir)")
    p.add_argument("--json", default=None, help="write the figures here")
    return p


def main() -> None:
    a = parser().parse_args()
    from tests.support.launcher import Server

    clock = check_clock()
    trace_dir = Path(a.trace_dir or tempfile.mkdtemp(prefix="lazyserve-step-profile-"))
    trace_dir.mkdir(parents=True, exist_ok=True)
    if any(trace_dir.glob("*.jsonl")):
        raise SystemExit(f"{trace_dir} already holds traces; give an empty --trace-dir")
    launch_args = [
        *(["--model", a.model] if a.model else []),
        "--load-format",
        a.load_format,
        "--max-running-requests",
        str(a.concurrency),
        *a.server_flag,
    ]
    os.environ[TRACE_DIR_ENV] = str(trace_dir)
    try:
        server = Server(launch_args, trace_dir / "server.log", timeout=a.startup_timeout)
    except RuntimeError as e:
        raise SystemExit(f"lazyserve did not start ({' '.join(launch_args)}): {str(e)[-3000:]}") from None
    finally:
        os.environ.pop(TRACE_DIR_ENV, None)
    try:
        client = drive(server.base_url, a.concurrency, a.input_len, a.output_len, a.timeout)
    finally:
        code = server.stop()
    print(f"server stopped (exit {code}); log and traces in {trace_dir}", file=sys.stderr)
    skip = a.skip_steps if a.skip_steps is not None else max(2, a.output_len // 10)
    summary = summarize_steps(trace_dir, a.concurrency, skip)
    print(
        f"lazyserve step profile: concurrency {a.concurrency}, output {a.output_len}, input {a.input_len}, "
        f"launch flags: {' '.join(launch_args)}; clock: {clock}\n"
    )
    print(table(summary))
    print(
        f"\nsteady decode: {summary['steady_tok_s']:.1f} tok/s (concurrency / served step); clients: "
        f"{client['output_throughput']:.1f} tok/s over the whole run incl. prefill and ramp"
    )
    if summary["missing_traces"]:
        print(f"warning: no records from {summary['missing_traces']}", file=sys.stderr)
    if a.json:
        Path(a.json).write_text(
            json.dumps(
                {
                    "args": vars(a),
                    "launch_args": launch_args,
                    "clock": clock,
                    "trace_dir": str(trace_dir),
                    "client": client,
                    **summary,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
