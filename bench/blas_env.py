"""The environment of an MLX process that computes like lazyserve's worker: the same BLAS
preloaded and the same BLAS thread settings (`worker_proc.cpu.blas`), for the reference loops
and the other servers the benchmarks start."""

from __future__ import annotations

import os

from worker_proc.cpu.blas import find_fast_blas, thread_env, usable_cores


def mlx_process_env(blas_threads: int = 0) -> dict[str, str]:
    """os.environ plus the BLAS thread variables for `blas_threads` (as ``launch.py
    --blas-threads``: 0 auto, -1 off) and ``LD_PRELOAD`` of `find_fast_blas()` when there is one."""
    blas = find_fast_blas()
    threads = thread_env(blas_threads, usable_cores(), dict(os.environ))
    return dict(os.environ, **threads, **({"LD_PRELOAD": blas} if blas else {}))
