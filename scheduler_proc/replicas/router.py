"""`DetokRouter`: which detokenizer replica renders each request, and how its text survives
a replica that leaves or dies (DESIGN.md §7).

Routing: a request is seeded on the least-loaded live replica when it starts (ties in
turn) and keeps it for life; its new token ids go to that replica only.

Failure. The router keeps each request (its `Req`, so its generated token ids) until the
tokenizer reports its stream closed (`StreamsClosed`), also after the scheduler finished
it, since a replica can die before its last text reaches the client. When a replica is
lost (launch saw it exit, it said it left, or it sent no heartbeat for
`heartbeat_timeout_s`), the router asks the tokenizer how many characters of each of its
requests arrived (`DeliveredQuery` → `DeliveredChars`): the tokenizer is the one process
that knows what the client has; a count a replica reported could run ahead of text still
in its socket when it died. Each request is then re-seeded on another replica with that
count (`DetokSeed.chars_sent`) and replayed: one `BatchTokenOut` row with every token
shown so far, and the finish if the scheduler already finished it. The new replica renders
the text from the start (so held-back stop-string prefixes and unfinished characters are
re-derived) and sends only what follows chars_sent. Text the lost replica still had in
flight is harmless: each text row carries its offset and the tokenizer drops what it has.

With no live replica, requests wait (new ones too) for one to register, at most `wait_s`;
then they fail with a 503 and are aborted. A draining replica takes no new request and is
sent `DetokShutdown` once none of its requests is running.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from protocol.enums import ReplicaState
from protocol.messages import (
    BatchTokenOut,
    DeliveredQuery,
    DetokAbort,
    DetokSeed,
    DetokShutdown,
    DetokStatus,
    ReplicaRefused,
    ReplicaWelcome,
    ReqError,
)
from scheduler_proc.outbox import Outbox
from scheduler_proc.replicas.registry import Replica, ReplicaSet
from scheduler_proc.req import Req

HEARTBEAT_TIMEOUT_S = 5.0
"""A registered replica silent this long (no heartbeat) is lost."""
WAIT_FOR_REPLICA_S = 30.0
"""How long a request waits for a live replica before it fails with a 503."""
STATUS_INTERVAL_S = 0.2
"""`DetokStatus` goes to the tokenizer at most this often, when something changed."""
TICK_INTERVAL_S = 0.1
"""`tick` does its checks at most this often."""


class NullLog:
    """A logger that drops everything (the default where no logger is given)."""

    def __getattr__(self, _name: str):
        return lambda *_a, **_k: None


@dataclass(eq=False)
class Record:
    """A request whose stream is open at the tokenizer.

    replica: the index rendering it (None while it waits for one); chars_sent: characters
    the client has (None while the tokenizer's count is awaited); closed: the scheduler
    finished it (its last tokens were sent); moved: it was on a replica that was lost;
    since: when it began to wait.
    """

    req: Req
    replica: int | None = None
    chars_sent: int | None = 0
    closed: bool = False
    moved: bool = False
    since: float = 0.0


def shown_ids(req: Req) -> list[int]:
    """The token ids a replica renders for `req`: its output, less an EOS or stop token
    that ended it (only the last token can be one; `Req.shows`)."""
    ids = req.output_ids
    if ids and req.finished and not req.shows(ids[-1]):
        return ids[:-1]
    return ids


class DetokRouter:
    """Routes requests to replicas and re-seeds them when a replica is lost (see the module
    docstring).

    out: the scheduler's outbox; replicas: how many launch started (indexes 0..n-1, routed
    to from the start); wait_s / heartbeat_timeout_s: see the constants; clock: monotonic
    seconds (tests pass a fake); log: a structlog-like logger.
    """

    def __init__(
        self,
        out: Outbox,
        replicas: int,
        *,
        wait_s: float = WAIT_FOR_REPLICA_S,
        heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        log=None,
    ) -> None:
        self.out = out
        self.replicas = ReplicaSet(replicas)
        self.records: dict[str, Record] = {}
        self.wait_s = wait_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.clock = clock
        self.log = log or NullLog()
        self.failed = 0
        self.lost_count = 0
        self._dirty = True
        self._status_at = float("-inf")
        self._tick_at = float("-inf")

    # ------------------------------------------------------------------ the scheduler's side
    def loads(self) -> list[int]:
        """Running requests per replica index (what `Scheduler.detok_load` shows)."""
        return self.replicas.loads()

    def start(self, req: Req) -> None:
        """Seed `req` on the least-loaded live replica, or let it wait for one. Idempotent:
        a request already routed keeps its replica."""
        old = self.records.get(req.rid)
        if old is not None:
            if old.req is req:
                return
            self._drop(old)  # an earlier request under this rid whose stream closed
        rec = Record(req, since=self.clock())
        self.records[req.rid] = rec
        rep = self.replicas.choose()
        if rep is None:
            self._dirty = True
            self.log.warning("no live detokenizer replica; the request waits", rid=req.rid)
            return
        self._place(rec, rep)

    def tokens(self, rows: list[tuple[Req, list[int]]]) -> None:
        """Send each row's new token ids (the finish and counts come from its `Req`) to its
        request's replica, one `BatchTokenOut` per replica. Rows of requests waiting for a
        replica are not sent: the replay on placement carries them."""
        per: dict[int, tuple[list, ...]] = {}  # BatchTokenOut's columns per replica
        records = self.records
        for req, ids in rows:
            rec = records.get(req.rid)
            if rec is not None and rec.req is req and rec.replica is not None:
                cols = per.get(rec.replica)
                if cols is None:
                    cols = per[rec.replica] = ([], [], [], [], [], [], [], [], [])
                cols[0].append(req.rid)
                cols[1].append(ids)
                cols[2].append(len(req.output_ids))
                cols[3].append(req.finish_reason)
                cols[4].append(req.matched_stop)
                # an ending EOS or stop token is not rendered, but has its logprob entry
                n_new = len(ids) + len(req.output_ids) - len(shown_ids(req))
                lp, start, prompt = req.logprobs.columns(n_new, False) if req.logprobs else (None, 0, None)
                cols[5].append(lp)
                cols[6].append(prompt)
                cols[7].append(start)
                # with its first token, and with its last (its speculative decoding counts)
                cols[8].append(req.timing if len(req.output_ids) == 1 or req.finished else None)
        for index, cols in per.items():
            self.out.to_detokenizer(index, _token_out(cols))

    def abort(self, req: Req, reason: str = "") -> None:
        """`req` ends without more text (the client left, or the tokenizer got an error for
        it): its replica forgets it (and logs its state for it when `reason` is given)."""
        rec = self.records.get(req.rid)
        if rec is None or rec.req is not req:
            return
        if rec.replica is not None:
            self.out.to_detokenizer(rec.replica, DetokAbort(req.rid, reason))
        self._drop(rec)

    def close(self, req: Req) -> None:
        """The scheduler finished `req` (its last tokens were sent): it leaves its replica's
        load but stays known until the tokenizer closes its stream."""
        rec = self.records.get(req.rid)
        if rec is None or rec.req is not req or rec.closed:
            return
        rec.closed = True
        if rec.replica is not None:
            self.replicas.get(rec.replica).load -= 1
        self._dirty = True

    # ------------------------------------------------------------------ the tokenizer's side
    def streams_closed(self, rids: list[str]) -> list[str]:
        """The tokenizer closed these streams: forget them (a replica still rendering one is
        told to forget it too). Returns the rids the scheduler still runs, which it should
        abort (nobody reads their text)."""
        running = []
        for rid in rids:
            rec = self.records.get(rid)
            if rec is not None:
                if not rec.closed:
                    running.append(rid)
                    if rec.replica is not None:
                        self.out.to_detokenizer(rec.replica, DetokAbort(rid))
                self._drop(rec)
        return running

    def delivered(self, rids: list[str], chars: list[int]) -> list[str]:
        """The tokenizer's counts for requests of a lost replica: re-seed them (a count of
        -1, a closed stream, forgets the request). Returns the rids the scheduler should
        abort (still running, stream closed)."""
        running = []
        for rid, n in zip(rids, chars):
            rec = self.records.get(rid)
            if rec is None or rec.replica is not None or rec.chars_sent is not None:
                continue
            if n < 0:
                if not rec.closed:
                    running.append(rid)
                self._drop(rec)
            else:
                rec.chars_sent = n
        self._place_waiting()
        return running

    # ------------------------------------------------------------------ replicas' side
    def register(self, index: int | None, pid: int, endpoint: str) -> int:
        """Accept a replica's Hello and answer `ReplicaWelcome`; it serves once `ready`.

        index None: an attached replica, given the next free index; else one launch started
        (first start or restart) at `index`. A new process under a live index replaces the
        old one, which is treated as lost. Returns the index. Raises `ValueError` for an
        index launch did not start.
        """
        now = self.clock()
        if index is None:
            rep = self.replicas.add_attached(pid, endpoint, now)
            self.out.connect_detokenizer(rep.index, endpoint)
            self.log.info("detokenizer replica attached", index=rep.index, pid=pid)
        else:
            rep = self.replicas.launched_replica(index)
            if rep.pid == 0 and rep.serving:  # launch's first start: linked and routed to already
                rep.pid, rep.endpoint, rep.last_seen = pid, endpoint, now
            elif rep.pid != pid:
                if rep.serving:
                    self.lost(index, f"replaced by process {pid}")
                rep.pid, rep.endpoint, rep.state, rep.last_seen, rep.told_to_exit = (
                    pid,
                    endpoint,
                    ReplicaState.STARTING,
                    now,
                    False,
                )
                self.out.connect_detokenizer(index, endpoint)
                self.log.info("detokenizer replica restarted", index=index, pid=pid)
        self.out.to_detokenizer(rep.index, ReplicaWelcome(rep.index))
        self._dirty = True
        return rep.index

    def ready(self, index: int, pid: int = 0) -> None:
        """Replica `index` (process `pid`; 0: any) serves from now on: it takes new requests
        and waiting ones."""
        rep = self.replicas.get(index)
        if rep is None or (pid and rep.pid != pid) or rep.state != ReplicaState.STARTING:
            return
        rep.state, rep.last_seen = ReplicaState.LIVE, self.clock()
        self._dirty = True
        self._place_waiting()

    def heartbeat(self, index: int, pid: int) -> None:
        """Replica `index` is alive. One already declared lost is told to exit (its requests
        were moved; launch restarts it if it started it), and told again while it still sends
        heartbeats `heartbeat_timeout_s` after: the refusal's link lingers 1 s, so a replica
        stalled longer (the stall that lost it) may never have read it, and would hold its
        index, serving nothing, for good."""
        rep = self.replicas.get(index)
        if rep is None or rep.pid != pid:
            return
        now = self.clock()
        if rep.serving:
            rep.last_seen = now
        elif rep.endpoint and (
            not rep.told_to_exit or (rep.refused_at is not None and now - rep.refused_at >= self.heartbeat_timeout_s)
        ):
            if rep.told_to_exit:
                self.log.warning(
                    "lost detokenizer replica still alive; telling it again to exit",
                    index=index,
                    pid=pid,
                    refused_s_ago=round(now - rep.refused_at, 1),
                )
            rep.told_to_exit, rep.refused_at = True, now
            self.out.connect_detokenizer(index, rep.endpoint)
            self.out.to_detokenizer(
                index,
                ReplicaRefused(
                    f"detokenizer replica {index} was declared lost (no heartbeat for {self.heartbeat_timeout_s:g} s) "
                    f"and its requests moved to other replicas"
                ),
            )
            self.out.disconnect_detokenizer(index, flush=True)

    def drain(self, index: int) -> str | None:
        """Route nothing new to replica `index`; it is sent `DetokShutdown` once none of its
        requests is running. Returns an error message for an unknown or gone replica."""
        rep = self.replicas.get(index)
        if rep is None or not rep.serving:
            live = ", ".join(str(r.index) for r in self.replicas if r.serving) or "none"
            return f"no live detokenizer replica {index} (live: {live})"
        if rep.state != ReplicaState.DRAINING:
            rep.state = ReplicaState.DRAINING
            self._dirty = True
            self.log.info("draining detokenizer replica", index=index, running=rep.load)
        self._release_drained()
        return None

    def exited(self, index: int, pid: int = 0, reason: str = "") -> None:
        """Replica `index` exited (pid 0: whichever process holds the index). One that was
        released after a drain left cleanly; any other is lost."""
        rep = self.replicas.get(index)
        if rep is None or not rep.serving or (pid and rep.pid and pid != rep.pid):
            return
        self.lost(index, reason or "exited", clean=rep.told_to_exit)

    def lost(self, index: int, reason: str, clean: bool = False) -> None:
        """Replica `index` is gone: close its link and re-seed its requests elsewhere once the
        tokenizer says how much of each it has (`DeliveredQuery`)."""
        rep = self.replicas.get(index)
        if rep is None or not rep.serving:
            return
        rep.state, rep.load = ReplicaState.GONE, 0
        self.out.disconnect_detokenizer(index)
        now = self.clock()
        orphans = [rec for rec in self.records.values() if rec.replica == index]
        for rec in orphans:
            rec.replica, rec.chars_sent, rec.moved, rec.since = None, None, True, now
        if orphans:
            self.out.to_tokenizer(DeliveredQuery([rec.req.rid for rec in orphans]))
        if not clean:
            self.lost_count += 1
        self._dirty = True
        log = self.log.info if clean else self.log.warning
        log("detokenizer replica gone", index=index, pid=rep.pid, reason=reason, requests_to_reseed=len(orphans))

    # ------------------------------------------------------------------ time
    def tick(self) -> list[str]:
        """Periodic work (call every loop turn; it runs at most every `TICK_INTERVAL_S`):
        heartbeat timeouts, releasing drained replicas, failing requests that waited longer
        than `wait_s` (a 503 to the tokenizer), and the status for the tokenizer. Returns the
        rids the scheduler must abort."""
        now = self.clock()
        if now - self._tick_at < TICK_INTERVAL_S:
            return []
        self._tick_at = now
        for rep in list(self.replicas):
            if rep.serving and rep.pid and now - rep.last_seen > self.heartbeat_timeout_s:
                self.lost(rep.index, f"no heartbeat for {now - rep.last_seen:.1f} s", clean=rep.told_to_exit)
        self._release_drained()
        abort = []
        for rec in [r for r in self.records.values() if r.replica is None and now - r.since > self.wait_s]:
            rid = rec.req.rid
            self.out.to_tokenizer(
                ReqError(
                    rid,
                    503,
                    f"no detokenizer replica was available for {self.wait_s:g} s "
                    "(attach one with: python -m detokenizer_proc --attach RUN_DIR)",
                )
            )
            if not rec.closed:
                abort.append(rid)
            self._drop(rec)
            self.failed += 1
            self.log.error("request failed: no detokenizer replica", rid=rid, waited_s=self.wait_s)
        if self._dirty and now - self._status_at >= STATUS_INTERVAL_S:
            self.out.to_tokenizer(self.status())
            self._status_at, self._dirty = now, False
        return abort

    def shutdown(self) -> None:
        """The scheduler stops: every replica still serving is sent `DetokShutdown`."""
        for rep in self.replicas:
            if rep.serving and not rep.told_to_exit:
                rep.told_to_exit = True
                self.out.to_detokenizer(rep.index, DetokShutdown())

    # ------------------------------------------------------------------ views
    def status(self) -> DetokStatus:
        """The registry, for the tokenizer's status endpoint."""
        reps = list(self.replicas)
        waiting = sum(rec.replica is None for rec in self.records.values())
        return DetokStatus(
            [r.index for r in reps],
            [r.pid for r in reps],
            [r.state for r in reps],
            [r.attached for r in reps],
            [r.load for r in reps],
            [r.routed for r in reps],
            [r.reseeded for r in reps],
            waiting,
            self.failed,
            self.lost_count,
        )

    def check(self) -> None:
        """Assert that each replica's load equals its running requests (tests call this)."""
        counts: dict[int, int] = {}
        for rec in self.records.values():
            assert rec.req.rid in self.records and self.records[rec.req.rid] is rec
            if rec.replica is not None and not rec.closed:
                counts[rec.replica] = counts.get(rec.replica, 0) + 1
        for rep in self.replicas:
            assert rep.load == counts.get(rep.index, 0), f"replica {rep.index}: load {rep.load}, running {counts}"
            assert rep.serving or rep.load == 0

    # ------------------------------------------------------------------ helpers
    def _place(self, rec: Record, rep: Replica) -> None:
        """Seed `rec` on `rep`, replaying every token shown so far (and the finish when the
        scheduler already finished it)."""
        req = rec.req
        rec.replica = rep.index
        req.detokenizer = rep.index
        if not rec.closed:
            rep.load += 1
        if rec.moved:
            rep.reseeded += 1
        else:
            rep.routed += 1
        self._dirty = True
        self.out.to_detokenizer(
            rep.index, DetokSeed(req.rid, req.msg.detok, len(req.input_ids), req.cached_tokens, rec.chars_sent or 0)
        )
        ids = shown_ids(req)
        if ids or rec.closed:
            reason = req.finish_reason if rec.closed else None
            matched = req.matched_stop if rec.closed else None
            lp, start, prompt = req.logprobs.columns(len(ids), True) if req.logprobs else (None, 0, None)
            self.out.to_detokenizer(
                rep.index,
                _token_out(
                    (
                        [req.rid],
                        [list(ids)],
                        [len(req.output_ids)],
                        [reason],
                        [matched],
                        [lp],
                        [prompt],
                        [start],
                        [req.timing],
                    )
                ),
            )

    def _place_waiting(self) -> None:
        """Place requests that wait for a replica (oldest first) while one is live."""
        waiting = [rec for rec in self.records.values() if rec.replica is None and rec.chars_sent is not None]
        waiting.sort(key=lambda rec: rec.since)
        for rec in waiting:
            rep = self.replicas.choose()
            if rep is None:
                return
            self._place(rec, rep)
            if rec.moved:
                self.log.info(
                    "request re-seeded",
                    rid=rec.req.rid,
                    replica=rep.index,
                    chars_sent=rec.chars_sent,
                    tokens=len(rec.req.output_ids),
                )

    def _drop(self, rec: Record) -> None:
        """Forget `rec` (its load too while the scheduler runs it)."""
        if self.records.get(rec.req.rid) is rec:
            del self.records[rec.req.rid]
        if not rec.closed and rec.replica is not None:
            self.replicas.get(rec.replica).load -= 1
        rec.closed = True
        self._dirty = True

    def _release_drained(self) -> None:
        """Send `DetokShutdown` to each draining replica that runs no request any more."""
        for rep in self.replicas:
            if rep.state == ReplicaState.DRAINING and rep.load == 0 and not rep.told_to_exit:
                rep.told_to_exit = True
                self.out.to_detokenizer(rep.index, DetokShutdown())
                self._dirty = True
                self.log.info("drained detokenizer replica released", index=rep.index)


def _token_out(cols: tuple[list, ...]) -> BatchTokenOut:
    """A `BatchTokenOut` from its nine columns; the logprob columns are left empty when no
    row has logprobs, the timings column when no row has a timing."""
    logprobs = any(cols[5]) or any(cols[6])
    timings = cols[8] if any(t is not None for t in cols[8]) else []
    if not logprobs:
        return BatchTokenOut(*cols[:5], timings=timings)
    return BatchTokenOut(*cols[:8], timings=timings)
