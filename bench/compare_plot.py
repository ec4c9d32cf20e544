"""Plots of a `bench.compare` result: output throughput and TTFT p50 against concurrency for
each server, with the raw mlx-lm decode loop's rate on the throughput plot.

    python -m bench.compare_plot RESULT.json OUT.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def plot(result: dict, out: str | Path) -> None:
    """Write the two plots of `result` (`bench.compare`'s JSON) side by side to the PNG `out`
    (the raw loop's line: its batch-cache rates; the plain batch-1 loop's is a number, not a
    line). Raises `ImportError` when matplotlib is not installed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (tput, ttft) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, runs in result["servers"].items():
        points = sorted((int(c), r) for c, r in runs.get("runs", {}).items())
        if not points:
            continue
        xs = [c for c, _ in points]
        tput.plot(xs, [r["output_throughput"] or 0 for _, r in points], marker="o", label=name)
        ttft.plot(xs, [(r["ttft_ms"] or {}).get("p50", float("nan")) for _, r in points], marker="o", label=name)
    raw = sorted((int(b), v) for b, v in result.get("raw_decode_tok_s", {}).items() if b != "plain")
    if raw:
        tput.plot([b for b, _ in raw], [v for _, v in raw], "k--", marker="x", label="raw mlx-lm loop (decode tok/s)")
    w = result["workload"]
    for ax, title, unit in ((tput, "output throughput", "tokens/s"), (ttft, "TTFT p50", "ms")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(w["concurrency"], [str(c) for c in w["concurrency"]])
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(
        f"{result['model']} ({result['weights']} weights): {w['num_prompts']} prompts, "
        f"input {w['input_len']}, output {w['output_len']} tokens",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("result", help="the JSON `bench.compare --json` wrote")
    p.add_argument("out", help="the PNG to write")
    a = p.parse_args()
    plot(json.loads(Path(a.result).read_text()), a.out)


if __name__ == "__main__":
    main()
