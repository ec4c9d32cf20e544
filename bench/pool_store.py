"""Writes into the KV pool back to back (issue 11's concurrency regression): why
`KVPool.store` waits for the previous store and writes all of a message's requests at once.

MLX copies an array whole when a scatter into it is built while an earlier write into it is
still being computed. The worker stores the KV of every request that finishes in a step
(and of every prompt just prefilled) into the pool; written one request at a time, each
started with ``mx.async_eval`` (the code before), the second and later writes of a step
copied the whole pool. In one run, on the pool `launch.py` would size for the model:

    python bench/pool_store.py [--model DIR] [--tokens 181902] [--requests 1,2,4,8] [--len 64]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="a model directory (default: the default model)")
    p.add_argument("--tokens", type=int, default=60000, help="KV pool size in tokens")
    p.add_argument("--requests", default="1,2,4,8", help="requests stored in one step")
    p.add_argument("--len", type=int, default=64, help="tokens stored per request")
    a = p.parse_args()
    import mlx.core as mx

    from protocol.config import ModelSource
    from protocol.model_source import resolve_model
    from worker_proc.memory.kv_pool import KVPool
    from worker_proc.model.loader import load

    loaded = load(ModelSource("hf", a.model, "m") if a.model else resolve_model(None))
    pool = KVPool(loaded.model, a.tokens, loaded.dtype)
    kv = [
        (
            mx.random.normal((heads, a.len, k_dim)).astype(loaded.dtype),
            mx.random.normal((heads, a.len, v_dim)).astype(loaded.dtype),
        )
        for heads, k_dim, v_dim in pool.shapes
    ]
    if max(a.len * int(n) for n in a.requests.split(",")) >= pool.segment:
        p.error(f"the writes must fit in the pool's first segment ({pool.segment} slots)")
    mx.eval(kv)

    def one_at_a_time(writes):  # the code before: a scatter and an async_eval per request (segment 0)
        for slots, rows in writes:
            idx = mx.array(slots, dtype=mx.int32)
            for layer, (k, v) in enumerate(rows):
                pool.keys[layer][0][idx] = k.transpose(1, 0, 2)
                pool.values[layer][0][idx] = v.transpose(1, 0, 2)
            mx.async_eval(pool.arrays())

    print(
        f"pool: {a.tokens} tokens, segment 0 of {pool.segment} slots allocated "
        f"({sum(x.nbytes for x in pool.arrays()) / 2**30:.2f} GiB); {a.len} tokens a request"
    )
    print("| requests in one step | one at a time (before) | KVPool.store (after) | before / after |")
    print("|---|---|---|---|")
    for n in (int(x) for x in a.requests.split(",")):
        writes = [(list(range(1 + i * a.len, 1 + (i + 1) * a.len)), kv) for i in range(n)]
        slots = [s for sl, _ in writes for s in sl]
        together = [
            (mx.concatenate([k] * n, axis=1).transpose(1, 0, 2), mx.concatenate([v] * n, axis=1).transpose(1, 0, 2))
            for k, v in kv
        ]  # every request's rows in KVPool.store's layout
        mx.eval(together)
        took = []
        for store in (lambda: one_at_a_time(writes), lambda: pool.store(slots, together)):
            mx.synchronize()
            t0 = time.perf_counter()
            store()
            mx.synchronize()
            took.append(time.perf_counter() - t0)
        print(f"| {n} | {took[0] * 1e3:.1f} ms | {took[1] * 1e3:.1f} ms | {took[0] / took[1]:.1f}x |")


if __name__ == "__main__":
    main()
