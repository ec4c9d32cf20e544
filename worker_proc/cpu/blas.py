"""Finding and reporting the BLAS library the worker's MLX CPU backend uses (DESIGN.md §5).

The `mlx[cpu]` wheel on Linux links the reference BLAS (about 5 GFLOP/s on a
256x576x1536 matmul). Launch finds an optimized BLAS (`find_fast_blas`), and the worker,
when MLX runs on the CPU, re-executes itself with it in ``LD_PRELOAD`` (`preload_env`;
never on a GPU), which gives 140-176 GFLOP/s. Launch also chooses the BLAS thread count
and wait policy set in the worker's environment (`thread_env`), so that BLAS threads never
spin on a core another process holds, and lets prefill launches take the cores that are idle
(`worker_proc.cpu.blas_threads`). This module never imports mlx.
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

_CANDIDATES = (
    # Debian's libopenblas0-pthread (measured 180 GFLOP/s here, the fastest when present)
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3",
    # the `mkl` wheel (a Linux x86_64 dependency in pyproject.toml; 144 GFLOP/s here)
    os.path.join(sys.prefix, "lib", "libmkl_rt.so*"),
)
_FAST_MARKERS = ("mkl", "openblas", "blis")


def find_fast_blas() -> str | None:
    """Path of an optimized BLAS shared library to preload, or None (not Linux, or none found).

    ``LAZYSERVE_BLAS`` overrides the search: a path, or ``none`` to disable preloading.
    """
    override = os.environ.get("LAZYSERVE_BLAS")
    if override:
        return None if override.lower() == "none" else override
    if not sys.platform.startswith("linux"):
        return None
    for pattern in _CANDIDATES:
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def preload_env(blas: str, on_gpu: bool, thread_vars: dict[str, str], environ: dict[str, str]) -> dict[str, str] | None:
    """The environment to re-execute the current process with so that the CPU BLAS `blas`
    (a path, "" for none) is preloaded (a BLAS must be loaded before MLX is) and
    `thread_vars` (`thread_env`) are set; or None when `environ` already has them (as the
    re-executed process does, so it is done once), or when MLX runs on a GPU (`on_gpu`:
    its CPU BLAS is then unused, so the process and its environment stay as they are).
    A `blas` already in LD_PRELOAD is kept as it is."""
    if on_gpu:
        return None
    wanted = dict(thread_vars)
    if blas and blas not in environ.get("LD_PRELOAD", ""):
        wanted["LD_PRELOAD"] = blas
    if all(environ.get(k) == v for k, v in wanted.items()):
        return None
    return dict(environ, **wanted)


def reexec_env() -> dict[str, str] | None:
    """`preload_env` for a process that runs MLX on the CPU with `find_fast_blas()` and no
    thread settings (the test session)."""
    return preload_env(find_fast_blas() or "", False, {}, dict(os.environ))


def loaded_blas() -> list[str]:
    """The BLAS-like shared libraries mapped into this process (from /proc/self/maps)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return []
    libs = set()
    for line in maps.read_text().splitlines():
        path = line.split()[-1] if line.split() else ""
        name = os.path.basename(path)
        if any(k in name for k in ("blas", "mkl_rt", "lapack")):
            libs.add(path)
    return sorted(libs)


def is_fast(libs: list[str]) -> bool:
    """True when one of `libs` is an optimized BLAS (MKL, OpenBLAS or BLIS)."""
    return any(m in os.path.basename(p).lower() or m in p.lower() for p in libs for m in _FAST_MARKERS)


THREAD_COUNT_VARS = ("MKL_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")
"""Thread counts: MKL (``libmkl_rt`` reads MKL_NUM_THREADS, then OMP_NUM_THREADS), OpenMP
(Intel's libiomp5 under MKL, GNU libgomp) and Debian's ``openblas-pthread`` (reads
OPENBLAS_NUM_THREADS, then OMP_NUM_THREADS)."""
WAIT_POLICY_ENV = {
    "OMP_WAIT_POLICY": "PASSIVE",
    "KMP_BLOCKTIME": "0",
    "OPENBLAS_THREAD_TIMEOUT": "4",
}
"""Idle BLAS threads sleep at once instead of spinning: OpenMP's passive wait; libiomp5's
block time (ms an idle thread spins, default 200); OpenBLAS's spin time of an idle thread,
2**N cycles for N in 4..30 (default 28, about 0.1 s), here the minimum. OpenBLAS's calling
thread still spins (yielding) while its helper threads run a call; only fewer threads help there."""
ADAPTIVE_WAIT_ENV = {k: v for k, v in WAIT_POLICY_ENV.items() if k != "OMP_WAIT_POLICY"}
"""The waits of the auto policy, whose prefills take the cores other processes leave idle
(`PREFILL_THREADS_VAR`): threads still sleep at once between BLAS calls, but wait actively
inside one. libiomp5's passive wait made two threads slower than one there (16 prompts of
19 tokens, default model: 1.9-2.0 s against 1.2 s; active: 0.84 s)."""
PREFILL_THREADS_VAR = "LAZYSERVE_PREFILL_THREADS"
"""Set by the auto policy: the most BLAS threads a prefill launch may use, when the cores
are free (`worker_proc.cpu.blas_threads`); the count variables stay the decode count."""
RESERVED_CORES = 1
"""Cores left to our other processes (tokenizer/HTTP, scheduler, detokenizers), which are
busy while the worker decodes."""
THREADS_OFF = -1
"""``--blas-threads`` value that sets nothing: the BLAS libraries' own defaults."""


def usable_cores() -> int:
    """CPU cores this process may run on: its affinity mask, else ``os.cpu_count()``."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def auto_threads(cores: int) -> int:
    """BLAS threads for the worker on `cores` usable cores: all but `RESERVED_CORES`, at least 1."""
    return max(1, cores - RESERVED_CORES)


def thread_env(threads: int, cores: int, environ: dict[str, str]) -> dict[str, str]:
    """Variables to add to the worker's environment for `threads` BLAS threads (0: auto;
    `THREADS_OFF`: none).

    Auto: `auto_threads` of `cores` for every launch, and for prefill launches up to `cores`,
    as many as other processes leave idle (`PREFILL_THREADS_VAR`, `ADAPTIVE_WAIT_ENV`); when
    that is no more than the decode count, or `threads` is given, a fixed count with the
    passive `WAIT_POLICY_ENV`. The user's settings in `environ` win, by group: when any of
    `THREAD_COUNT_VARS` is set, no thread count is added (MKL would read our MKL_NUM_THREADS
    before the user's OMP_NUM_THREADS) and prefills keep it; when any wait variable is set,
    no wait variable is added, and a passive OMP_WAIT_POLICY there keeps prefills at the count.
    """
    if threads == THREADS_OFF:
        return {}
    count = threads or auto_threads(cores)
    user_count = any(name in environ for name in THREAD_COUNT_VARS)
    user_wait = any(name in environ for name in WAIT_POLICY_ENV)
    adaptive = (
        not threads and not user_count and cores > count and environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE"
    )
    env = {} if user_count else dict.fromkeys(THREAD_COUNT_VARS, str(count))
    if not user_wait:
        env.update(ADAPTIVE_WAIT_ENV if adaptive else WAIT_POLICY_ENV)
    if adaptive:
        env[PREFILL_THREADS_VAR] = str(cores)
    return env


def thread_report(library: str, environ: dict[str, str]) -> str:
    """The thread settings in `environ` that `library` (a BLAS path) reads, for the worker's
    ready line: ``blas_threads=1 OPENBLAS_THREAD_TIMEOUT=4`` for OpenBLAS, ``blas_threads=1
    OMP_WAIT_POLICY=PASSIVE KMP_BLOCKTIME=0`` otherwise (MKL); ``default`` where unset;
    ``prefill_blas_threads=1-2`` after the count when prefills take idle cores."""
    if "openblas" in library.lower():
        count_vars, wait_vars = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"), ("OPENBLAS_THREAD_TIMEOUT",)
    else:
        count_vars, wait_vars = ("MKL_NUM_THREADS", "OMP_NUM_THREADS"), ("OMP_WAIT_POLICY", "KMP_BLOCKTIME")
    threads = next((environ[v] for v in count_vars if v in environ), "default")
    prefill = (
        [f"prefill_blas_threads={threads}-{environ[PREFILL_THREADS_VAR]}"] if PREFILL_THREADS_VAR in environ else []
    )
    return " ".join([f"blas_threads={threads}", *prefill, *(f"{v}={environ.get(v, 'default')}" for v in wait_vars)])
