"""Speculative decoding on and off (issue 42): the same server, the same greedy requests.

    python bench/spec_decode.py [--model PATH] [--algorithm NGRAM] [--k 4] [--max-tokens 256]
        [--concurrency 16] [--blas-threads N] [--json OUT]

Starts ``launch.py`` without speculation, then with ``--speculative-algorithm NGRAM
--speculative-num-draft-tokens K`` (otherwise the same flags), and on each runs every
workload of `bench.spec_prompts` at batch 1 (its prompts one after the other), then a mixed
batch: `--concurrency` requests at once, cycling through every workload's prompts. Each
server is warmed the same way first (every prompt once, untimed). Reports per workload the
decode tokens/s of one stream (median of the prompts' per-stream rates; the mixed batch's
output tokens/s over its whole run), on / off, the acceptance (draft tokens accepted / drafted,
from the server's /metrics around the run) and whether the outputs are the same text.
The default model's real weights are the point: random weights accept nothing."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.client import on_server, request_body  # noqa: E402
from bench.serving import run  # noqa: E402
from bench.spec_prompts import WORKLOADS  # noqa: E402

MIXED = "mixed"


def spec_counts(url: str) -> tuple[float, float]:
    """(draft tokens, accepted tokens) from /metrics (0 when the server does not speculate)."""
    from tests.support.pool_state import metrics

    m = metrics(url)
    return m.get("lazyserve_spec_decode_num_draft_tokens", 0.0), m.get("lazyserve_spec_decode_num_accepted_tokens", 0.0)


def texts(url: str, prompts: list[str], max_tokens: int) -> list[str]:
    """The non-streamed greedy outputs of `prompts`, one after the other."""
    out = []
    for p in prompts:
        body = request_body(p, max_tokens, ignore_eos=False, stream=False)
        out.append(
            httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600).json()["choices"][0]["message"]["content"]
        )
    return out


def workloads(server, names: list[str], max_tokens: int, concurrency: int) -> dict:
    """Run the workloads `names` on `server` (warm-up first), then the mixed batch unless
    `concurrency` is 0; returns per workload its figures."""
    url = server.base_url
    everything = [p for name in names for p in WORKLOADS[name]]
    run(url, [request_body(p, max_tokens, ignore_eos=False) for p in everything], 1, progress=False)
    out: dict = {"command": " ".join(map(str, server.proc.args))}
    for name in names:
        prompts = WORKLOADS[name]
        before = spec_counts(url)
        rates = [run(url, [request_body(p, max_tokens, ignore_eos=False)], 1, progress=False) for p in prompts]
        after = spec_counts(url)
        out[name] = {
            "decode_tok_s": statistics.median(r["per_stream_decode_tok_s"]["median"] for r in rates),
            "output_tokens": [r["total_output_tokens"] for r in rates],
            "drafted": after[0] - before[0],
            "accepted": after[1] - before[1],
            "texts": texts(url, prompts, max_tokens),
        }
    if not concurrency:
        return out
    mixed = [everything[i % len(everything)] for i in range(concurrency)]
    before = spec_counts(url)
    r = run(url, [request_body(p, max_tokens, ignore_eos=False) for p in mixed], concurrency, progress=False)
    after = spec_counts(url)
    out[MIXED] = {
        "output_tok_s": r["output_throughput"],
        "output_tokens": r["total_output_tokens"],
        "drafted": after[0] - before[0],
        "accepted": after[1] - before[1],
    }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="GGUF file or model directory (default: the default model)")
    p.add_argument("--algorithm", default="NGRAM")
    p.add_argument("--k", type=int, default=4, help="--speculative-num-draft-tokens")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=16, help="the mixed batch's requests (0: no mixed batch)")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated, of bench.spec_prompts")
    p.add_argument("--blas-threads", type=int, default=0)
    p.add_argument("--extra-flags", default="", help="launch.py flags for both servers")
    p.add_argument("--startup-timeout", type=float, default=600)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    model = ["--model", a.model] if a.model else []
    logs = Path(tempfile.mkdtemp(prefix="lazyserve-spec-"))
    base = " ".join([*model, a.extra_flags]).strip()
    flags = {"off": base, "on": f"{base} --speculative-algorithm {a.algorithm} --speculative-num-draft-tokens {a.k}"}
    results = {}
    names = a.workloads.split(",")
    for mode, extra in flags.items():

        def start(extra=extra, mode=mode):
            from tests.support.launcher import Server

            return Server(
                [*extra.split(), "--blas-threads", str(a.blas_threads)], logs / f"{mode}.log", a.startup_timeout
            )

        results[mode] = on_server(start, lambda s: workloads(s, names, a.max_tokens, a.concurrency))
        if "error" in results[mode]:
            raise SystemExit(f"the {mode} server did not start: {results[mode]['error']}")
    table = {}
    print("| workload | off | on | on / off | acceptance | same text |")
    print("|---|---|---|---|---|---|")
    for name in [*names, *([MIXED] if a.concurrency else [])]:
        off, on = results["off"][name], results["on"][name]
        key = "output_tok_s" if name == MIXED else "decode_tok_s"
        acc = on["accepted"] / on["drafted"] if on["drafted"] else None
        same = None if name == MIXED else off["texts"] == on["texts"]
        table[name] = {
            "off": off[key],
            "on": on[key],
            "ratio": on[key] / off[key],
            "acceptance": acc,
            "same_text": same,
        }
        print(
            f"| {name} | {off[key]:.1f} | {on[key]:.1f} | {on[key] / off[key]:.2f} | "
            f"{'-' if acc is None else f'{acc:.2f}'} ({on['accepted']:.0f}/{on['drafted']:.0f}) | {same} |"
        )
    if a.json:
        Path(a.json).write_text(
            json.dumps({"command": " ".join(sys.argv), "flags": flags, "table": table, "runs": results}, indent=1)
        )


if __name__ == "__main__":
    main()
