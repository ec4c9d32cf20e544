"""Tensor parallel over several hosts (issue 12) without a server: the hostfile flags and
formats, malformed hostfiles, the rank usage of ``python -m worker_proc``, the rank links
(a rank sees rank 0 go, rank 0 names the rank whose link closed, attaching to a restarted
rank 0, stale attaches) and a rank whose hostfile gives another ring than rank 0's. Two
"hosts" in network namespaces: tests/e2e/test_tp_hosts.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from tests.support.hostfiles import hosts_json
from tests.support.launcher import ROOT
from worker_proc.tp.link import read_key, write_key
from worker_proc.tp.setup import DEFAULT_STARTING_PORT, free_ports, ranks_on_host, read_hostfile


# --------------------------------------------------------------------------- flags
def test_hostfile_flags(tmp_path, capsys):
    """--tp defaults to the hostfile's ranks, rank 0 waits at its ring port + 1, the key file
    defaults to HOSTFILE.key; a malformed hostfile, a --tp that differs, a wildcard
    --dist-init-addr and --dist-key-file without --hostfile are refused naming the problem."""
    from launcher.args import parse_args

    hostfile = tmp_path / "hosts.json"
    hostfile.write_text('[["10.0.0.1:5000"], ["10.0.0.2:5000"], ["10.0.0.2:5001"]]')
    ns = parse_args(["--hostfile", str(hostfile)])
    assert (ns.tp, ns.dist_init_addr, ns.dist_key_file) == (3, "10.0.0.1:5001", f"{hostfile}.key")
    assert [ranks_on_host(ns.dist_ring, r) for r in range(3)] == [1, 2, 2]  # they split their host's memory
    bad = tmp_path / "bad.json"
    bad.write_text('[["10.0.0.1:5000"]]')
    for argv, error in [
        (["--hostfile", str(bad)], "names 1 rank; tensor parallel over several hosts wants at least 2"),
        (["--hostfile", str(hostfile), "--tp", "2"], "--tp 2 but the hostfile names 3 ranks"),
        (
            ["--hostfile", str(hostfile), "--dist-init-addr", "0.0.0.0:7000"],
            "give the address of one interface, not a wildcard",
        ),
        (["--dist-key-file", "k"], "--dist-init-addr, --dist-key-file and --starting-port go with --hostfile"),
        (["--starting-port", "5000"], "--starting-port go with --hostfile"),
    ]:
        with pytest.raises(SystemExit):
            parse_args(argv)
        assert error in capsys.readouterr().err, argv


def test_both_hostfile_formats_give_the_same_ring(tmp_path):
    """The host list users write for mlx.launch and the ring mlx.launch writes from it name
    the same ring: the host list's ports count up from --starting-port (mlx.launch's default
    32323) by one per ip over all ranks; launch then gets the same --tp, ring, rank 0 wait
    address (the first port after rank 0's that no ring address on its ip takes: with two
    ranks on one ip, not rank 1's ring port) and per-host rank counts from either file."""
    from launcher.args import parse_args

    hosts, ring, obj = tmp_path / "hosts.json", tmp_path / "ring.json", tmp_path / "obj.json"
    hosts.write_text(hosts_json(["10.0.0.1"], ["10.0.0.2", "10.1.0.2"], ["10.0.0.1"]))
    ring.write_text('[["10.0.0.1:5000"], ["10.0.0.2:5001", "10.1.0.2:5002"], ["10.0.0.1:5003"]]')
    obj.write_text(json.dumps({"backend": "ring", "envs": [], "hosts": json.loads(hosts.read_text())}))
    assert read_hostfile(hosts, 5000) == read_hostfile(ring) == read_hostfile(obj, 5000) == json.loads(ring.read_text())
    assert read_hostfile(hosts) == [["10.0.0.1:32323"], ["10.0.0.2:32324", "10.1.0.2:32325"], ["10.0.0.1:32326"]]
    assert DEFAULT_STARTING_PORT == 32323
    got = [parse_args(["--hostfile", str(hosts), "--starting-port", "5000"]), parse_args(["--hostfile", str(ring)])]
    for ns in got:
        assert (ns.tp, ns.dist_ring, ns.dist_init_addr) == (3, json.loads(ring.read_text()), "10.0.0.1:5001")
        assert [ranks_on_host(ns.dist_ring, r) for r in range(3)] == [2, 1, 2]
    loopback = tmp_path / "loopback.json"
    loopback.write_text(hosts_json(["127.0.0.1"], ["127.0.0.1"]))
    assert parse_args(["--hostfile", str(loopback)]).dist_init_addr == "127.0.0.1:32325"


BAD_HOSTFILES = [  # (content, extra flags, what the error says)
    ("[]", [], "want a list with one entry per rank (at least 2)"),
    ("{}", [], 'an object without "hosts"'),
    ("not json", [], "not JSON"),
    (hosts_json(["10.0.0.1"]), [], "names 1 rank"),
    ('[{"ssh": "a", "ips": ["10.0.0.1"]}, {"ips": ["10.0.0.2"]}]', [], 'host 1: want "ssh"'),
    ('[{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b"}]', [], 'host 1 (b): want "ips", a non-empty list'),
    ('[{"ssh": "a", "ips": ["10.0.0.1"]}, {"ssh": "b", "ips": []}]', [], 'host 1 (b): want "ips"'),
    (
        '[{"ssh": "a", "ips": [10]}, {"ssh": "b", "ips": ["10.0.0.2"]}]',
        [],
        "host 0 (a): ips[0] is 10, not an IP address string",
    ),
    (
        '[{"ssh": "a", "ips": ["10.0.0.1:5000"]}, {"ssh": "b", "ips": ["10.0.0.2"]}]',
        [],
        "ips[0] '10.0.0.1:5000' has a port",
    ),
    (
        '[{"ssh": "a", "ips": ["10.0.0.1", "10.0.0.1"]}, {"ssh": "b", "ips": ["10.0.0.2"]}]',
        [],
        "host 0 (a): ip '10.0.0.1' is listed twice",
    ),
    ('[{"ssh": "a", "ip": ["10.0.0.1"]}, {"ssh": "b", "ips": ["10.0.0.2"]}]', [], "host 0: unknown key 'ip'"),
    ('[{"ssh": "a", "ips": ["10.0.0.1"]}, ["10.0.0.2:5000"]]', [], "entries of type dict, list"),
    ('{"backend": "jaccl", "hosts": []}', [], "\"backend\" 'jaccl' is not supported"),
    ('{"envs": ["A=1"], "hosts": []}', [], '"envs" is not supported'),
    (hosts_json(["10.0.0.1"], ["10.0.0.2"]), ["--starting-port", "65535"], "take the ports 65535..65536, past 65535"),
    ('[["10.0.0.1:5000"], ["10.0.0.1:5000"]]', [], "'10.0.0.1:5000' is given to rank 0 and to rank 1"),
    ('[["10.0.0.1:5000"], ["10.0.0.2"]]', [], "rank 1: '10.0.0.2' is not ip:port"),
    ('[["10.0.0.1:5000"], [5000]]', [], 'rank 1: want a non-empty list of "ip:port" strings'),
    (
        '[["10.0.0.1:5000"], ["10.0.0.2:5000"]]',
        ["--starting-port", "6000"],
        "--starting-port 6000 goes with a hostfile listing hosts",
    ),
]


@pytest.mark.parametrize("content,flags,error", BAD_HOSTFILES)
def test_malformed_hostfiles_are_refused_naming_the_fault(tmp_path, capsys, content, flags, error):
    """launch and a rank started by hand (the one shared parser) both exit 2 with the
    hostfile's path and what is wrong with it, before starting anything."""
    from launcher.args import parse_args
    from worker_proc.proc import main_attached

    bad = tmp_path / "bad.json"
    bad.write_text(content)
    for run in (
        lambda: parse_args(["--hostfile", str(bad), *flags]),
        lambda: main_attached(
            ["--rank", "1", "--hostfile", str(bad), *flags, "--attach", "10.0.0.1:1", "--dist-key-file", "k"]
        ),
    ):
        with pytest.raises(SystemExit) as e:
            run()
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"--hostfile: hostfile {bad}: " in err and error in err, err


@pytest.mark.parametrize(
    "argv,code,out",
    [
        (["-h"], 0, "usage: python -m worker_proc [-h] --rank RANK --hostfile HOSTFILE"),
        ([], 2, "the following arguments are required: --rank, --hostfile, --attach, --dist-key-file"),
    ],
)
def test_worker_proc_without_a_run_dir_shows_the_rank_usage(argv, code, out):
    """``python -m worker_proc -h`` (or no argument) is the usage of a rank started by hand, not
    a traceback about a run directory named ``-h`` (or an IndexError)."""
    r = subprocess.run(
        [sys.executable, "-m", "worker_proc", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == code and out in r.stdout + r.stderr and "Traceback" not in r.stderr, r.stderr


@dataclass
class Link:
    """What an in-process test of `worker_proc.tp.link` needs: a key file, a free loopback
    address for rank 0, and a ZeroMQ context (destroyed after the test)."""

    key: Path
    addr: str
    ctx: zmq.Context

    @staticmethod
    def args(tp: int):
        """The `ServerArgs` rank 0 hands to the ranks of a `tp`-rank group."""
        from protocol.config import ModelSource, ServerArgs

        return ServerArgs(model=ModelSource("hf", "/m", "m"), run_dir="/r", tp=tp)


@pytest.fixture
def link(tmp_path):
    """A `Link` for one in-process test."""
    ctx = zmq.Context()
    yield Link(write_key(tmp_path / "k"), f"127.0.0.1:{free_ports(1)[0]}", ctx)
    ctx.destroy(linger=0)


def test_a_rank_sees_rank_0_go(link):
    """In-process: a rank attached to a `RankServer` gets the args, the forwarded frames in
    order, and `watch_link` calls back once rank 0's socket closes (what makes a rank
    started by hand exit instead of waiting for a dead group)."""
    from worker_proc.tp.link import RankServer, watch_link

    args, lost = link.args(2), threading.Event()
    server = RankServer(link.ctx, link.addr, str(link.key))
    t, got = attach_in_thread(link.ctx, link.addr, link.key, 1, 10)
    server.wait_ranks(range(1, 2), args, 10)
    t.join()
    sock, their_args = got["link"]
    assert their_args == args
    watch_link(sock, lost.set)
    for frame in (b"one", b"two"):
        server.send(frame)
    assert [sock.recv() for _ in range(2)] == [b"one", b"two"]
    assert not lost.wait(0.3)
    server.close()
    assert lost.wait(10), "the rank did not see rank 0 go"


def attach_in_thread(ctx, addr: str, key, rank: int, timeout_s: float) -> tuple[threading.Thread, dict]:
    """Run `tp.link.attach` in a thread; returns (the thread, a dict that gets ``link`` (its
    result) or ``error`` (the exception))."""
    from worker_proc.tp.link import attach

    out: dict = {}

    def run() -> None:
        try:
            out["link"] = attach(ctx, addr, str(key), rank, timeout_s)
        except (RuntimeError, TimeoutError) as e:
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_rank_0_names_the_rank_whose_link_closed(link):
    """In-process: two ranks attach to a `RankServer`; a third holding the key comes after the
    group formed and is refused at once, naming why (`refuse_late`, which the serving rank 0
    calls on every inbox poll); `RankServer.watch` reports nothing for it, and reports rank 2,
    only rank 2, when rank 2's socket closes."""
    from worker_proc.tp.link import RankServer

    lost: list[int] = []
    server = RankServer(link.ctx, link.addr, str(link.key))
    ranks = [attach_in_thread(link.ctx, link.addr, link.key, r, 10) for r in (1, 2)]
    server.wait_ranks(range(1, 3), link.args(3), 10)
    for t, _ in ranks:
        t.join()
    server.watch(lost.append)
    late, out = attach_in_thread(link.ctx, link.addr, link.key, 1, 10)
    while late.is_alive():
        server.refuse_late()
        late.join(0.01)
    assert "every rank of this group is attached" in str(out["error"]), out
    ranks[1][1]["link"][0].close(linger=0)
    deadline = time.monotonic() + 10
    while not lost:
        assert time.monotonic() < deadline, "rank 0 did not see rank 2 go"
        time.sleep(0.01)
    server.close()
    assert lost == [2]


def test_a_rank_attaches_to_a_restarted_rank_0_and_a_wrong_key_fails_fast(link, tmp_path):
    """In-process: a rank whose Attach reached a rank 0 that never answered (it was serving)
    sends it again on its next connection, so it attaches to the rank 0 started next at the
    same address; a rank with another key is told so at once, not after the attach timeout."""
    from worker_proc.tp.link import RankServer, attach

    args = link.args(2)
    first_ctx = zmq.Context()  # a rank 0 of its own: its ZAP handler's inproc address is freed with it
    try:
        first = RankServer(first_ctx, link.addr, str(link.key))
        rank, out = attach_in_thread(link.ctx, link.addr, link.key, 1, 30)
        deadline = time.monotonic() + 10
        while not first.sock.poll(10):  # its Attach arrived; this rank 0 does not answer it
            assert time.monotonic() < deadline, "no Attach reached the first rank 0"
        first.close()
    finally:
        first_ctx.destroy(linger=0)
    second = RankServer(link.ctx, link.addr, str(link.key))
    second.wait_ranks(range(1, 2), args, 20)
    rank.join(10)
    assert out["link"][1] == args
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="refused this rank's CURVE key"):
        attach(link.ctx, link.addr, str(write_key(tmp_path / "other")), 1, 30)
    assert time.monotonic() - t0 < 10
    second.close()


def test_a_stale_attach_is_dropped_and_a_send_to_a_gone_rank_reports_it(link):
    """In-process, a peer holding the key: an `Attach` naming a connection that is not open
    here (what a rank's Attach queued for a rank 0 that exited mid-handshake looks like when it
    arrives over the next connection) is dropped, and the one naming its real connection is
    taken; so when that connection closes, `RankServer.send` reports the rank to the `watch`
    callback once, instead of raising, whichever of it and the monitor thread sees it first."""
    from protocol import PROTOCOL_VERSION
    from worker_proc.tp.link import Attach, RankServer, Welcome

    public, secret = read_key(link.key)
    args, lost = link.args(2), []
    server = RankServer(link.ctx, link.addr, str(link.key))
    rank = link.ctx.socket(zmq.DEALER)
    rank.curve_serverkey, rank.curve_publickey, rank.curve_secretkey = public, public, secret
    mon = rank.get_monitor_socket(zmq.EVENT_CONNECTED)
    rank.connect(f"tcp://{link.addr}")
    with socket.socket(fileno=os.dup(int(recv_monitor_message(mon)["value"]))) as conn:
        port = conn.getsockname()[1]
    rank.send(msgspec.json.encode(Attach(1, PROTOCOL_VERSION, free_ports(1)[0])))  # a port of no open connection
    rank.send(msgspec.json.encode(Attach(1, PROTOCOL_VERSION, port)))
    server.wait_ranks(range(1, 2), args, 10)
    assert rank.poll(5000)
    assert msgspec.json.decode(rank.recv(), type=Welcome).args == args
    assert not rank.poll(100), "the stale Attach was answered too"
    server.watch(lost.append)
    rank.close(linger=0)
    deadline = time.monotonic() + 10
    while not lost:
        assert time.monotonic() < deadline, "rank 0 did not see rank 1 go"
        server.send(b"frame")
    server.send(b"frame")
    assert lost == [1]
    server.close()
    mon.close(linger=0)


def test_a_rank_whose_hostfile_gives_another_ring_than_rank_0s_exits_naming_both(link, tmp_path):
    """A rank started by hand with the same host list but another --starting-port than rank
    0's would wait forever in a ring that never closes: it exits 1 once attached, naming rank
    0's ring and its own."""
    from msgspec.structs import replace

    from worker_proc.tp.link import RankServer

    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(hosts_json(["10.0.0.1"], ["10.0.0.2"]))
    server = RankServer(link.ctx, link.addr, str(link.key))
    try:
        rank = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "worker_proc",
                "--rank",
                "1",
                "--hostfile",
                str(hostfile),
                "--starting-port",
                "6000",
                "--attach",
                link.addr,
                "--dist-key-file",
                str(link.key),
            ],
            cwd=str(ROOT),
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            stderr=subprocess.PIPE,
            text=True,
        )
        server.wait_ranks(range(1, 2), replace(link.args(2), dist_ring=read_hostfile(hostfile)), 60)
        _, err = rank.communicate(timeout=60)
    finally:
        server.close()
    assert rank.returncode == 1, err
    assert (
        "rank 0's ring is [['10.0.0.1:32323'], ['10.0.0.2:32324']], the hostfile "
        f"{hostfile} gives [['10.0.0.1:6000'], ['10.0.0.2:6001']] here with --starting-port 6000"
    ) in err, err
