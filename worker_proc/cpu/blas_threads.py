"""BLAS threads for a prefill launch on the CPU, chosen per launch from the cores that other
processes leave idle (issue 13; launch's auto policy, `worker_proc.cpu.blas.thread_env`).

A decode step keeps the worker's BLAS thread count (one on a 2-core host: the tokenizer,
scheduler and detokenizer share the cores, and a second thread waiting for a core another
process holds stalls every product of the step). A prefill is a few large products, and when
the other cores are idle a second thread takes 28% off it (16 prompts of 19 tokens, default
model, MKL: 1.15-1.19 s with one thread, 0.84-0.85 s with two; with one core held by a spin
loop two threads take 2.7-2.9 s). So before a prefill launch the worker measures how busy the
cores were over the last fraction of a second, leaving out its own threads
(`CoreMeter`: /proc/stat against the process's own CPU time), and lets the launch use the
idle ones (`PrefillThreads`); the count is restored after the launch is queued. This module
never imports mlx.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from worker_proc.cpu.blas import PREFILL_THREADS_VAR, THREAD_COUNT_VARS

MIN_WINDOW_S = 0.2
"""Shortest span a measure of the cores covers: /proc/stat counts in ticks of 10 ms
(`os.sysconf("SC_CLK_TCK")` = 100), so shorter spans are noise."""
RECORD_EVERY_S = 0.05
"""`CoreMeter.record` keeps a reading at most this often, so that a measure covers the
latest `MIN_WINDOW_S` or a little more, not the whole time since the previous prefill (a
core taken a second ago counts, an hour of idle before it does not)."""
SETTERS = ("MKL_Set_Num_Threads", "openblas_set_num_threads")
"""Functions that set a BLAS library's thread count at run time, ``void f(int)``: MKL's
(libmkl_rt) and OpenBLAS's."""


def busy_seconds(stat: str, cpus: set[int], tick_s: float) -> float:
    """Seconds the CPUs `cpus` spent on anything but idle and I/O wait since boot, from the
    text of /proc/stat (``cpuN user nice system idle iowait irq softirq steal ...`` in ticks
    of `tick_s` seconds; steal counts as busy: another guest held the core). Raises
    `ValueError` on a line that is not in that format."""
    busy = 0
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        ticks = [int(v) for v in rest.split()[:8]]
        busy += sum(ticks) - ticks[3] - ticks[4]
    return busy * tick_s


def own_cpu_seconds() -> float:
    """CPU seconds (user + system) of every thread of this process so far."""
    t = os.times()
    return t.user + t.system


class CoreMeter:
    """How many of the CPUs `cpus` other processes kept busy, on average, over the latest
    `MIN_WINDOW_S` or a little more (cores, 0.0 .. len(cpus)): busy time of those CPUs from
    /proc/stat less this process's own CPU time, over the wall time between two readings.
    The worker calls `record` as it runs (every launch, and every poll while idle)."""

    def __init__(
        self,
        cpus: set[int],
        read_stat: Callable[[], str] = lambda: Path("/proc/stat").read_text(),
        own: Callable[[], float] = own_cpu_seconds,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cpus = cpus
        self.read_stat, self.own, self.clock = read_stat, own, clock
        self.tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
        self.readings: deque[tuple[float, float, float]] = deque(maxlen=64)
        """(clock s, busy s, own CPU s), oldest first."""
        self.record()

    def _reading(self) -> tuple[float, float, float]:
        return self.clock(), busy_seconds(self.read_stat(), self.cpus, self.tick_s), self.own()

    def record(self) -> None:
        """Keep a reading, unless the latest is under `RECORD_EVERY_S` old (then nothing is read)."""
        if not self.readings or self.clock() - self.readings[-1][0] >= RECORD_EVERY_S:
            self.readings.append(self._reading())

    def others(self) -> float | None:
        """Cores that other processes used from the newest reading at least `MIN_WINDOW_S`
        old until now, or None when every reading is younger (just started)."""
        now = self._reading()
        start = next((r for r in reversed(self.readings) if now[0] - r[0] >= MIN_WINDOW_S), None)
        self.readings.append(now)
        if start is None:
            return None
        span, busy, own = (a - b for a, b in zip(now, start))
        return min(float(len(self.cpus)), max(0.0, (busy - own) / span))


class PrefillThreads:
    """The BLAS thread count of prefill launches: `base` (the decode count) plus the cores
    other processes left idle (`CoreMeter.others`, rounded), at most `most`."""

    def __init__(self, base: int, most: int, set_threads: Callable[[int], None], meter: CoreMeter) -> None:
        self.base, self.most = base, most
        self.set_threads = set_threads
        self.meter = meter
        self.count = base
        """The latest choice (kept while the meter has no reading old enough)."""

    def choose(self) -> int:
        """Threads for the next prefill: round(CPUs − cores others used), within
        [`base`, `most`]."""
        others = self.meter.others()
        if others is not None:
            self.count = max(self.base, min(self.most, int(len(self.meter.cpus) - others + 0.5)))
        return self.count

    def record(self) -> None:
        """`CoreMeter.record`: the worker calls it at every idle poll."""
        self.meter.record()

    @contextmanager
    def applied(self, prefill: bool = True) -> Iterator[int]:
        """Run the body (queueing a launch) with `choose()` threads when `prefill`, then set
        `base` again; a decode keeps `base` and only records a reading."""
        n = self.choose() if prefill else self.base
        if not prefill:
            self.record()
        if n == self.base:
            yield n
            return
        self.set_threads(n)
        try:
            yield n
        finally:
            self.set_threads(self.base)


def find_setter() -> Callable[[int], None] | None:
    """The loaded BLAS library's thread-count setter (`SETTERS`), looked up in the process's
    global symbols (the preloaded library is there), or None when none is loaded."""
    lib = ctypes.CDLL(None)
    for name in SETTERS:
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.argtypes, fn.restype = [ctypes.c_int], None
            return fn
    return None


def from_env(environ: dict[str, str]) -> PrefillThreads | None:
    """`PrefillThreads` for this process when launch's auto policy set `PREFILL_THREADS_VAR`
    above the decode count (`THREAD_COUNT_VARS`), a BLAS setter is loaded and /proc/stat is
    readable; otherwise None (every launch keeps the environment's count)."""
    most = environ.get(PREFILL_THREADS_VAR, "")
    base = next((environ[v] for v in THREAD_COUNT_VARS if v in environ), "")
    if not (most.isdigit() and base.isdigit()) or int(most) <= int(base):
        return None
    setter = find_setter()
    if setter is None or not hasattr(os, "sched_getaffinity"):
        return None
    try:
        meter = CoreMeter(set(os.sched_getaffinity(0)))
    except (OSError, ValueError):
        return None
    return PrefillThreads(int(base), int(most), setter, meter)
