"""Multi-turn benchmark on a hybrid model (issue 11): prompt tokens computed with the prefix
cache off, on (recurrent-state snapshots), and on with ``--enable-mamba-extra-buffer`` (the
state at the end of each answer cached too), side by side in one run.

8 conversations (``--conversations``) x 6 turns; each turn's prompt is the previous prompt, the previous answer
and 64 new tokens; answers are 16 greedy tokens. Conversations run concurrently, their turns
in order. Counts come from /metrics (prompt tokens admitted and served from the cache);
answers are compared across the servers (they must be equal). The model defaults to a
random-weight Nemotron-H test config; ``--model`` takes any model directory.

    python bench/multi_turn.py [--model DIR] [--snapshot-every 64] [--out FILE]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.cli import emit  # noqa: E402
from bench.client import greedy_ids, tiny_model  # noqa: E402
from bench.prefix_cache import settled_metrics  # noqa: E402
from tests.support.pool_state import metrics  # noqa: E402

CONVERSATIONS, TURNS, TURN_TOKENS, ANSWER_TOKENS = 8, 6, 64, 16


def conversation(url: str, seed: int) -> list[list[int]]:
    """Run one conversation; returns its answers (token ids per turn)."""
    import httpx

    rng = random.Random(seed)
    prompt: list[int] = []
    answers = []
    with httpx.Client(timeout=3600) as client:
        for _ in range(TURNS):
            prompt = prompt + [rng.randrange(100, 30000) for _ in range(TURN_TOKENS)]
            answer = greedy_ids(client, url, prompt, ANSWER_TOKENS)
            answers.append(answer)
            prompt = prompt + answer
    return answers


def workload(url: str, conversations: int) -> tuple[dict, list]:
    """Prompt tokens received and computed, seconds, and the answers, of the whole workload."""
    before = metrics(url)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(conversations) as pool:
        answers = list(pool.map(lambda i: conversation(url, i), range(conversations)))
    seconds = time.perf_counter() - t0
    after = settled_metrics(url, before, conversations * TURNS)
    received = after["lazyserve_admitted_prompt_tokens"] - before["lazyserve_admitted_prompt_tokens"]
    cached = after["lazyserve_prefix_cache_hit_tokens"] - before["lazyserve_prefix_cache_hit_tokens"]
    return {"received": received, "computed": received - cached, "seconds": seconds}, answers


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a model directory (default: a random Nemotron-H test config)")
    p.add_argument("--snapshot-every", type=int, default=64, help="--mamba-cache-chunk-size of the cache-on server")
    p.add_argument("--conversations", type=int, default=CONVERSATIONS)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    from tests.support.launcher import Server

    tmp = tempfile.TemporaryDirectory()
    model = a.model
    if model is None:
        from tests.support.hybrid_configs import HYBRID_CONFIGS

        model = tiny_model(Path(tmp.name), HYBRID_CONFIGS["nemotron_h"])
    base = ["--model", model, "--max-running-requests", str(a.conversations)]
    on = [*base, "--mamba-cache-chunk-size", str(a.snapshot_every)]
    runs = {"off": [*base, "--disable-radix-cache"], "on": on, "extra buffer": [*on, "--enable-mamba-extra-buffer"]}
    results, answers = {}, {}
    for name, args in runs.items():  # one server at a time: they would share the cores
        server = Server(args, Path(tmp.name) / f"server-{name}.log")
        try:
            results[name], answers[name] = workload(server.base_url, a.conversations)
        finally:
            server.stop()
    off = results["off"]
    lines = [
        f"model: {a.model or 'random Nemotron-H test config'}; python bench/multi_turn.py {' '.join(sys.argv[1:])}",
        "",
        f"{a.conversations} conversations x {TURNS} turns, +{TURN_TOKENS} tokens a turn, {ANSWER_TOKENS}-token answers.",
        "",
        "| prefix cache | prompt tokens received | prompt tokens computed | time |",
        "|---|---|---|---|",
        *(
            f"| {label} | {r['received']:.0f} | {r['computed']:.0f} | {r['seconds']:.1f} s |"
            for label, r in zip(
                ("off", f"on, snapshots every {a.snapshot_every}", "on, with --enable-mamba-extra-buffer"),
                results.values(),
            )
        ),
        "",
        *(
            f"computed off / {name}: {off['computed'] / max(r['computed'], 1):.2f}x; answers equal to off: "
            f"{answers[name] == answers['off']}"
            for name, r in results.items()
            if name != "off"
        ),
    ]
    emit(lines, a.out)


if __name__ == "__main__":
    main()
