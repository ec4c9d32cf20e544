"""Finding and reporting the BLAS library the worker's MLX CPU backend uses (DESIGN.md §5).

The `mlx[cpu]` wheel on Linux links the reference BLAS (about 5 GFLOP/s on a
256x576x1536 matmul). Launch preloads an optimized BLAS into the worker with
``LD_PRELOAD``, which gives 140-176 GFLOP/s. This module never imports mlx.
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


REEXEC_MARK = "LAZYSERVE_BLAS_REEXEC"
"""Set in the environment of a process re-executed by `reexec_env`, so it is done once."""


def reexec_env() -> dict[str, str] | None:
    """The environment to re-execute the current process with so that `find_fast_blas()` is
    preloaded (a BLAS must be loaded before MLX is), or None when there is none, it is
    already preloaded, or this process is that re-execution."""
    blas = find_fast_blas()
    if not blas or blas in os.environ.get("LD_PRELOAD", "") or os.environ.get(REEXEC_MARK):
        return None
    return dict(os.environ, LD_PRELOAD=blas, **{REEXEC_MARK: "1"})


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
