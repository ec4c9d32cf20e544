"""Tensor-parallel worker ranks over `mx.distributed` (``--tp N``, issue 12).

Design:

- **Ranks.** launch starts N worker processes, rank r with ``MLX_RANK=r`` and
  ``MLX_HOSTFILE`` naming a ring hostfile of loopback ports (`worker_proc.tp.setup`).
  launch refuses heads that do not divide by N before it starts anything
  (`worker_proc.tp.setup.check_heads`); each rank checks the architecture can be split
  before it loads weights (`check_shardable`), loads the whole model, joins the group (`init_group`) and keeps
  its shard through mlx-lm's own ``model.shard(group)`` (`shard`): attention heads and
  MLP columns split N ways, one ``all_sum`` after the attention and one after the MLP of
  each layer; embeddings, norms and the LM head are replicated.
- **One message stream.** The scheduler talks to rank 0 only, exactly as to a single
  worker (one inbox, one result stream, one `WorkerReady`). Rank 0 forwards every message
  it receives, before handling it, to the inbox of every other rank (`RankForwarder`:
  ZeroMQ PUSH to PULL, ipc in the run directory; with ``--hostfile`` the other ranks are
  started by hand, on any host, and take the stream over CURVE-authenticated ZeroMQ TCP from
  rank 0 (`worker_proc.tp.link`)). Every rank so runs the same Launch /
  ChainDecode / Finalize / StoreKV / WorkerAbort sequence, in the same order, and so
  issues the same collectives in the same order; only rank 0 replies.
- **Identical tokens without a collective.** The ``all_sum`` leaves the same sums on
  every rank and the LM head is replicated, so every rank computes the same logits; the
  sampling noise is a function of (seed, position, token), so the same seed gives the same
  token. Rank 0 gives every sampled row that came without a seed one of its own before
  forwarding (`seed_unseeded`). The sampled tokens then feed the next (chained) decode on
  each rank without leaving the device: the overlap pipeline stays lazy.
- **Per-rank KV.** Each rank's KV pool holds its KV-heads shard (`shard` sets the model's
  head counts to the shard's), with the same slot count on every rank: the smallest any
  rank sized (`agree_min`), so the scheduler's slot ids are valid on all.
- **Failure.** A rank that dies leaves the others blocked in a collective; launch kills the
  whole group and restarts it as the next worker generation (the single-worker path).
"""

from __future__ import annotations

import random

import mlx.core as mx
import msgspec
import zmq

from protocol import codec, endpoints
from protocol.messages import Launch
from worker_proc.logits.row import GREEDY_BELOW, SEED_MOD
from worker_proc.model.loader import LoadedModel
from worker_proc.tp.link import RankServer
from worker_proc.tp.setup import check_heads


def check_shardable(config: dict, tp: int) -> None:
    """Raise `ValueError` when a model of `config` (an mlx-lm config dict) cannot be split
    over `tp` ranks: its mlx-lm class has no ``shard`` (naming the architecture), or its
    query or KV heads do not divide by `tp` (naming both counts). No-op for `tp` 1."""
    if tp == 1:
        return
    from mlx_lm.utils import _get_classes

    model_type = config.get("model_type", "?")
    model_cls, _ = _get_classes(config)
    if not callable(getattr(model_cls, "shard", None)):
        raise ValueError(
            f"--tp {tp}: architecture {model_type!r} cannot be tensor-parallel: mlx-lm's "
            f"{model_cls.__module__}.{model_cls.__name__} has no shard(); serve it with --tp 1"
        )
    heads = int(config.get("num_attention_heads") or 0)
    check_heads(model_type, heads, int(config.get("num_key_value_heads") or heads), tp)


def init_group(backend: str, tp: int) -> mx.distributed.Group:
    """Join the group of this rank (``MLX_RANK`` / ``MLX_HOSTFILE`` in the environment);
    blocks until every rank joined. Raises `RuntimeError` when the backend is not available
    or the group does not have `tp` ranks."""
    group = mx.distributed.init(strict=True, backend=backend)
    if group.size() != tp:
        raise RuntimeError(f"the {backend} group has {group.size()} ranks, --tp is {tp}")
    return group


def shard(loaded: LoadedModel, group: mx.distributed.Group) -> None:
    """Keep this rank's shard of `loaded.model` (mlx-lm's ``model.shard(group)``) and
    set the head counts of its args to the shard's (what the KV pool sizes by)."""
    model, n = loaded.model, group.size()
    args = model.args
    heads = args.num_attention_heads
    kv_heads = getattr(args, "num_key_value_heads", None) or heads
    if not getattr(args, "head_dim", None):
        args.head_dim = args.hidden_size // heads
    model.shard(group)
    args.num_attention_heads, args.num_key_value_heads = heads // n, kv_heads // n
    mx.eval(model.parameters())  # materialize the slices so the full weights are freed


def agree_min(value: int, group: mx.distributed.Group) -> int:
    """The smallest `value` of all ranks (every rank must call it)."""
    return int(mx.distributed.all_min(mx.array([value], dtype=mx.int64), group=group, stream=mx.cpu).item())


def seed_unseeded(msg: object) -> object:
    """`msg` with a fresh seed in every sampled (not greedy) row of a Launch that has none;
    `msg` itself when there is no such row."""
    if not isinstance(msg, Launch) or not any(
        p is not None and p.seed is None and p.temperature >= GREEDY_BELOW for p in msg.batch.sampling
    ):
        return msg
    rng = random.SystemRandom()
    sampling = [
        msgspec.structs.replace(p, seed=rng.randrange(SEED_MOD))
        if p is not None and p.seed is None and p.temperature >= GREEDY_BELOW
        else p
        for p in msg.batch.sampling
    ]
    return msgspec.structs.replace(msg, batch=msgspec.structs.replace(msg.batch, sampling=sampling))


class RankForwarder:
    """Rank 0's link to the other ranks of its group: every message rank 0 receives goes,
    unchanged but for `seed_unseeded`, to each rank's inbox: over ipc (`endpoints.worker_rank`)
    on one host, or through `link` (`tp.link.RankServer`, TCP) to ranks started by hand."""

    def __init__(self, ctx: zmq.Context, run_dir: str, tp: int, link: RankServer | None = None) -> None:
        self.socks, self.link = [], link
        for rank in range(1, tp if link is None else 1):
            sock = ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoints.worker_rank(run_dir, rank))
            self.socks.append(sock)

    def forward(self, raw: bytes, msg: object) -> object:
        """Send `msg` (received as `raw`; None when it did not decode) to every other rank;
        returns the message rank 0 handles itself (with the seeds the others got)."""
        seeded = seed_unseeded(msg) if msg is not None else None
        if seeded is not msg:
            raw = codec.encoder.encode(seeded)
        for sock in self.socks:
            sock.send(raw)
        if self.link is not None:
            self.link.send(raw)
        return seeded

    def close(self, linger_ms: int) -> None:
        """Close the link to ranks started by hand, delivering what is queued for them (the
        `WorkerShutdown`) for up to `linger_ms` ms when the context terminates; no-op on one
        host (its ipc sockets go with the context)."""
        if self.link is not None:
            self.link.close(linger_ms)

    def refuse_late(self) -> None:
        """Refuse ranks that try to attach to the formed group (`tp.link.RankServer.refuse_late`);
        no-op on one host."""
        if self.link is not None:
            self.link.refuse_late()
