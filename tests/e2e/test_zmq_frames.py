"""Malformed ZeroMQ frames (issue 14, hostile input): every bound PULL socket of a running
server (scheduler inbox, scheduler results, scheduler control, worker inbox, tokenizer
inbox, detokenizer inbox, launch control) gets garbage, truncated, wrong-type and multipart
frames, each dropped with a logged error, and an oversized frame, which ZeroMQ drops
(`protocol.sockets.MAX_FRAME_BYTES`) by closing the sender's connection; every process
keeps running and the server still answers. A peer speaking another protocol version is
refused at its handshake, by the scheduler (an attaching replica) and by launch (a child).
The session's server on the tiny random model serves the module."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import msgspec
import pytest
import structlog
import zmq
from zmq.utils.monitor import recv_monitor_message

from launcher.supervisor import Child, Launcher
from protocol import PROTOCOL_VERSION, codec, endpoints
from protocol.config import ModelSource, ServerArgs
from protocol.enums import Role
from protocol.messages import (
    AbortReq,
    DeliveredQuery,
    Hello,
    LaunchResult,
    Ready,
    ReplicaRefused,
    SchedulerShutdown,
    WorkerAbort,
    WorkerShutdown,
)
from protocol.sockets import MAX_FRAME_BYTES
from tests.support.launcher import Server, alive, stop_and_check


@pytest.fixture(scope="module")
def server(tiny_server) -> Server:
    """The session's tiny-model server (frames only make it log; conftest checks its clean exit)."""
    return tiny_server


@pytest.fixture(scope="module")
def run_dir(server) -> Path:
    """The run directory launch printed at start-up."""
    return Path(re.search(r"run dir (\S+)\)", server.log()).group(1))


SOCKETS = {
    # name: (endpoint, a message of its channel, a valid message of another channel, the process's log line)
    "scheduler": (endpoints.scheduler, AbortReq("no-such-rid"), WorkerShutdown(), "bad message on scheduler inbox"),
    "worker-results": (
        endpoints.worker_results,
        LaunchResult(-1, [], []),
        SchedulerShutdown(),
        "bad message on scheduler results socket",
    ),
    "scheduler-control": (
        endpoints.scheduler_control,
        Ready(Role.DETOKENIZER, 9),
        SchedulerShutdown(),
        "bad message on scheduler control socket",
    ),
    "worker": (endpoints.worker, WorkerAbort(["no-such-rid"]), SchedulerShutdown(), "bad message on worker inbox"),
    "tokenizer": (
        endpoints.tokenizer,
        DeliveredQuery(["no-such-rid"]),
        SchedulerShutdown(),
        "bad message on tokenizer inbox",
    ),
    "detokenizer": (
        lambda rd: endpoints.detokenizer(rd, 0),
        ReplicaRefused("x"),
        SchedulerShutdown(),
        "bad message on detokenizer inbox",
    ),
    "launch-control": (
        endpoints.control,
        Ready(Role.DETOKENIZER, 9),
        SchedulerShutdown(),
        "bad message on the control socket",
    ),
}
JUNK = random.Random(14).randbytes(64 * 1024 * 1024)
"""64 MiB of junk (under the frame limit: read, then refused by the decoder)."""


def bad_frames(sample, other) -> list[bytes]:
    """Frames that are not a message of `sample`'s channel (`other`: another channel's)."""
    enc = msgspec.msgpack.encode
    valid = codec.encoder.encode(sample)
    return [
        b"",
        b"\xc1",
        JUNK[:4096],
        JUNK,
        b"\xdd\xff\xff\xff\xff",  # an array header announcing 2**32 - 1 items, then nothing
        b"\xdb\xff\xff\xff\xff" + b"a" * 100,  # a 4 GiB string header
        valid[: len(valid) // 2],
        valid + b"\x00",  # truncated; trailing byte
        enc(42),
        enc([1, 2, 3]),
        enc({"rid": "x"}),
        enc([type(sample).__name__, 5, 5, 5]),  # wrong types
        codec.encoder.encode(other),
    ]


def request_ok(url: str) -> None:
    r = httpx.post(
        f"{url}/v1/completions",
        json={"prompt": "Hello", "max_tokens": 4, "temperature": 0, "ignore_eos": True},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4, r.text
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200


def wait_logged(server: Server, line: str, count: int, timeout: float = 60.0) -> str:
    """Send requests until `line` is `count` times in the server's log (the scheduler reads
    its results socket only while it waits for a launch's result); returns the log."""
    deadline = time.monotonic() + timeout
    while True:
        request_ok(server.base_url)
        if (log := server.log()).count(line) >= count:
            return log
        assert time.monotonic() < deadline, f"{line!r} not {count}x in the log:\n{log[-3000:]}"


def push(endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 5000)
    sock.connect(endpoint)
    return sock


@pytest.mark.parametrize("name", list(SOCKETS))
def test_bad_frames_are_dropped_and_logged(server, run_dir, name):
    endpoint, sample, other, line = SOCKETS[name]
    frames = bad_frames(sample, other)
    multipart = [b"\xc1", codec.encoder.encode(other), b"junk"]
    start = len(server.log())
    before = server.log().count(line)
    sock = push(endpoint(run_dir))
    for frame in frames:
        sock.send(frame, copy=False)
    sock.send_multipart(multipart)
    sock.close()  # lingers until delivered
    log = wait_logged(server, line, before + len(frames) + len(multipart))
    assert all(alive(p) for p in server.children), log[-3000:]
    assert "Traceback" not in log[start:], log[start:][-3000:]


def test_a_result_for_another_launch_is_dropped(server, run_dir):
    """A well-formed `LaunchResult` the scheduler is not waiting for (once a RuntimeError
    that stopped the server) is logged and dropped."""
    line = "dropped an unexpected message while waiting for a launch's result"
    before = server.log().count(line)
    sock = push(endpoints.worker_results(run_dir))
    sock.send(codec.encoder.encode(LaunchResult(-7, ["ghost"], [3])))
    sock.close()
    log = wait_logged(server, line, before + 1)
    assert "launch_id=" in log.split(line)[-1].splitlines()[0]
    assert all(alive(p) for p in server.children)


@pytest.mark.parametrize("name", list(SOCKETS))
def test_oversized_frame_is_dropped_by_zeromq(server, run_dir, name):
    """A frame over MAX_FRAME_BYTES: the receiving side closes the connection after reading
    the frame's size (the sender sees it disconnected), logs the closed link with its
    endpoint, and goes on."""
    endpoint = SOCKETS[name][0](run_dir)
    line = f"endpoint={endpoint} note='a peer that exited"  # the closed-link line (console format)
    before = server.log().count(line)
    sock = push(endpoint)
    monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    sock.send(memoryview(bytearray(MAX_FRAME_BYTES + 1)), copy=False)
    assert monitor.poll(10_000), "the receiver kept the connection of an oversized frame"
    assert recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
    sock.disable_monitor()
    monitor.close()
    sock.close(linger=0)
    server.wait_log(line, before + 1)
    request_ok(server.base_url)
    assert all(alive(p) for p in server.children)


CLOSED = "peer connection closed"


def close_a_link(endpoint: str) -> None:
    """Connect to `endpoint`, wait until ZeroMQ's handshake is done, and close the link: a
    disconnect its bound socket sees (and logs) after everything it saw before."""
    sock = zmq.Context.instance().socket(zmq.PUSH)
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    sock.connect(endpoint)
    try:
        assert monitor.poll(10_000), f"no handshake with {endpoint}"
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
    finally:
        sock.disable_monitor()
        monitor.close()
        sock.close(linger=0)


def test_a_start_closes_no_link_and_a_disconnect_after_it_is_logged(tiny_model_dir, tmp_path):
    """A start logs no closed link: each child closed its start-up handshake link once ready
    and launch sent ServerReady on a link of its own, one "peer connection closed" line each
    at every start although nothing was wrong. A real disconnect after the start is still
    logged: one link closed on each bound socket gives exactly one line per endpoint (the
    socket's monitor reports in order, so any closed link before it would show)."""
    server = Server(["--model", str(tiny_model_dir), "--detokenizers", "1"], tmp_path / "log.txt")
    try:
        run_dir = Path(re.search(r"run dir (\S+)\)", server.log()).group(1))
        request_ok(server.base_url)
        for endpoint, *_ in SOCKETS.values():
            close_a_link(endpoint(run_dir))
        for endpoint, *_ in SOCKETS.values():
            server.wait_log(f"endpoint={endpoint(run_dir)} note='a peer that exited")
        lines = [line for line in server.log().splitlines() if CLOSED in line]
        assert sorted(re.search(r"endpoint=(\S+)", line).group(1) for line in lines) == sorted(
            endpoint(run_dir) for endpoint, *_ in SOCKETS.values()
        ), "\n".join(lines)
    finally:
        stop_and_check(server)


def test_scheduler_refuses_a_replica_of_another_protocol_version(server, run_dir):
    """The Hello of an attaching replica (index -1) that speaks protocol 99 is answered with
    `ReplicaRefused` on the replica's endpoint, and the replica is not registered."""
    pid = 4_000_000 + os.getpid() % 100_000  # a pid no process has: the scheduler only uses it in names
    inbox = zmq.Context.instance().socket(zmq.PULL)
    inbox.bind(endpoints.attached_detokenizer(run_dir, pid))
    try:
        sock = push(endpoints.scheduler_control(run_dir))
        sock.send(codec.encoder.encode(Hello(Role.DETOKENIZER, -1, pid, PROTOCOL_VERSION + 96)))
        sock.close()
        assert inbox.poll(10_000), "no answer to the Hello"
        msg = codec.to_detokenizer.decode(inbox.recv())
    finally:
        inbox.close(linger=0)
    assert isinstance(msg, ReplicaRefused)
    assert f"speaks protocol {PROTOCOL_VERSION + 96}, the server speaks {PROTOCOL_VERSION}" in msg.message
    replicas = httpx.get(f"{server.base_url}/v1/internal/detokenizers", timeout=10).json()["replicas"]
    assert pid not in [r["pid"] for r in replicas]
    request_ok(server.base_url)


def test_launch_refuses_a_child_of_another_protocol_version(tmp_path):
    """Launch's start-up handshake: garbage on its control socket is logged and skipped; a
    Hello in another protocol version stops the start with an error naming both versions."""
    args = ServerArgs(
        model=ModelSource("hf", str(tmp_path), "m"), run_dir=str(endpoints.make_run_dir(str(tmp_path / "run")))
    )
    launcher = Launcher(args, structlog.get_logger())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        launcher.children.append(Child(Role.WORKER, 0, "worker", child))
        sock = push(endpoints.control(args.run_dir))
        sock.send(b"\xc1garbage")
        sock.send(codec.encoder.encode(Hello(Role.WORKER, 0, child.pid, PROTOCOL_VERSION + 1)))
        sock.close()
        started = time.monotonic()
        with pytest.raises(
            RuntimeError, match=f"worker speaks protocol {PROTOCOL_VERSION + 1}, launch speaks {PROTOCOL_VERSION}"
        ):
            launcher.wait_ready()
        assert time.monotonic() - started < 10
    finally:
        child.kill()
        child.wait()
        launcher.control.close(linger=0)
