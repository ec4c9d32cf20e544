"""Prefill launches take the cores other processes leave idle (`worker_proc.cpu.blas_threads`):
the measure of busy cores from /proc/stat, the choice, and the switch around a launch."""

from __future__ import annotations

import ctypes

import pytest

from worker_proc.cpu.blas import PREFILL_THREADS_VAR, find_fast_blas
from worker_proc.cpu.blas_threads import MIN_WINDOW_S, CoreMeter, PrefillThreads, busy_seconds, find_setter, from_env

TICK = 0.01


def stat(*cpus: tuple[int, int]) -> str:
    """/proc/stat text with one ``cpuN`` line per (busy, idle) ticks: busy split over user,
    system, irq and steal; idle over idle and iowait."""
    lines = [f"cpu  {sum(b for b, _ in cpus)} 0 0 {sum(i for _, i in cpus)} 0 0 0 0 0 0"]
    for n, (busy, idle) in enumerate(cpus):
        u, sy, irq, st = busy - 3 * (busy // 4), busy // 4, busy // 4, busy // 4
        lines.append(f"cpu{n} {u} 0 {sy} {idle - idle // 2} {idle // 2} {irq} 0 {st} 0 0")
    return "\n".join(lines + ["intr 123 0 0", "ctxt 456", "btime 1", "processes 7"])


def test_busy_seconds_count_every_state_but_idle_and_iowait_of_the_given_cpus():
    text = stat((400, 100), (30, 470), (1000, 0))
    assert busy_seconds(text, {0, 1}, TICK) == pytest.approx(4.3)
    assert busy_seconds(text, {2}, TICK) == pytest.approx(10.0)


class Fake:
    """/proc/stat, own CPU time and a clock that the test moves forward."""

    def __init__(self, cpus: int) -> None:
        self.busy, self.idle = [0] * cpus, [0] * cpus
        self.own = self.now = 0.0

    def advance(self, seconds: float, others: float, ours: float) -> None:
        """`seconds` pass with `others` cores busy in other processes and `ours` in this one."""
        self.now += seconds
        self.own += ours * seconds
        left = (others + ours) * seconds
        for c in range(len(self.busy)):
            used = min(seconds, left)
            left -= used
            self.busy[c] += round(used / TICK)
            self.idle[c] += round((seconds - used) / TICK)

    def meter(self) -> CoreMeter:
        m = CoreMeter(
            set(range(len(self.busy))), lambda: stat(*zip(self.busy, self.idle)), lambda: self.own, lambda: self.now
        )
        m.tick_s = TICK
        m.readings.clear()
        m.record()
        return m


def test_the_meter_leaves_out_this_process():
    f = Fake(2)
    m = f.meter()
    f.advance(1.0, others=0.25, ours=1.0)
    assert m.others() == pytest.approx(0.25)


def test_the_meter_covers_the_latest_fraction_of_a_second_not_the_idle_time_before():
    """A core taken by another process half a second before a prefill counts in full, though
    the worker sat idle (polling) for a minute before it."""
    f = Fake(2)
    m = f.meter()
    for _ in range(600):
        f.advance(0.1, others=0.0, ours=0.0)
        m.record()
    for _ in range(5):
        f.advance(0.1, others=1.0, ours=0.0)
        m.record()
    assert m.others() == pytest.approx(1.0)


def test_the_meter_has_no_measure_until_a_reading_is_old_enough():
    f = Fake(2)
    m = f.meter()
    f.advance(MIN_WINDOW_S / 2, others=1.0, ours=1.0)
    assert m.others() is None
    f.advance(MIN_WINDOW_S / 2, others=1.0, ours=1.0)
    assert m.others() == pytest.approx(1.0)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, n: int) -> None:
        self.calls.append(n)


@pytest.mark.parametrize("others, threads", [(0.0, 2), (0.3, 2), (0.7, 1), (1.0, 1), (2.0, 1)])
def test_a_prefill_takes_the_cores_others_left_idle(others, threads):
    f = Fake(2)
    choice = PrefillThreads(1, 2, Recorder(), f.meter())
    f.advance(0.5, others=others, ours=min(1.0, 2 - others))
    assert choice.choose() == threads


def test_the_count_is_set_around_a_launch_and_restored_and_untouched_when_no_core_is_idle():
    f = Fake(4)
    setter = Recorder()
    choice = PrefillThreads(3, 4, setter, f.meter())
    f.advance(0.5, others=0.1, ours=3.0)
    with choice.applied() as n:
        assert n == 4 and setter.calls == [4]
    assert setter.calls == [4, 3]
    f.advance(0.5, others=1.0, ours=3.0)
    with choice.applied() as n:
        assert n == 3
    assert setter.calls == [4, 3]  # the decode count already holds: nothing set
    f.advance(0.5, others=0.0, ours=3.0)
    with choice.applied(prefill=False) as n:
        assert n == 3  # a decode keeps the count, idle cores or not
    assert setter.calls == [4, 3] and len(choice.meter.readings) == 4


def test_the_count_is_restored_when_the_launch_raises():
    f = Fake(2)
    setter = Recorder()
    choice = PrefillThreads(1, 2, setter, f.meter())
    f.advance(0.5, others=0.0, ours=1.0)
    with pytest.raises(RuntimeError), choice.applied():
        raise RuntimeError("a launch that fails to queue")
    assert setter.calls == [2, 1]


@pytest.mark.parametrize(
    "env",
    [
        {},  # not the auto policy
        {PREFILL_THREADS_VAR: "2"},  # no decode count
        {PREFILL_THREADS_VAR: "2", "MKL_NUM_THREADS": "2"},  # nothing above the decode count
        {PREFILL_THREADS_VAR: "x", "MKL_NUM_THREADS": "1"},
    ],
)
def test_without_the_auto_policy_every_launch_keeps_the_count(env):
    assert from_env(env) is None


def test_the_preloaded_blas_count_is_set_at_run_time():
    """The test session runs with the BLAS the worker preloads (conftest); MKL's count,
    read back with its own getter, follows the setter `from_env` finds."""
    if not find_fast_blas():
        pytest.skip("no optimized BLAS to preload here")
    setter = find_setter()
    assert setter is not None, "the test session's preloaded BLAS has no thread-count setter"
    lib = ctypes.CDLL(None)
    getter = getattr(lib, "MKL_Get_Max_Threads", None) or lib.openblas_get_num_threads
    before = getter()
    try:
        setter(1)
        assert getter() == 1
        setter(2)
        assert getter() == 2
    finally:
        setter(before)
    choice = from_env({PREFILL_THREADS_VAR: "2", "MKL_NUM_THREADS": "1"})
    assert choice is not None and (choice.base, choice.most) == (1, 2)
