"""How long a large request body stalls the other streams of a running server.

A completions stream (greedy, ``ignore_eos``) runs; once it flows, one large JSON body of
`--mib` MiB is posted, of a shape (`--shape`):

- ``long``: a chat request of one message holding one long string;
- ``ids``: a native ``/generate`` request of that many token ids;
- ``ids_bad``: the same with ``max_new_tokens: -1``, a 400 once the body is validated (no
  tokenizing: only reading the body costs);
- ``msgs_bad``: a chat request of many short messages and ``max_tokens: -1``, likewise.

Prints the big request's status and time, and the stream's largest gap between two chunks
before it and around it (from 1 s before it was sent to 0.5 s after its answer). The server's
``--max-request-body-bytes`` (16 MiB by default) caps `--mib`:

    python bench/body_stall.py --url http://127.0.0.1:8000 [--shape ids_bad] [--mib 15.5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.client import COMPLETIONS, async_client, has_content, request_body, served_model, stream_chunks  # noqa: E402

SHAPES = ("long", "ids", "ids_bad", "msgs_bad")


def big_body(shape: str, size: int, model: str) -> tuple[str, bytes]:
    """(path, raw JSON) of a body of about `size` bytes of `shape` (see the module docstring)."""
    if shape == "long":
        return "/v1/chat/completions", json.dumps(
            {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "hello world " * (size // 12)}]}
        ).encode()
    if shape == "msgs_bad":
        return "/v1/chat/completions", json.dumps(
            {"model": model, "max_tokens": -1, "messages": [{"role": "user", "content": "hi there"}] * (size // 40)}
        ).encode()
    budget = -1 if shape == "ids_bad" else 1
    return "/generate", json.dumps(
        {"input_ids": [1234] * (size // 6), "sampling_params": {"max_new_tokens": budget}}
    ).encode()


def max_gap(stamps: list[float], start: float, end: float) -> float:
    """The largest gap between consecutive `stamps` that overlaps [start, end]."""
    return max((b - a for a, b in zip(stamps, stamps[1:]) if b > start and a < end), default=float("nan"))


async def measure(url: str, shape: str, mib: float) -> str:
    """One measurement (see the module docstring), as a line."""
    model = served_model(url)
    path, raw = big_body(shape, int(mib * 2**20), model)
    async with async_client(300) as c:
        stamps: list[float] = []

        async def stream() -> None:
            async for chunk in stream_chunks(c, url, request_body("Count:", 1500, "completions", model), COMPLETIONS):
                if has_content(chunk):
                    stamps.append(time.monotonic())

        task = asyncio.create_task(stream())
        while len(stamps) < 50 and not task.done():
            await asyncio.sleep(0.01)
        t0 = time.monotonic()
        r = await c.post(f"{url}{path}", content=raw, headers={"content-type": "application/json"})
        t1 = time.monotonic()
        while stamps[-1] < t1 + 0.5 and not task.done():
            await asyncio.sleep(0.01)
        task.cancel()
    return (
        f"{shape} {len(raw) / 2**20:.1f} MiB -> {r.status_code} in {t1 - t0:.2f} s; stream's largest gap: "
        f"{max_gap(stamps, stamps[0], t0) * 1e3:.0f} ms before, {max_gap(stamps, t0 - 1, t1 + 0.5) * 1e3:.0f} ms "
        f"around it"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--shape", choices=SHAPES, default="ids_bad")
    p.add_argument("--mib", type=float, default=15.5)
    args = p.parse_args()
    print(asyncio.run(measure(args.url, args.shape, args.mib)))


if __name__ == "__main__":
    main()
