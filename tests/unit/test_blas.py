"""The BLAS thread policy launch chooses for the worker, and the worker's decision to re-execute
itself with the CPU BLAS preloaded (no model, no MLX)."""

from __future__ import annotations

import pytest

from launcher.args import parse_args
from worker_proc.cpu.blas import (
    PREFILL_THREADS_VAR,
    THREADS_OFF,
    auto_threads,
    preload_env,
    thread_env,
    thread_report,
    usable_cores,
)

PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE", "KMP_BLOCKTIME": "0", "OPENBLAS_THREAD_TIMEOUT": "4"}
SLEEP_BETWEEN_CALLS = {"KMP_BLOCKTIME": "0", "OPENBLAS_THREAD_TIMEOUT": "4"}


@pytest.mark.parametrize("cores, threads", [(1, 1), (2, 1), (4, 3), (16, 15)])
def test_auto_threads_leave_one_core_to_the_other_processes(cores, threads):
    assert auto_threads(cores) == threads


@pytest.mark.parametrize("cores, count", [(2, "1"), (8, "7")])
def test_auto_env_sets_every_thread_count_and_lets_prefills_take_every_core(cores, count):
    """Threads sleep at once between BLAS calls (never spin on a core another process holds);
    prefills may use every core, when idle (`worker_proc.cpu.blas_threads`), so the waits inside
    a call are not passive (libiomp5's passive wait made two threads slower than one)."""
    env = thread_env(0, cores, {})
    assert env == {
        "MKL_NUM_THREADS": count,
        "OMP_NUM_THREADS": count,
        "OPENBLAS_NUM_THREADS": count,
        **SLEEP_BETWEEN_CALLS,
        PREFILL_THREADS_VAR: str(cores),
    }


def test_auto_env_on_one_core_has_a_fixed_count_and_passive_waits():
    assert thread_env(0, 1, {}) == {
        "MKL_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        **PASSIVE,
    }


def test_explicit_thread_count_ignores_the_core_count():
    env = thread_env(3, 2, {})
    assert env["MKL_NUM_THREADS"] == env["OMP_NUM_THREADS"] == env["OPENBLAS_NUM_THREADS"] == "3"
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and PREFILL_THREADS_VAR not in env


def test_a_user_thread_count_keeps_all_counts_unset():
    user = {"OMP_NUM_THREADS": "2", "PATH": "/bin"}
    env = thread_env(0, 4, user)
    assert env == PASSIVE
    assert {**user, **env}["OMP_NUM_THREADS"] == "2"


def test_a_user_passive_wait_keeps_prefills_at_the_count():
    env = thread_env(0, 4, {"OMP_WAIT_POLICY": "passive"})
    assert env == {"MKL_NUM_THREADS": "3", "OMP_NUM_THREADS": "3", "OPENBLAS_NUM_THREADS": "3"}


def test_a_user_wait_setting_keeps_all_wait_variables_unset():
    user = {"KMP_BLOCKTIME": "200"}
    env = thread_env(0, 4, user)
    assert env == {
        "MKL_NUM_THREADS": "3",
        "OMP_NUM_THREADS": "3",
        "OPENBLAS_NUM_THREADS": "3",
        PREFILL_THREADS_VAR: "4",
    }
    assert {**user, **env}["KMP_BLOCKTIME"] == "200"


def test_off_sets_nothing():
    assert thread_env(THREADS_OFF, 2, {}) == {}


def test_usable_cores_is_the_affinity_mask():
    import os

    assert usable_cores() == len(os.sched_getaffinity(0))


def test_report_names_the_variables_the_library_reads():
    env = thread_env(0, 2, {})
    assert (
        thread_report("/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3", env)
        == "blas_threads=1 prefill_blas_threads=1-2 OPENBLAS_THREAD_TIMEOUT=4"
    )
    assert (
        thread_report("/venv/lib/libmkl_rt.so.3", env)
        == "blas_threads=1 prefill_blas_threads=1-2 OMP_WAIT_POLICY=default KMP_BLOCKTIME=0"
    )
    assert (
        thread_report("/venv/lib/libmkl_rt.so.3", thread_env(1, 2, {}))
        == "blas_threads=1 OMP_WAIT_POLICY=PASSIVE KMP_BLOCKTIME=0"
    )
    assert (
        thread_report("/venv/lib/libmkl_rt.so.3", {"OMP_NUM_THREADS": "4"})
        == "blas_threads=4 OMP_WAIT_POLICY=default KMP_BLOCKTIME=default"
    )


@pytest.mark.parametrize("value, expected", [(None, 0), ("-1", -1), ("4", 4)])
def test_blas_threads_flag(value, expected):
    assert parse_args([] if value is None else ["--blas-threads", value]).blas_threads == expected


def test_blas_threads_flag_rejects_below_off():
    with pytest.raises(SystemExit):
        parse_args(["--blas-threads", "-2"])


MKL = "/venv/lib/libmkl_rt.so.3"
THREADS = {"MKL_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def test_on_the_cpu_the_worker_reexecutes_with_the_blas_and_its_threads():
    env = preload_env(MKL, False, THREADS, {"PATH": "/bin"})
    assert env == {"PATH": "/bin", "LD_PRELOAD": MKL, **THREADS}


def test_on_a_gpu_the_worker_preloads_nothing():
    assert preload_env(MKL, True, THREADS, {"PATH": "/bin"}) is None


def test_the_reexecuted_worker_does_not_reexecute_again():
    env = preload_env(MKL, False, THREADS, {"PATH": "/bin"})
    assert preload_env(MKL, False, THREADS, env) is None


def test_a_worker_started_from_a_reexecuted_process_still_gets_its_threads():
    """The test session runs re-executed with the BLAS preloaded but no thread settings; the
    worker it starts inherits that environment and must still set its threads."""
    session = preload_env(MKL, False, {}, {"PATH": "/bin"})
    assert preload_env(MKL, False, THREADS, session) == {**session, **THREADS}


def test_a_blas_already_preloaded_is_kept_and_only_missing_threads_are_set():
    user = {"LD_PRELOAD": f"/lib/other.so:{MKL}"}
    assert preload_env(MKL, False, {}, user) is None
    env = preload_env(MKL, False, THREADS, user)
    assert env["LD_PRELOAD"] == f"/lib/other.so:{MKL}" and env["MKL_NUM_THREADS"] == "1"


def test_no_blas_found_sets_the_threads_only():
    assert preload_env("", False, {}, {}) is None
    assert preload_env("", False, THREADS, {}) == THREADS
