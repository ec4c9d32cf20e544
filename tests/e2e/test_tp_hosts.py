"""Tensor parallel over two "hosts" (issue 12): two network namespaces' worth of addresses
joined by a veth pair. launch runs in the root namespace with rank 0 on 10.77.N.1 (``--hostfile``);
rank 1 is started by hand in namespace ``lzs<pid>`` on 10.77.N.2 (``python -m worker_proc
--rank 1 ... --attach``). Checks: greedy output equals ``--tp 1`` token for token, every TCP
socket of both ranks listens on its namespace address only, a peer with another CURVE
key is refused, and rank 1 killed mid-decode fails the stream saying a rank was lost, after which
rank 0 restarts and serves again once rank 1 is started again. Skipped where network namespaces cannot be made (needs root and ``ip``).
The hostfiles and rank links without a server: tests/unit/test_tp_hosts.py."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from protocol.messages import SamplingParams
from tests.support.hostfiles import hosts_json
from tests.support.launcher import ROOT, Server, alive, stop_and_check
from tests.support.stream_faults import kill_mid_stream, until
from tests.support.tensor_parallel import CHUNK, PROMPTS, generate_all, ids_of, native
from worker_proc.tp.link import read_key, write_key
from worker_proc.tp.setup import free_ports

NS = f"lzs{os.getpid()}"
VETH = f"lzv{os.getpid()}"
SUBNET = f"10.77.{os.getpid() % 250 + 1}"
RANK0_IP, RANK1_IP = f"{SUBNET}.1", f"{SUBNET}.2"


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def netns():
    """A namespace `NS` joined to the root namespace by a veth pair: RANK0_IP here, RANK1_IP
    there. Removed (with the pair) at the end of the module."""
    if shutil.which("ip") is None or shutil.which("ss") is None or os.geteuid() != 0:
        pytest.skip("network namespaces need root and the ip and ss tools (iproute2)")
    try:
        sh("ip", "netns", "add", NS)
    except subprocess.CalledProcessError as e:
        pytest.skip(f"ip netns add failed: {e.stderr.strip()}")
    try:
        sh("ip", "link", "add", VETH, "type", "veth", "peer", "name", f"{VETH}b")
        sh("ip", "link", "set", f"{VETH}b", "netns", NS)
        sh("ip", "addr", "add", f"{RANK0_IP}/24", "dev", VETH)
        sh("ip", "link", "set", VETH, "up")
        for cmd in (
            ["addr", "add", f"{RANK1_IP}/24", "dev", f"{VETH}b"],
            ["link", "set", f"{VETH}b", "up"],
            ["link", "set", "lo", "up"],
        ):
            sh("ip", "netns", "exec", NS, "ip", *cmd)
        yield NS
    finally:
        subprocess.run(["ip", "link", "del", VETH], capture_output=True)
        subprocess.run(["ip", "netns", "del", NS], capture_output=True)


@dataclass
class TwoHosts:
    """launch's `Server` running rank 0, rank 1's Popen (started by hand in the namespace),
    the key file and rank 0's attach address."""

    srv: Server
    rank1: subprocess.Popen
    key: Path
    addr: str
    hostfile: Path
    log: Path
    starting_port: int

    def start_rank1(self) -> None:
        """Start rank 1 in the namespace (``python -m worker_proc --rank 1 ... --attach``)."""
        with open(self.log, "a") as log:
            self.rank1 = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    NS,
                    sys.executable,
                    "-m",
                    "worker_proc",
                    "--rank",
                    "1",
                    "--hostfile",
                    str(self.hostfile),
                    "--starting-port",
                    str(self.starting_port),
                    "--attach",
                    self.addr,
                    "--dist-key-file",
                    str(self.key),
                ],
                cwd=str(ROOT),
                env=dict(os.environ, PYTHONPATH=str(ROOT)),
                stdout=log,
                stderr=subprocess.STDOUT,
            )


@pytest.fixture(scope="module")
def two_hosts(netns, tiny_model_dir, tmp_path_factory):
    """`TwoHosts` for ``--hostfile`` with rank 1 started by hand in `netns`, from the host
    list users write for mlx.launch (``[{"ssh": ..., "ips": [...]}, ...]``) with a
    ``--starting-port`` free on rank 0's address (rank 1's ring port is the next one; the
    ring format gives the same ring: `test_both_hostfile_formats_give_the_same_ring`)."""
    d = tmp_path_factory.mktemp("tphosts")
    ring0, attach0 = free_ports(2, RANK0_IP)
    hostfile = d / "hosts.json"
    hostfile.write_text(hosts_json([RANK0_IP], [RANK1_IP]))
    key = write_key(d / "hosts.key")
    addr = f"{RANK0_IP}:{attach0}"
    hosts = TwoHosts(None, None, key, addr, hostfile, d / "rank1.log", ring0)
    hosts.start_rank1()
    try:
        hosts.srv = Server(
            [
                "--model",
                str(tiny_model_dir),
                "--hostfile",
                str(hostfile),
                "--starting-port",
                str(ring0),
                "--dist-init-addr",
                addr,
                "--dist-key-file",
                str(key),
                "--chunked-prefill-size",
                str(CHUNK),
                "--max-running-requests",
                "4",
            ],
            d / "launch.log",
        )
    except BaseException:
        hosts.rank1.kill()
        print(hosts.log.read_text()[-3000:])
        raise
    yield hosts
    stop_and_check(hosts.srv)
    try:
        assert hosts.rank1.wait(15) == 0, hosts.log.read_text()[-3000:]  # rank 0 forwarded WorkerShutdown
    finally:
        if hosts.rank1.poll() is None:
            hosts.rank1.kill()


def test_two_hosts_greedy_equals_tp1(two_hosts, tp1):
    """Three prompts batched (one prefilled in 3 chunks) over the two namespaces: the tokens
    equal --tp 1's."""
    got = asyncio.run(generate_all(two_hosts.srv.base_url, [native(p) for p in PROMPTS]))
    for p, body in zip(PROMPTS, got):
        assert ids_of(body) == tp1(p, SamplingParams(temperature=0.0))[0]
    assert two_hosts.rank1.poll() is None


def tcp_sockets(pid: int, ns: str | None = None, state: str = "all") -> list[tuple[str, str]]:
    """(local, peer) addresses of the TCP sockets of process `pid` in `state` (``ss``'s state
    filter: all, listening, ...), seen from namespace `ns` (None: the root one)."""
    cmd = ["ss", "-Htnp", "state", state]
    out = subprocess.run(
        cmd if ns is None else ["ip", "netns", "exec", ns, *cmd], check=True, capture_output=True, text=True
    ).stdout
    return [(f[-3], f[-2]) for f in (line.split() for line in out.splitlines() if f"pid={pid}," in line)]


def test_rank_sockets_listen_only_on_the_namespace_addresses(two_hosts, netns):
    """Rank 0 listens only on the attach address (the ring closes its listener once joined);
    rank 1 listens on nothing; every TCP socket of either rank is on its namespace address,
    none on a wildcard or loopback address."""
    srv, rank1, addr = two_hosts.srv, two_hosts.rank1, two_hosts.addr
    rank0_pid = srv.child("worker")
    assert [local for local, _ in tcp_sockets(rank0_pid, state="listening")] == [addr]
    assert tcp_sockets(rank1.pid, netns, "listening") == []  # ip netns exec execs: rank 1 keeps the pid
    rank0, rank1_socks = tcp_sockets(rank0_pid), tcp_sockets(rank1.pid, netns)
    assert all(local.startswith(f"{RANK0_IP}:") for local, _ in rank0), rank0
    assert all(local.startswith(f"{RANK1_IP}:") for local, _ in rank1_socks), rank1_socks
    assert addr in [peer for _, peer in rank1_socks], rank1_socks  # rank 1's CURVE link to rank 0
    print(f"\nTP two hosts: rank 0 TCP {rank0}; rank 1 TCP {rank1_socks}")


def test_a_peer_with_another_key_is_refused(two_hosts, tmp_path):
    """A DEALER with a fresh CURVE key connecting to rank 0's attach address fails the
    handshake (ZeroMQ reports HANDSHAKE_FAILED_AUTH); the server still answers."""
    srv, key, addr = two_hosts.srv, two_hosts.key, two_hosts.addr
    server_public, _ = read_key(key)
    public, secret = read_key(write_key(tmp_path / "other.key"))
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = server_public, public, secret
        mon = sock.get_monitor_socket()
        sock.connect(f"tcp://{addr}")
        sock.send(b'{"rank": 1}')
        deadline, events = time.monotonic() + 10, []
        while zmq.EVENT_HANDSHAKE_FAILED_AUTH not in events:
            assert time.monotonic() < deadline, f"no auth failure; events {events}"
            if mon.poll(200):
                events.append(recv_monitor_message(mon)["event"])
        assert zmq.EVENT_HANDSHAKE_SUCCEEDED not in events
    finally:
        ctx.destroy(linger=0)
    got = asyncio.run(generate_all(srv.base_url, [native(PROMPTS[0])]))
    assert len(ids_of(got[0])) == 8 and alive(srv.child("worker"))


def test_rank_on_the_other_host_killed_mid_decode(two_hosts, tp1):
    """kill -9 of rank 1 (the other namespace) while a stream decodes: rank 0 sees its link
    close and exits (it would otherwise wait in a collective forever), the stream ends with a
    503 error saying a rank started on another host was lost, then [DONE]; launch starts rank
    0 again, which serves the same greedy tokens once rank 1 is started again (what a restart
    loop on that host does)."""
    srv = two_hosts.srv
    url, rank0 = srv.base_url, srv.child("worker")

    async def start_rank1_again() -> None:
        await until(lambda: asyncio.sleep(0, not alive(rank0)), 30, "the old rank 0 to exit")
        two_hosts.rank1.wait(10)
        two_hosts.start_rank1()

    error, recovery_s = kill_mid_stream(url, lambda: two_hosts.rank1.send_signal(signal.SIGKILL), start_rank1_again)
    assert error["code"] == 503 and "lost a tensor-parallel rank started on another host" in error["message"], error
    assert srv.child("worker") != rank0
    body = httpx.post(f"{url}/generate", json=native(PROMPTS[0]), timeout=60).json()
    assert ids_of(body) == tp1(PROMPTS[0], SamplingParams(temperature=0.0))[0]
    print(f"\nTP two hosts, rank 1 killed: stream failed with 503, group back after {recovery_s:.1f} s")
