"""A fake worker and a list outbox for driving `Scheduler` without sockets or MLX.

`FakeWorker` mirrors `worker_proc.model.runner.ModelRunner` (and the error replies of
`worker_proc.proc.WorkerProcess`) message for message, with integers instead of arrays:

- Launch DECODE: the rids must be exactly the running rows, in order.
- Launch TARGET_VERIFY: the same rows, each with its draft (`ForwardBatch.draft_ids`); a
  row samples its next token, then keeps sampling while the draft agrees with what it
  sampled (the real worker's acceptance), and reports the tokens after the first in
  ``more_token_ids``; `verified` records (launch id, rid, draft, tokens after the first).
- Launch EXTEND / MIXED: rows are routed by *state*: a rid of the running batch is a
  decode row (MIXED only, and then the decode rows must be the whole running batch, in
  order); a rid with a partial prefill is a chunk continuation; any other rid is a new
  prefill and must carry its sampling parameters. A final chunk samples a token and the
  row joins the running batch (new rows appended in row order, after the decode); a
  non-final chunk keeps a partial prefill and yields -1.
- ChainDecode(launch_id, prev): a DECODE of the rows held *now* (after every WorkerAbort
  processed so far); rejected unless prev is the latest started launch and still pending.
  As in the real runner, a chain on an empty running batch raises without storing a
  pending, so its Finalize answers "unknown launch id".
- Launch errors are kept in the pending and reported at Finalize as
  ``RuntimeError: <error>`` (a launch in an unsupported mode as ``ValueError: cannot
  finalize launch in mode X ...``); a Finalize of an unknown id answers ``unknown launch id N``.
- WorkerAbort drops running rows and partial prefills; unknown rids are ignored.

Besides mirroring, it records what a test wants to check: `routes` (how each row was
routed), `prompts` (the whole prompt received per rid), `errors` (launch errors), and
`violations` (breaches of the scheduler's side of the contract that the real worker would
tolerate silently, e.g. sampling parameters resent with a continuation).
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

from protocol.enums import WORKER_FORWARD_MODES, ForwardMode, describe_modes, mode_name
from protocol.messages import (
    ChainDecode,
    Finalize,
    ForwardBatch,
    Launch,
    LaunchResult,
    WorkerAbort,
)


class ListOutbox:
    """Collects everything the scheduler sends; forwards worker messages to a fake worker."""

    def __init__(self) -> None:
        self.worker: list = []
        self.detok: dict[int, list] = defaultdict(list)
        self.tokenizer: list = []
        self.log: list[tuple[str, int | None, object]] = []
        self.sent: list[tuple[str, int | None, object]] = []  # everything, never taken
        self.results: deque[LaunchResult] = deque()  # the worker's replies to forwarded Finalizes
        self.fake_worker: FakeWorker | None = None
        self.links: dict[int, str] = {}  # detokenizer links opened after start-up

    def to_worker(self, msg) -> None:
        self.worker.append(msg)
        self._record("worker", None, msg)
        if self.fake_worker is not None:
            reply = self.fake_worker.handle(msg)
            if reply is not None:
                self.results.append(reply)

    def _record(self, kind: str, index: int | None, msg) -> None:
        self.log.append((kind, index, msg))
        self.sent.append((kind, index, msg))

    def to_detokenizer(self, index: int, msg) -> None:
        self.detok[index].append(msg)
        self._record("detok", index, msg)

    def to_tokenizer(self, msg) -> None:
        self.tokenizer.append(msg)
        self._record("tokenizer", None, msg)

    def connect_detokenizer(self, index: int, endpoint: str) -> None:
        self.links[index] = endpoint
        self._record("connect", index, endpoint)

    def disconnect_detokenizer(self, index: int, flush: bool = False) -> None:
        self.links.pop(index, None)
        self._record("disconnect", index, flush)

    def take(self) -> list[tuple[str, int | None, object]]:
        """The messages sent since the last take."""
        out, self.log = self.log, []
        return out


@dataclass
class FakePending:
    mode: ForwardMode
    rids: list[str]
    tokens: list[int] | None
    error: str = ""
    fail_at_finalize: str = ""
    more: list[list[int]] | None = None


class FakeWorker:
    """See the module docstring. `choose(rid, n)` picks the token for a row's n-th output
    token (n counts the tokens this worker sampled for the rid since its prefill began).
    `fail_next`: the next launch that starts fails at its Finalize with that error."""

    def __init__(self, choose=None) -> None:
        self.rows: list[str] = []
        self.partial: dict[str, list[int]] = {}  # rid -> prompt tokens received so far
        self.pending: dict[int, FakePending] = {}
        self.last_launch_id: int | None = None
        self.sampled: dict[str, list[int]] = defaultdict(list)
        self.prompts: dict[str, list[int]] = {}  # rid -> whole prompt, once its final chunk came
        self.choose = choose or (lambda rid, n: 100 + n)
        self.fail_next = ""
        self.launches: list = []  # Launch and ChainDecode messages, in order
        self.routes: list[tuple[int, str, str]] = []  # (launch_id, rid, prefill|continuation|decode)
        self.errors: list[tuple[int, str]] = []
        self.violations: list[str] = []
        self.unknown_aborts: list[str] = []
        self.max_partials = 0
        self.chained = 0
        self.verified: list[tuple[int, str, list[int], list[int]]] = []

    # ------------------------------------------------------------------ dispatch
    def handle(self, msg):
        """Process one message; returns the LaunchResult for a Finalize, else None."""
        if isinstance(msg, ChainDecode):
            self.launches.append(msg)
            self._chain(msg.launch_id, msg.prev_launch_id)
            return None
        if isinstance(msg, Launch):
            self.launches.append(msg)
            self._launch(msg.launch_id, msg.mode, msg.batch)
            return None
        if isinstance(msg, Finalize):
            return self._finalize(msg.launch_id)
        if isinstance(msg, WorkerAbort):
            for rid in msg.rids:
                if rid not in self.rows and rid not in self.partial:
                    self.unknown_aborts.append(rid)
                self.partial.pop(rid, None)
            gone = set(msg.rids)
            self.rows = [r for r in self.rows if r not in gone]
            return None
        raise AssertionError(f"unexpected message to worker: {msg!r}")

    # ------------------------------------------------------------------ launches
    def _launch(self, launch_id: int, mode, batch: ForwardBatch) -> None:
        try:
            if mode not in WORKER_FORWARD_MODES:
                raise ValueError(
                    f"worker cannot launch forward mode {mode_name(mode)}; supported: {describe_modes(WORKER_FORWARD_MODES)}"
                )
            if mode == ForwardMode.DECODE:
                if list(batch.rids) != self.rows:
                    raise ValueError(
                        f"DECODE rids {batch.rids[:4]}... do not match the worker's running batch {self.rows[:4]}..."
                    )
                if batch.input_ids or batch.sampling or batch.final:
                    self.violations.append(f"launch {launch_id}: DECODE batch carries extend columns")
                tokens = self._decode(launch_id)
            elif mode == ForwardMode.TARGET_VERIFY:
                if list(batch.rids) != self.rows:
                    raise ValueError(f"TARGET_VERIFY rids {batch.rids[:4]}... do not match the running batch")
                tokens, more = self._verify(launch_id, batch)
                self._start(launch_id, mode, list(batch.rids), tokens)
                self.pending[launch_id].more = more
                return
            else:
                tokens = self._extend(launch_id, mode, batch)
        except ValueError as e:
            err = f"{type(e).__name__}: {e}"
            self.pending[launch_id] = FakePending(int(mode), list(batch.rids), None, err)
            self.errors.append((launch_id, err))
            return
        self._start(launch_id, mode, list(batch.rids), tokens)

    def _chain(self, launch_id: int, prev_launch_id: int) -> None:
        if prev_launch_id != self.last_launch_id or prev_launch_id not in self.pending:
            err = (
                f"ValueError: ChainDecode {launch_id} must follow the latest pending launch, got prev={prev_launch_id}"
            )
            self.pending[launch_id] = FakePending(ForwardMode.DECODE, list(self.rows), None, err)
            self.errors.append((launch_id, err))
            return
        try:
            tokens = self._decode(launch_id)
        except ValueError as e:  # the real runner stores no pending here
            self.errors.append((launch_id, f"unstored ValueError: {e}"))
            return
        self.chained += 1
        self._start(launch_id, ForwardMode.DECODE, list(self.rows), tokens)

    def _start(self, launch_id: int, mode: ForwardMode, rids: list[str], tokens: list[int]) -> None:
        self.pending[launch_id] = FakePending(mode, rids, tokens, fail_at_finalize=self.fail_next)
        self.fail_next = ""
        self.last_launch_id = launch_id

    def _sample(self, rid: str) -> int:
        token = self.choose(rid, len(self.sampled[rid]))
        self.sampled[rid].append(token)
        return token

    def _decode(self, launch_id: int) -> list[int]:
        if not self.rows:
            raise ValueError("DECODE with an empty running batch")
        for rid in self.rows:
            self.routes.append((launch_id, rid, "decode"))
        return [self._sample(rid) for rid in self.rows]

    def _verify(self, launch_id: int, batch: ForwardBatch) -> tuple[list[int], list[list[int]]]:
        drafts = list(batch.draft_ids) or [[] for _ in batch.rids]
        if len(drafts) != len(batch.rids):
            raise ValueError("TARGET_VERIFY drafts do not match its rows")
        first, more = [], []
        for rid, draft in zip(batch.rids, drafts):
            self.routes.append((launch_id, rid, "verify"))
            run = [self._sample(rid)]
            for d in draft:
                if d != run[-1]:
                    break
                run.append(self._sample(rid))
            first.append(run[0])
            more.append(run[1:])
            self.verified.append((launch_id, rid, list(draft), run[1:]))
        return first, more

    def _extend(self, launch_id: int, mode: ForwardMode, batch: ForwardBatch) -> list[int]:
        rids = list(batch.rids)
        n = len(rids)
        if not n or len(batch.input_ids) != n or len(batch.sampling) != n or len(batch.final) != n:
            raise ValueError("EXTEND batch needs input_ids, sampling and final for every rid")
        if len(set(rids)) != n:
            self.violations.append(f"launch {launch_id}: a rid appears twice in {rids}")
        running = set(self.rows)
        decode_rows = [i for i, rid in enumerate(rids) if rid in running]
        if decode_rows:
            if mode != ForwardMode.MIXED:
                raise ValueError(f"request {rids[decode_rows[0]]!r} is decoding; only MIXED batches hold decode rows")
            if [rids[i] for i in decode_rows] != self.rows:
                raise ValueError("a MIXED batch must hold every running request, in batch order")
            if decode_rows != list(range(len(decode_rows))):
                self.violations.append(f"launch {launch_id}: MIXED decode rows are not first: {decode_rows}")
            for i in decode_rows:
                if batch.input_ids[i] or batch.sampling[i] is not None or not batch.final[i]:
                    self.violations.append(f"launch {launch_id}: decode row {rids[i]} carries extend columns")
        out: list[int | None] = [None] * n
        if decode_rows:
            for i, token in zip(decode_rows, self._decode(launch_id)):
                out[i] = token
        new: list[tuple[int, str, list[int]]] = []
        for i, rid in enumerate(rids):
            if rid in running:
                continue
            ids = list(batch.input_ids[i])
            if not ids:
                raise ValueError(f"request {rid!r} has an empty chunk")
            part = self.partial.pop(rid, None)
            if part is None:  # unseen: a prefill
                if batch.sampling[i] is None:
                    raise ValueError(f"request {rid!r} is unseen but came without sampling parameters")
                part = []
                self.sampled[rid] = []
                self.routes.append((launch_id, rid, "prefill"))
            else:
                if batch.sampling[i] is not None:
                    self.violations.append(f"launch {launch_id}: sampling resent with a continuation of {rid}")
                self.routes.append((launch_id, rid, "continuation"))
            part = part + ids
            if not batch.final[i]:
                self.partial[rid] = part
                continue
            new.append((i, rid, part))
        for i, rid, part in new:
            self.prompts[rid] = part
            out[i] = self._sample(rid)
        self.rows += [rid for _, rid, _ in new]
        self.max_partials = max(self.max_partials, len(self.partial))
        return [-1 if t is None else t for t in out]

    # ------------------------------------------------------------------ finalize
    def _finalize(self, launch_id: int) -> LaunchResult:
        p = self.pending.pop(launch_id, None)
        if p is None:
            return LaunchResult(launch_id, [], [], f"unknown launch id {launch_id}")
        if p.mode not in WORKER_FORWARD_MODES:
            return LaunchResult(
                launch_id,
                [],
                [],
                f"ValueError: cannot finalize launch in mode {mode_name(p.mode)}; "
                f"supported: {describe_modes(WORKER_FORWARD_MODES)}",
            )
        if p.error:
            return LaunchResult(launch_id, [], [], f"RuntimeError: {p.error}")
        if p.fail_at_finalize:
            return LaunchResult(launch_id, [], [], p.fail_at_finalize)
        return LaunchResult(launch_id, list(p.rids), list(p.tokens), more_token_ids=p.more or [])

    def holds(self) -> set[str]:
        """Every rid this worker keeps state for (running rows and partial prefills)."""
        return set(self.rows) | set(self.partial)
