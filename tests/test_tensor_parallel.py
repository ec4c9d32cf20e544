"""Tensor-parallel worker ranks (issue 12): ``--tp 2`` over MLX's ring backend on loopback.

One ``--tp 2`` server on the tiny random llama (4 query / 2 KV heads) serves every test of
the module; its greedy and seeded outputs are compared token for token with the same
`ModelRunner` unsharded in this process (``--tp 1``). The last test kills a rank mid-decode.
Start-up errors: launch refuses the default model (9 / 3 heads) at ``--tp 2`` and a backend
that is not built; a rank refuses an architecture mlx-lm cannot shard."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx
import pytest

from launcher.args import parse_args
import zmq

from protocol import codec, endpoints
from protocol.config import ModelSource
from protocol.enums import ForwardMode
from protocol.messages import Finalize, ForwardBatch, Launch, SamplingParams
from tests.conftest import TINY_CONFIG, stop_and_check
from tests.launcher import Server, alive
from tests.test_launch import run_launch
from tests.test_output_control_worker import run
from tests.stream_faults import kill_mid_stream
from worker_proc.tp.sharding import RankForwarder, check_shardable, seed_unseeded
from worker_proc.tp.setup import check_heads, model_heads

MAX_TOKENS = 8
CHUNK = 16  # --chunked-prefill-size: the 40-token prompt is prefilled in 3 chunks


def prompt(n: int, salt: int = 0) -> list[int]:
    """`n` token ids spread over the vocabulary."""
    return [1 + (i * 7919 + salt * 104729) % 49000 for i in range(n)]


PROMPTS = [prompt(5), prompt(11, 1), prompt(40, 2)]


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    """``--tp 2`` on the tiny model, prompts chunked by `CHUNK` tokens, chunks mixed with
    running decodes (MIXED launches)."""
    srv = Server(["--model", str(tiny_model_dir), "--tp", "2", "--chunked-prefill-size", str(CHUNK),
                  "--enable-mixed-chunk", "--max-running-requests", "4"], tmp_path_factory.mktemp("logs") / "tp2.log")
    yield srv
    stop_and_check(srv)


@pytest.fixture(scope="module")
def tp1(tiny_model_dir):
    """tp1(ids, params) -> the `MAX_TOKENS` tokens and logprobs of the unsharded model
    (`ModelRunner` in this process)."""
    from worker_proc.model.loader import load
    from worker_proc.model.runner import ModelRunner

    loaded = load(ModelSource("hf", str(tiny_model_dir), "tiny"))

    def reference(ids: list[int], params: SamplingParams) -> tuple[list[int], list]:
        toks, lps = run(ModelRunner(loaded), {"r": ids}, {"r": params}, MAX_TOKENS)
        return toks["r"], lps["r"]
    return reference


def native(ids: list[int], stream_: bool = False, **sampling) -> dict:
    """A /generate body for `ids`: `MAX_TOKENS` tokens, EOS ignored, logprobs returned."""
    return {"input_ids": ids, "stream": stream_, "return_logprob": True,
            "sampling_params": {"max_new_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0.0, **sampling}}


def ids_of(body: dict) -> list[int]:
    return [t for _, t, _ in body["meta_info"]["output_token_logprobs"]]


async def generate_all(url: str, bodies: list[dict]) -> list[dict]:
    """POST every body to /generate at once (they batch); their JSON answers."""
    async with httpx.AsyncClient(timeout=60) as c:
        answers = await asyncio.gather(*(c.post(f"{url}/generate", json=b) for b in bodies))
    for a in answers:
        assert a.status_code == 200, a.text
    return [a.json() for a in answers]


def test_batched_greedy_equals_tp1_token_for_token(server, tp1):
    """Three prompts at once (one prefilled in 3 chunks): the tokens equal --tp 1's and the
    logprobs agree to 1e-4."""
    got = asyncio.run(generate_all(server.base_url, [native(p) for p in PROMPTS]))
    for p, body in zip(PROMPTS, got):
        want, want_lp = tp1(p, SamplingParams(temperature=0.0, top_logprobs=0))
        assert ids_of(body) == want
        lps = [lp for lp, _, _ in body["meta_info"]["output_token_logprobs"]]
        assert lps == pytest.approx([w.logprobs[0] for w in want_lp], abs=1e-4)


def test_streamed_prompt_hits_the_radix_cache_and_equals_tp1(server, tp1):
    """A prompt run once, then again streamed: the second takes its prefix from the radix
    cache (cached_tokens > 0) and both equal --tp 1."""
    p = prompt(37, 3)
    want, _ = tp1(p, SamplingParams(temperature=0.0))
    first = httpx.post(f"{server.base_url}/generate", json=native(p), timeout=60).json()
    events = []
    with httpx.stream("POST", f"{server.base_url}/generate", json=native(p, True), timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(httpx.Response(200, content=line[6:]).json())
    assert ids_of(first) == want and ids_of(events[-1]) == want
    assert events[-1]["meta_info"]["cached_tokens"] > 0, events[-1]["meta_info"]


def test_penalties_and_seeded_sampling_equal_tp1(server, tp1):
    """Penalized greedy rows and a seeded sampled row, batched: the same tokens as --tp 1
    (the ranks sample alike)."""
    cases = [dict(frequency_penalty=1.5, repetition_penalty=1.3), dict(temperature=0.9, seed=11),
             dict(temperature=1.0, top_k=20, seed=5, presence_penalty=0.5)]
    got = asyncio.run(generate_all(server.base_url, [native(PROMPTS[1], **c) for c in cases]))
    for c, body in zip(cases, got):
        want, _ = tp1(PROMPTS[1], SamplingParams(**{"temperature": 0.0, **c}))
        assert ids_of(body) == want, c


def test_grammar_mask_holds_under_tp(server):
    """A regex-constrained request: every rank applies the scheduler's mask."""
    body = {"text": "Answer:", "sampling_params": {"max_new_tokens": MAX_TOKENS, "temperature": 0.0,
                                                   "regex": "(yes|no)"}}
    r = httpx.post(f"{server.base_url}/generate", json=body, timeout=60)
    assert r.status_code == 200 and r.json()["text"] in ("yes", "no"), r.text


def test_rank_killed_mid_decode_fails_clearly_and_the_group_restarts(server, tp1):
    """kill -9 of rank 1 while a stream decodes: the stream ends with a 503 error event naming
    the rank, then [DONE]; launch kills rank 0, restarts both, and the new group serves the
    same greedy tokens."""
    url = server.base_url
    rank0, rank1 = server.child("worker"), server.child("worker-rank1")
    error, recovery_s = kill_mid_stream(url, lambda: os.kill(rank1, signal.SIGKILL))
    assert error["code"] == 503 and "rank 1 was killed by SIGKILL" in error["message"], error
    deadline = time.monotonic() + 10
    while alive(rank0) or alive(rank1):
        assert time.monotonic() < deadline, "the old ranks are still alive"
        time.sleep(0.05)
    assert {server.child("worker"), server.child("worker-rank1")}.isdisjoint({rank0, rank1})
    body = httpx.post(f"{url}/generate", json=native(PROMPTS[0]), timeout=60).json()
    assert ids_of(body) == tp1(PROMPTS[0], SamplingParams(temperature=0.0))[0]
    print(f"\nTP rank kill: stream failed with 503, group back after {recovery_s:.1f} s")




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
    try:
        worker._finalize(Finalize(7), 0.0)
    except _Exited:
        pass
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
    ranks = [launcher.supervisor.Child(Role.WORKER, 0, "worker", Popen(10, EXIT_RANK_LOST)),
             launcher.supervisor.Child(Role.WORKER, 1, "worker-rank1", Popen(11, -signal.SIGKILL))]
    other = launcher.supervisor.Child(Role.SCHEDULER, 0, "scheduler", Popen(12, None))
    launcher = launcher.supervisor.Launcher.__new__(launcher.supervisor.Launcher)
    launcher.children, launcher.log, launcher.worker_generation = [*ranks, other], _Quiet(), 3
    launcher.restart_at, launcher.quick_deaths = {}, {}
    launcher._to_scheduler = told.append
    launcher._worker_exited(ranks[0])
    assert told == [WorkerExited(11, 3, "rank 1 was killed by SIGKILL")]
    assert launcher.children == [other] and launcher.worker_generation == 4
    assert set(launcher.restart_at) == {(Role.WORKER, 0)}

# --------------------------------------------------------------------------- start-up errors
def test_indivisible_heads_fail_at_start_naming_them():
    """The default model has 9 query and 3 KV heads: launch refuses --tp 2 before it starts
    any process."""
    t0 = time.monotonic()
    r = run_launch(["--tp", "2"])
    elapsed = time.monotonic() - t0
    assert r.returncode == 1
    assert "--tp 2: the heads of this llama model do not divide by 2 (num_attention_heads=9, " \
           "num_key_value_heads=3)" in r.stderr, r.stderr[-2000:]
    assert elapsed < 15, elapsed
    print(f"\nTP indivisible heads refused in {elapsed:.1f} s")


def test_heads_of_the_default_model_divide_by_3(default_source):
    assert model_heads(default_source) == ("llama", 9, 3)
    check_heads("llama", 9, 3, 3)


def test_architecture_without_shard_is_refused_naming_it():
    """mlx-lm's gemma has no shard(): each rank refuses it from the config, before weights."""
    config = {**TINY_CONFIG, "model_type": "gemma", "architectures": ["GemmaForCausalLM"], "head_dim": 16}
    with pytest.raises(ValueError, match="--tp 2: architecture 'gemma' cannot be tensor-parallel: mlx-lm's "
                                         "mlx_lm.models.gemma.Model has no shard"):
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
    batch = ForwardBatch(["greedy", "seeded", "unseeded"], [[1], [2], [3]],
                         [SamplingParams(temperature=0.0), SamplingParams(seed=3), SamplingParams()], [True] * 3)
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
