"""Tensor-parallel worker ranks (issue 12) in this process: rank 0 leaves a group whose
collective lost a peer, launch names the killed rank, the heads check, a backend that is not
built and an architecture mlx-lm cannot shard are refused, and rank 0 seeds unseeded sampled
rows and forwards what it runs. The ``--tp 2`` server: tests/e2e/test_tensor_parallel.py."""

from __future__ import annotations

import contextlib
import signal

import pytest
import zmq

from launcher.args import parse_args
from protocol import codec, endpoints
from protocol.enums import ForwardMode
from protocol.messages import Finalize, ForwardBatch, Launch, SamplingParams
from tests.support.tiny_model import TINY_CONFIG
from worker_proc.tp.setup import check_heads, model_heads
from worker_proc.tp.sharding import RankForwarder, check_shardable, seed_unseeded


class _Exited(Exception):
    """Raised instead of `os._exit` in the tests below."""


class _Quiet:
    def error(self, *args, **kwargs) -> None:
        pass

    info = warning = error


def _finalize_failing(monkeypatch, forwarder: object | None, error: str) -> tuple[list[bytes], list[int]]:
    """Run `WorkerProcess._finalize` for a launch whose finalize raises RuntimeError(`error`)
    on a worker that is rank 0 of a --tp group (`forwarder` set) or alone; returns what it
    sent the scheduler and the codes it exited with."""
    from worker_proc import proc as worker_proc

    class Runner:
        trace, last_logprobs, last_row_errors = None, (), []

        def finalize(self, launch_id: int):
            raise RuntimeError(error)

    class Results:
        def __init__(self) -> None:
            self.sent: list[bytes] = []

        def send(self, raw: bytes) -> None:
            self.sent.append(raw)

    exits: list[int] = []

    def fake_exit(code: int) -> None:
        exits.append(code)
        raise _Exited

    monkeypatch.setattr(worker_proc.os, "_exit", fake_exit)
    worker = worker_proc.WorkerProcess.__new__(worker_proc.WorkerProcess)
    worker.runner, worker.forwarder, worker.results, worker.log = Runner(), forwarder, Results(), _Quiet()
    worker.stopping, worker.generation, worker.chain_first = False, 0, None
    with contextlib.suppress(_Exited):
        worker._finalize(Finalize(7), 0.0)
    return worker.results.sent, exits


def test_rank0_leaves_a_group_whose_collective_lost_a_peer_instead_of_failing_the_launch(monkeypatch):
    """A rank killed mid-step breaks rank 0's collective ("[ring] connection to a peer was
    lost"): rank 0 exits EXIT_RANK_LOST without answering, so the requests of that launch get
    launch's 503 naming the dead rank like the others (its answer failed them with a 500
    "model execution failed: RuntimeError: [ring] ..." first: 3 of 8 requests in one kill).
    Any other error, or the same one without --tp, is answered as before."""
    from protocol.process import EXIT_RANK_LOST

    lost = "[ring] connection to a peer was lost"
    assert _finalize_failing(monkeypatch, object(), lost) == ([], [EXIT_RANK_LOST])
    for forwarder, error in ((None, lost), (object(), "shape mismatch")):
        sent, exits = _finalize_failing(monkeypatch, forwarder, error)
        (reply,) = [codec.from_worker.decode(raw) for raw in sent]
        assert exits == [] and reply.launch_id == 7 and reply.error == f"RuntimeError: {error}"


def test_heads_of_the_default_model_divide_by_3(default_source):
    assert model_heads(default_source) == ("llama", 9, 3)
    check_heads("llama", 9, 3, 3)


def test_architecture_without_shard_is_refused_naming_it():
    """mlx-lm's gemma has no shard(): each rank refuses it from the config, before weights."""
    config = {**TINY_CONFIG, "model_type": "gemma", "architectures": ["GemmaForCausalLM"], "head_dim": 16}
    with pytest.raises(
        ValueError,
        match="--tp 2: architecture 'gemma' cannot be tensor-parallel: mlx-lm's mlx_lm.models.gemma.Model has no shard",
    ):
        check_shardable(config, 2)
    check_shardable(TINY_CONFIG, 2)
    check_shardable(config, 1)


def test_only_the_ring_backend_is_accepted(capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--tp", "2", "--dist-backend", "nccl"])
    assert e.value.code == 2
    assert "--dist-backend 'nccl' is not supported: only ring is built" in capsys.readouterr().err
    assert parse_args(["--tp", "2"]).dist_backend == "ring"


def test_rank0_seeds_unseeded_sampled_rows_and_forwards_what_it_runs(tmp_path):
    """Greedy and seeded rows keep their parameters; an unseeded sampled row gets a seed, in
    the message rank 0 runs and in the one the other ranks receive alike."""
    batch = ForwardBatch(
        ["greedy", "seeded", "unseeded"],
        [[1], [2], [3]],
        [SamplingParams(temperature=0.0), SamplingParams(seed=3), SamplingParams()],
        [True] * 3,
    )
    launch = Launch(1, ForwardMode.EXTEND, batch)
    finalize = Finalize(1)
    assert seed_unseeded(finalize) is finalize
    ctx = zmq.Context()
    try:
        inbox = ctx.socket(zmq.PULL)
        inbox.bind(endpoints.worker_rank(tmp_path, 1))
        forwarder = RankForwarder(ctx, str(tmp_path), 2)
        runs = forwarder.forward(codec.encoder.encode(launch), launch)
        assert inbox.poll(5000)
        assert codec.to_worker.decode(inbox.recv()) == runs
        seeds = [p.seed for p in runs.batch.sampling]
        assert seeds[:2] == [None, 3] and isinstance(seeds[2], int)
        assert runs.batch.sampling[2] == SamplingParams(seed=seeds[2])
        raw = codec.encoder.encode(finalize)
        assert forwarder.forward(raw, finalize) is finalize and inbox.poll(5000) and inbox.recv() == raw
    finally:
        ctx.destroy(linger=0)


class _Quiet:
    def error(self, *args, **kwargs) -> None:
        pass

    info = warning = error


def test_launch_names_the_killed_rank_when_rank0_left_the_broken_group(tmp_path):
    """Rank 0 exited EXIT_RANK_LOST because rank 1 was killed: the scheduler is told that rank
    1 was killed by SIGKILL (what the requests' 503 says), both restart as the next generation."""
    import launcher.supervisor
    from protocol.enums import Role
    from protocol.messages import WorkerExited
    from protocol.process import EXIT_RANK_LOST

    class Popen:
        def __init__(self, pid: int, code: int) -> None:
            self.pid, self.returncode = pid, code

        def poll(self) -> int:
            return self.returncode

    told: list = []
    ranks = [
        launcher.supervisor.Child(Role.WORKER, 0, "worker", Popen(10, EXIT_RANK_LOST)),
        launcher.supervisor.Child(Role.WORKER, 1, "worker-rank1", Popen(11, -signal.SIGKILL)),
    ]
    other = launcher.supervisor.Child(Role.SCHEDULER, 0, "scheduler", Popen(12, None))
    launcher = launcher.supervisor.Launcher.__new__(launcher.supervisor.Launcher)
    launcher.children, launcher.log, launcher.worker_generation = [*ranks, other], _Quiet(), 3
    launcher.restart_at, launcher.quick_deaths = {}, {}
    launcher._to_scheduler = told.append
    launcher._worker_exited(ranks[0])
    assert told == [WorkerExited(11, 3, "rank 1 was killed by SIGKILL")]
    assert launcher.children == [other] and launcher.worker_generation == 4
    assert set(launcher.restart_at) == {(Role.WORKER, 0)}
