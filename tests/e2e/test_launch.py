"""Start-up failures, supervision and shutdown of `launch.py` (as a user runs it, a
subprocess). Flags, model files and the tokenizer checked in this process:
tests/unit/test_launch.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time

import httpx
import pytest

from tests.support.launcher import ROOT, Server, child_pids, free_port, left_alive, run_launch


def test_missing_model_path_is_a_clear_error(tmp_path):
    missing = tmp_path / "nope.gguf"
    r = run_launch(["--model", str(missing)])
    assert r.returncode == 2
    assert (
        f"model path does not exist: {missing} (--model takes a .gguf llama file or an MLX/HF model directory, "
        "config.json + safetensors, on this machine)"
    ) in r.stderr


def test_not_a_gguf_file(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"hello world")
    r = run_launch(["--model", str(bad)])
    assert r.returncode == 2
    assert f"{bad} is not a GGUF file" in r.stderr


def test_corrupt_gguf_fails_startup_naming_the_file(tmp_path):
    bad = tmp_path / "corrupt.gguf"
    bad.write_bytes(b"GGUF" + b"\x00\x01" * 50)
    t0 = time.monotonic()
    r = run_launch(["--model", str(bad)])
    assert r.returncode == 1
    assert "failed to start" in r.stderr and str(bad) in r.stderr
    assert time.monotonic() - t0 < 60


def _failure_line(stderr: str) -> str:
    """launch's own line saying why the start failed."""
    lines = [
        ln
        for ln in stderr.splitlines()
        if "proc=launch" in ln and ("start-up failed" in ln or "cannot load model" in ln)
    ]
    assert len(lines) == 1, stderr[-3000:]
    return lines[0]


@pytest.mark.parametrize("damage", ["truncated weights", "config not json", "truncated gguf"])
def test_a_corrupt_model_file_fails_startup_naming_it(damage, tmp_path, tiny_model_dir, default_source):
    """Issue 2: a corrupt file is a clear start-up error naming the file. A truncated
    safetensors file failed with mlx's "[load_safetensors] The JSON header is ... bytes long
    but the file is only ... bytes", a config.json cut short with "JSONDecodeError: Expecting
    property name ...", a truncated GGUF with the tokenizer's "error: unpack_from requires a
    buffer of at least ..." (whichever child failed first), none saying which file."""
    d = tmp_path / "model"
    if damage == "truncated gguf":
        bad = named = tmp_path / "cut.gguf"
        bad.write_bytes(open(default_source.path, "rb").read(100_000))
    else:
        shutil.copytree(tiny_model_dir, d)
        name = "model.safetensors" if damage == "truncated weights" else "config.json"
        named = d / name if damage == "config not json" else d
        (d / name).write_bytes((d / name).read_bytes()[: 1000 if name == "model.safetensors" else 20])
        bad = d
    r = run_launch(["--model", str(bad)])
    line = _failure_line(r.stderr)
    assert str(named) in line, line
    assert r.returncode == (2 if damage == "config not json" else 1)
    assert "did not stop" not in r.stderr, r.stderr[-2000:]


def test_unknown_architecture(tmp_path, tiny_model_dir):
    d = tmp_path / "weird"
    shutil.copytree(tiny_model_dir, d)
    config = json.loads((d / "config.json").read_text())
    config["model_type"] = "no_such_arch"
    (d / "config.json").write_text(json.dumps(config))
    r = run_launch(["--model", str(d)])
    assert r.returncode == 1
    assert "no_such_arch" in r.stderr and "not supported" in r.stderr
    assert "did not stop" not in r.stderr, r.stderr[-2000:]  # every child left on SIGTERM, none was killed


def test_port_in_use(tiny_model_dir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = subprocess.run(
            [sys.executable, str(ROOT / "launch.py"), "--model", str(tiny_model_dir), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=str(ROOT),
        )
    assert r.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize(
    "host, says",
    [
        ("192.0.2.1", "Cannot assign requested address (no address of 192.0.2.1 is on this host)"),  # TEST-NET-1
        ("no-such-host.invalid", "no-such-host.invalid does not resolve ("),
    ],
)
def test_a_host_launch_cannot_listen_on_fails_at_once_saying_why(host, says, tiny_model_dir):
    """An address not on this host, or a name that does not resolve, fails the start before any
    process is spawned, with the reason. They passed launch's busy-port check and failed ~20 s
    later, once the HTTP front had loaded the tokenizer, with 'tokenizer failed to start:
    OSError: could not listen on 192.0.2.1:PORT' and no reason (uvicorn printed it apart)."""
    port = free_port()
    r = subprocess.run(
        [sys.executable, str(ROOT / "launch.py"), "--model", str(tiny_model_dir), "--host", host, "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(ROOT),
    )
    assert r.returncode == 1
    line = _failure_line(r.stderr)
    assert f"error='cannot listen on {host}:{port}: {says}" in line, line
    assert "failed to start" not in r.stderr and "starting" not in r.stderr  # nothing was spawned


@pytest.mark.parametrize("model, limit", [("tiny", 2048), ("default", 8192)])
def test_a_context_length_longer_than_the_models_fails_startup(model, limit, tiny_model_dir):
    """--context-length above the model's limit (config.json's max_position_embeddings, 2048
    in the tiny model; the default GGUF's llama.context_length, 8192) would serve positions
    the model never saw; vLLM and SGLang refuse it at start-up, and so does launch, among its
    argument checks: exit 2 before any process starts, in about a second. It failed with exit 1
    only once the HTTP front had loaded the tokenizer (~24 s)."""
    t0 = time.monotonic()
    r = run_launch([*(["--model", str(tiny_model_dir)] if model == "tiny" else []), "--context-length", str(limit + 1)])
    assert r.returncode == 2, r.stderr[-2000:]
    line = _failure_line(r.stderr)
    assert f"--context-length {limit + 1} is longer than the {limit} tokens this model supports" in line, line
    assert f"use at most {limit}" in line
    assert "starting" not in r.stderr  # nothing was spawned
    assert time.monotonic() - t0 < 10


@pytest.mark.parametrize(
    "flags,says",
    [
        (["--detokenizers", "0"], "--detokenizers must be at least 1"),
        (["--context-length", "1"], "--context-length must be at least 2 (a prompt token and a generated one)"),
        (
            ["--enable-mamba-extra-buffer", "--disable-radix-cache"],
            "--enable-mamba-extra-buffer needs the prefix cache",
        ),
        (["--mamba-cache-chunk-size", "-1"], "--mamba-cache-chunk-size must be 0"),
        (
            ["--mamba-cache-chunk-size", "64", "--disable-radix-cache"],
            "--mamba-cache-chunk-size needs the prefix cache",
        ),
    ],
)
def test_bad_flags(flags, says):
    r = run_launch(flags)
    assert r.returncode == 2 and says in r.stderr


@pytest.mark.parametrize("flags", [["--enable-mamba-extra-buffer"], ["--mamba-cache-chunk-size", "64"]])
def test_a_recurrent_state_flag_on_a_model_without_recurrent_layers_fails_startup(flags, tiny_model_dir):
    """DESIGN.md §4: a flag the model cannot honour is refused at start-up with the flag's
    name, never ignored (the worker logged that the extra buffer had nothing to do, and took
    --mamba-cache-chunk-size silently)."""
    r = run_launch(["--model", str(tiny_model_dir), *flags])
    assert r.returncode == 1
    line = _failure_line(r.stderr)
    assert (
        f"{flags[0]} is for models with recurrent or sliding-window layers; architecture 'llama' has none "
        f"(its layers keep full attention KV only): leave {flags[0]} out"
    ) in line, line
    assert "did not stop" not in r.stderr, r.stderr[-2000:]


def test_a_bad_run_dir_is_a_clear_error(tiny_model_dir, tmp_path):
    """A --run-dir that cannot be used ended launch with a Python traceback (or, for a shared
    directory, made it private); it is now exit 2 naming the flag and why, before any
    process starts."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    (shared / "notes.txt").write_text("mine")
    os.chmod(shared, 0o755)
    (tmp_path / "afile").write_text("")
    for run_dir, says in [
        (shared, "holds files lazyserve did not write (notes.txt)"),
        (tmp_path / "afile", "exists and is not a directory"),
        (tmp_path / ("d" * 100), "too long for its ipc:// sockets"),
    ]:
        r = run_launch(["--model", str(tiny_model_dir), "--run-dir", str(run_dir)])
        assert r.returncode == 2, r.stderr[-2000:]
        assert f"--run-dir: the run directory {run_dir}" in r.stderr and says in r.stderr
        assert "Traceback" not in r.stderr
    assert stat.S_IMODE(shared.stat().st_mode) == 0o755
    assert not (tmp_path / ("d" * 100)).exists()


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    """A tiny-model server with its own run directory (``server.run_dir``), 4 requests of 512
    tokens at most; the SIGINT test stops it (the warm-up test reads only its start-up log)."""
    run_dir = tmp_path_factory.mktemp("launch") / "run"
    server = Server(
        [
            "--model",
            str(tiny_model_dir),
            "--run-dir",
            str(run_dir),
            "--max-running-requests",
            "4",
            "--context-length",
            "512",
        ],
        tmp_path_factory.mktemp("logs") / "launch.log",
    )
    server.run_dir = run_dir
    yield server
    server.stop()


def test_sigint_stops_everything_and_removes_run_dir(server):
    """Every process logs its stop, the HTTP front too: uvicorn raised the SIGTERM it had
    caught again once it had shut down, which killed the tokenizer process before its clean-up
    and its ``tokenizer stopped`` line."""
    run_dir = server.run_dir
    titles = sorted(open(f"/proc/{p}/cmdline", "rb").read().split(b"\0")[0].decode() for p in server.children)
    assert titles == ["lazyserve::detokenizer-0", "lazyserve::scheduler", "lazyserve::tokenizer", "lazyserve::worker"]
    assert (run_dir.stat().st_mode & 0o777) == 0o700
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    server.proc.send_signal(signal.SIGINT)
    assert server.proc.wait(30) == 0
    stopped = [line.split() for line in server.log().splitlines() if " stopped " in line]
    assert sorted((words[3], words[-1]) for words in stopped) == [
        ("detokenizer", "proc=detokenizer-0"),
        ("scheduler", "proc=scheduler"),
        ("stopped", "proc=launch"),
        ("tokenizer", "proc=tokenizer"),
        ("worker", "proc=worker"),
    ], stopped
    assert not left_alive(server.children)
    assert not run_dir.exists()
    assert child_pids(server.proc.pid) == []


def test_worker_warms_up_and_sizes_the_pool_from_the_model_before_ready(server):
    """The worker's warm-up ends before `lazyserve ready`; with memory to spare the KV pool is
    what the model can use: max running requests x context length, and the log says so."""
    log = server.wait_log("lazyserve ready")
    assert 0 <= log.index("warm-up done") < log.index("lazyserve ready")
    pool = next(line for line in log.splitlines() if "KV pool" in line and "proc=worker" in line)
    assert "tokens=2048 " in pool and "bound=model" in pool and "memory_source='host MemAvailable'" in pool
    assert "4 requests x 512 tokens of context = 2048 tokens" in pool
    assert "allocation='1 segment(s) of up to 4096 tokens" in pool and "full_bytes=" in pool
    assert "kv_pool_tokens=2048 " in log and "kv_pool_bound=model" in log
    device = next(line for line in log.splitlines() if "proc=worker" in line and "] device" in line)
    assert "device='Device(cpu, 0)'" in device or "device=Device(cpu, 0)" in device
