"""`Scheduler`: continuous batching, finish checks and detokenizer routing, without sockets.

The process loop (`proc.py`) feeds it messages and launch results; it answers through an
`Outbox`. Policy: new requests are prefilled (EXTEND) as soon as they fit under
`max_running_requests` and the prefill token budget, then join the running DECODE batch,
whose row order always equals the worker's.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from protocol.enums import (
    WORKER_FORWARD_MODES,
    FinishReason,
    ForwardMode,
    ReqField,
    describe_modes,
    mode_name,
)
from protocol.messages import (
    AbortReq,
    ChainDecode,
    GenerateReq,
    Launch,
    LaunchResult,
    ReqError,
    SchedulerStats,
    StoreKV,
    WorkerAbort,
)
from scheduler_proc.deadlines import CHECK_INTERVAL_S, Deadlines
from scheduler_proc.logprobs import position
from scheduler_proc.mem.kv_memory import KVMemory
from scheduler_proc.outbox import Outbox
from scheduler_proc.reasoning_budget import BudgetRow
from scheduler_proc.replicas.router import DetokRouter, NullLog
from scheduler_proc.req import Req
from scheduler_proc.schedule_batch import ScheduleBatch
from scheduler_proc.spec.speculator import Speculator

GRAMMAR_DEAD_END = (
    "structured output cannot go on: after {n} output tokens the grammar allows no next token and "
    "the output is not complete, so a part of the grammar matches no text (such as an empty "
    "character class like [^\\s\\S] in a regex)"
)
"""The 400 of a request whose grammar reached a dead end (`RowGrammar.dead_end`); it ended
with finish_reason "stop" and the output cut there (``ab`` for the regex ``ab[^\\s\\S]``)."""


class Scheduler:
    """Holds waiting and running requests; decides each launch and every finish.

    max_running_requests: requests decoding or being prefilled at most; max_prefill_tokens:
    prompt tokens one EXTEND launch takes at most when chunking is off (a longer single
    prompt still runs alone); chunked_prefill_size: when > 0, the token budget of one
    extend launch, longer prompts being split into chunks (one request chunked at a time);
    enable_mixed_chunk: fold the running decodes into each extend launch (MIXED);
    detokenizers: number of replicas to route between; memory: the KV slot accounting
    (default: a large pool without prefix caching, for tests that do not look at memory);
    grammar: compiles structured-output grammars off the loop (a
    `scheduler_proc.grammar.GrammarBackend`: ``submit(spec) -> Future`` of a compiled
    grammar, ``matcher(compiled)`` -> a request's matcher with ``accept(token) -> bool``,
    ``terminated``, ``next_mask() -> bytes`` and ``dead_end``; None: requests with a grammar get a 400);
    logit_processors: the custom logit processors the worker loaded (a request naming
    another gets a 400); vocab_size: the model's logit width, for the forced-token masks
    of reasoning budgets (0: requests with a budget get a 400); state_interval: for a model
    with recurrent layers and state slots in `memory`, the recurrent state is snapshotted at
    the multiples of this many prompt tokens (``--mamba-cache-chunk-size``; 0: none).
    speculator: speculative decoding (`scheduler_proc.spec.speculator.Speculator`: the running
    requests' drafts, verified in TARGET_VERIFY launches; None: off).
    deadlines: the queue and stall bounds `expire` enforces; clock: monotonic seconds (tests
    pass a fake); log: a structlog-like logger.

    Requests wait in `held` (not in the queue, so they block nobody) while their grammar
    compiles or, for choice i > 0 of an n > 1 request, until choice 0's prompt is prefilled
    (then the prefix cache serves theirs).

    Raises `NotImplementedError` naming the flag when the flags need a forward mode the
    worker cannot run (DESIGN.md §4).
    """

    def __init__(
        self,
        outbox: Outbox,
        *,
        max_running_requests: int,
        max_prefill_tokens: int,
        detokenizers: int,
        chunked_prefill_size: int = 0,
        enable_mixed_chunk: bool = False,
        memory: KVMemory | None = None,
        grammar=None,
        logit_processors: frozenset[str] = frozenset(),
        vocab_size: int = 0,
        state_interval: int = 0,
        speculator: Speculator | None = None,
        deadlines: Deadlines = Deadlines(),
        clock: Callable[[], float] = time.monotonic,
        log=None,
    ) -> None:
        if enable_mixed_chunk and ForwardMode.MIXED not in WORKER_FORWARD_MODES:
            raise NotImplementedError(
                f"--enable-mixed-chunk needs forward mode MIXED; worker supports: {describe_modes(WORKER_FORWARD_MODES)}"
            )
        if speculator is not None and ForwardMode.TARGET_VERIFY not in WORKER_FORWARD_MODES:
            raise NotImplementedError(
                "--speculative-algorithm needs forward mode TARGET_VERIFY; worker supports: "
                f"{describe_modes(WORKER_FORWARD_MODES)}"
            )
        self.out = outbox
        self.max_running = max_running_requests
        self.max_prefill_tokens = max_prefill_tokens
        self.chunked_prefill_size = chunked_prefill_size
        self.enable_mixed_chunk = enable_mixed_chunk
        self.detok = DetokRouter(outbox, detokenizers)
        self.waiting: deque[Req] = deque()
        self.held: list[Req] = []
        self.grammar = grammar
        self.logit_processors = logit_processors
        self.vocab_size = vocab_size
        self.state_interval = state_interval
        self.spec = speculator
        self._last_cap: int | None = None  # the draft cap of the last decode-type result, for `spec.speed`
        self.running: list[Req] = []
        self.chunked_req: Req | None = None
        self.mem = memory or KVMemory(1 << 18, max_running_requests + 1, 1 << 14, radix=False)
        self.reqs: dict[str, Req] = {}
        self.next_launch_id = 1
        self.finished_count = 0
        self.deadlines, self.clock, self.log = deadlines, clock, log or NullLog()
        self._expire_at = float("-inf")
        self._decode_owed = False  # see `next_batch`
        self.result_at = self.clock()
        """When the latest launch result came (or the scheduler started): the worker's progress,
        which `expire` judges stalls by."""

    @property
    def detok_load(self) -> list[int]:
        """Running requests per detokenizer replica index (see `DetokRouter`)."""
        return self.detok.loads()

    # ------------------------------------------------------------------ inputs
    def add_request(self, msg: GenerateReq) -> None:
        """Queue a new request; a duplicate rid is refused with a 400 to the tokenizer."""
        if msg.rid in self.reqs:
            self.out.to_tokenizer(ReqError(msg.rid, 400, f"request id {msg.rid!r} is already in use", ReqField.RID))
            return
        if len(msg.input_ids) + 1 > self.mem.total:
            self.out.to_tokenizer(
                ReqError(
                    msg.rid,
                    400,
                    f"the prompt has {len(msg.input_ids)} tokens; the KV cache can ever hold "
                    f"{self.mem.total}, the prompt and at least one generated token: send at most "
                    f"{self.mem.total - 1} prompt tokens (the server's --max-total-tokens and "
                    "--mem-fraction-static size the cache)",
                    ReqField.PROMPT,
                )
            )
            return
        if msg.grammar is not None and self.grammar is None:
            self.out.to_tokenizer(
                ReqError(msg.rid, 400, "structured output is not available on this server", ReqField.GRAMMAR)
            )
            return
        budget = None
        if msg.reasoning_budget is not None:
            try:
                if msg.grammar is not None:
                    raise ValueError("a reasoning budget cannot be combined with structured output")
                budget = BudgetRow(msg.reasoning_budget, self.vocab_size)
            except ValueError as e:
                self.out.to_tokenizer(ReqError(msg.rid, 400, str(e), ReqField.REASONING_BUDGET))
                return
        name = msg.sampling.logit_processor
        if name and name not in self.logit_processors:
            self.out.to_tokenizer(
                ReqError(
                    msg.rid,
                    400,
                    f"unknown custom logit processor {name!r}; this server has: {sorted(self.logit_processors)}",
                    ReqField.LOGIT_PROCESSOR,
                )
            )
            return
        req = Req.from_msg(msg, self.clock())
        req.budget = budget
        self.reqs[req.rid] = req
        if (req.max_new_tokens <= 0 and not req.scores_prompt) or not req.input_ids:
            self._route(req)
            self._finish(req, FinishReason.LENGTH, emit=[])
            return
        if msg.grammar is not None:
            req.grammar_future = self.grammar.submit(msg.grammar)
        if msg.grammar is not None or msg.group:
            self.held.append(req)
        else:
            self.waiting.append(req)

    def _promote_held(self) -> None:
        """Queue the held requests that are ready: grammar compiled (a failed compile ends
        the request with a 400), n > 1 group leader's prompt prefilled (or gone)."""
        if not self.held:
            return
        still = []
        for req in self.held:
            fut = req.grammar_future
            if fut is not None:
                if not fut.done():
                    still.append(req)
                    continue
                req.grammar_future = None
                try:
                    req.grammar = self.grammar.matcher(fut.result())
                except Exception as e:  # GrammarError (a ValueError): xgrammar rejects it for this vocabulary
                    status = 400 if isinstance(e, ValueError) and not isinstance(e, OSError) else 500
                    self.out.to_tokenizer(
                        ReqError(
                            req.rid,
                            status,
                            f"invalid grammar: {e}"
                            if status == 400
                            else f"structured output failed: {type(e).__name__}: {e}",
                            ReqField.GRAMMAR if status == 400 else ReqField.NONE,
                        )
                    )
                    self._close(req, FinishReason.ABORT)
                    continue
            leader = self.reqs.get(req.msg.group) if req.msg.group else None
            if (
                leader is not None
                and not leader.finished
                and (leader in self.waiting or leader in self.held or leader.prefilled < len(leader.fill_ids))
            ):
                still.append(req)
                continue
            self.waiting.append(req)
        self.held = still

    def abort(self, msg: AbortReq) -> None:
        """End a request early (idempotent; unknown rids are ignored).

        reason ABORT: the client left; STOP: the detokenizer matched a stop string (it has
        already sent the final text and forgotten the request).
        """
        req = self.reqs.get(msg.rid)
        if req is None or req.finished:
            return
        if req in self.waiting or req in self.held:
            (self.waiting if req in self.waiting else self.held).remove(req)
            if msg.reason == FinishReason.ABORT:  # a retracted request waits, yet its replica holds its text
                self.detok.abort(req)
            self._close(req, msg.reason)
            return
        if req is self.chunked_req:
            self.chunked_req = None
        if req in self.running:  # else its EXTEND is in flight; the worker drops it on this abort
            self.running.remove(req)
        self._release(req)
        self.out.to_worker(WorkerAbort([req.rid]))
        if msg.reason == FinishReason.ABORT:
            self.detok.abort(req)
        self._close(req, msg.reason)

    # ------------------------------------------------------------------ batches
    def wants_extend(self) -> bool:
        """True when a prompt (or its next chunk) could be prefilled now (held requests that
        became ready are queued first)."""
        self._promote_held()
        return self.chunked_req is not None or (bool(self.waiting) and self._room() > 0)

    def _room(self) -> int:
        return self.max_running - len(self.running) - (self.chunked_req is not None)

    def next_batch(self) -> ScheduleBatch | None:
        """The next launch: an EXTEND (or MIXED) of prompts and chunks if any fit, else a
        DECODE of the running requests, else None (IDLE: nothing is sent).

        A pure EXTEND launched while requests were decoding owes them a turn: the next launch
        is their DECODE. Prefill first (SGLang's order) otherwise starved them for as long as
        prompts kept coming (a batch of 64 prompts of 1,000 tokens held a stream's next token
        for minutes on a CPU); now a decoding request waits at most one extend launch (at most
        ``chunked_prefill_size`` prompt tokens) for its next token. A burst reaching an idle
        server is still prefilled in one launch where it fits."""
        owed, self._decode_owed = self._decode_owed, False
        if owed and (batch := self._decode_batch()) is not None:
            return batch
        if self.wants_extend():
            batch = self._extend_batch()
            if batch is not None:
                self._decode_owed = batch.mode == ForwardMode.EXTEND and bool(self.running)
                return batch
        return self._decode_batch()

    def _decode_batch(self) -> ScheduleBatch | None:
        """A DECODE of the running requests, with a slot each (retracting when the pool is
        short, see `_alloc_decode`), or None when none runs or none can. With speculative
        decoding on for this batch, a TARGET_VERIFY of their drafts instead (`_verify_batch`)."""
        if self.running and self._alloc_decode(retract=True):
            if self.spec is not None and (cap := self.spec.take(len(self.running))):
                return self._verify_batch(cap)
            return ScheduleBatch(ForwardMode.DECODE, list(self.running))
        return None

    def _verify_batch(self, cap: int) -> ScheduleBatch:
        """The running requests' drafts of at most `cap` tokens (`Speculator.draft`), each
        draft token with a KV slot (a draft the pool cannot hold is dropped; called after
        `_alloc_decode`): a TARGET_VERIFY, or a DECODE when no request has a draft."""
        drafts = []
        for req in self.running:
            d = self.spec.draft(req, cap)
            drafts.append(d if d and self.mem.alloc(req.kv, len(d)) else [])
        if not any(drafts):
            return ScheduleBatch(ForwardMode.DECODE, list(self.running), draft_cap=cap)
        return ScheduleBatch(ForwardMode.TARGET_VERIFY, list(self.running), drafts=drafts, draft_cap=cap)

    def _alloc_decode(self, retract: bool) -> bool:
        """Give every running request a slot for the token it decodes next. When the pool
        cannot (even after evicting cache), retract the newest requests if `retract` (first
        the one being prefilled in chunks, which holds slots too), else return False with
        nothing taken."""
        while len(self.running) > self.mem.available:
            if not retract:
                return False
            if self.chunked_req is not None:  # the newest: its prefill waits, the decodes go on
                self._retract(self.chunked_req)
                continue
            if len(self.running) == 1:  # it alone fills the pool: it cannot grow, ever
                req = self.running.pop()
                self._release(req)
                self.out.to_worker(WorkerAbort([req.rid]))
                self._finish(req, FinishReason.LENGTH, emit=[])
                return False
            self._retract(self.running[-1])
        for req in self.running:
            if not self.mem.alloc(req.kv, 1):
                raise AssertionError("decode slot allocation failed after the availability check")
        return True

    def _retract(self, req: Req) -> None:
        """Free the KV of a running request, or of the request being prefilled in chunks, and
        put it back at the head of the queue: it is prefilled again (prompt plus the tokens
        it generated) and continues; never dropped. A request retracted before its first
        token drops the prompt logprobs of its chunks so far (its new prefill computes them)."""
        if req is self.chunked_req:
            self.chunked_req = None
            if req.logprobs is not None:
                req.logprobs.prompt.clear()
        else:
            self.running.remove(req)
        self._release(req)
        self.out.to_worker(WorkerAbort([req.rid]))
        req.fill_ids = req.input_ids + req.output_ids
        req.prefilled = 0
        req.progress_at = self.clock()
        self.waiting.appendleft(req)
        self.mem.stats.retractions += 1

    def _take_chunk(self, req: Req, n: int, reqs: list, chunks: list) -> bool:
        """Add the next `n` prefill tokens of `req` as a row, with their slots; False (nothing
        added) when the pool cannot hold them. With state snapshots, a snapshot slot is
        taken for each multiple of `state_interval` the chunk reaches, for the prompt's end
        (where a next turn, the prompt plus more, resumes) and for the position before it
        (where an exact repeat resumes: a match stops one token short of the prompt, whose
        last position must be computed for its logits); a request scoring its prompt takes
        none."""
        start = req.prefilled
        if not self.mem.alloc(req.kv, n):
            return False
        req.prefilled = start + n
        if self.state_interval and self.mem.states is not None and not req.scores_prompt:
            end = len(req.fill_ids)
            for position in range(
                (start // self.state_interval + 1) * self.state_interval,
                min(req.prefilled, end - 1) + 1,
                self.state_interval,
            ):
                self.mem.snapshot(req.kv, position)
            if start < end - 1 <= req.prefilled and (end - 1) % self.state_interval:
                self.mem.snapshot(req.kv, end - 1)
            if req.prefilled == end:
                self.mem.snapshot(req.kv, end)
        reqs.append(req)
        chunks.append((start, req.prefilled))
        self.chunked_req = req if req.prefilled < len(req.fill_ids) else None
        return True

    def _admit(self, req: Req) -> bool:
        """Match `req`'s cached prefix and take its table row; False when no row is free."""
        kv = self.mem.begin(req.fill_ids, req.max_prefix, req.msg.cache_salt)
        if kv is None:
            return False
        req.kv, req.prefilled = kv, kv.prefix_len
        return True

    def _extend_batch(self) -> ScheduleBatch | None:
        """Admit prompts under the token budget (the `PrefillAdder` policy): first the next
        chunk of the request being chunked, then whole waiting prompts, then at most one
        new chunked request."""
        chunking = self.chunked_prefill_size > 0
        budget = self.chunked_prefill_size if chunking else self.max_prefill_tokens
        room = self._room()
        reqs: list[Req] = []
        chunks: list[tuple[int, int] | None] = []
        mixed = self.enable_mixed_chunk and bool(self.running)
        if mixed and len(self.running) > self.mem.available:
            mixed = False  # the decodes' slots come first: let a plain DECODE retract
        reserve = len(self.running) if mixed else 0
        if self.chunked_req is not None:
            req = self.chunked_req
            n = min(budget, len(req.fill_ids) - req.prefilled)
            if self.mem.available - reserve >= n and self._take_chunk(req, n, reqs, chunks):
                budget = 0 if req is self.chunked_req else budget - n  # still chunked: nobody else starts one
            else:
                budget = 0
        while self.waiting and room > 0 and budget > 0:
            req = self.waiting[0]
            if not self._admit(req):
                break
            n = len(req.fill_ids) - req.prefilled
            if n > budget and not chunking and reqs:
                self._release(req)
                break
            take = min(n, budget) if chunking else n
            if self.mem.available - reserve < take or not self._take_chunk(req, take, reqs, chunks):
                self._release(req)
                break
            self.waiting.popleft()
            self.mem.admitted(req.kv, len(req.fill_ids))
            req.progress_at = self.clock()
            if req.admitted_at is None:
                req.admitted_at = req.progress_at
            if req.detokenizer < 0:  # first admission (a retracted request keeps its replica)
                req.cached_tokens = req.kv.prefix_len
                self._route(req)
            budget = 0 if req is self.chunked_req else budget - n  # at most one new chunked request
            room -= 1
        if not reqs:
            return None
        if mixed:
            self._alloc_decode(retract=False)
            return ScheduleBatch(ForwardMode.MIXED, self.running + reqs, [None] * len(self.running) + chunks)
        return ScheduleBatch(ForwardMode.EXTEND, reqs, chunks)

    def can_chain(self, last: ScheduleBatch) -> bool:
        """True when the next launch may be a decode chained on `last`'s lazy tokens: `last`
        is a pure decode of exactly the running requests (nothing finished or aborted since),
        nothing waits to be prefilled, and no row samples under a grammar or a custom logit
        processor (they read the token being computed), and speculative decoding is off for
        the batch (a verify's drafts come from the tokens of the launch before it)."""
        return (
            last.mode == ForwardMode.DECODE
            and last.reqs == self.running
            and not self.wants_extend()
            and len(self.running) <= self.mem.available
            and not any(r.reads_last_token for r in self.running)
            and (self.spec is None or not self.spec.decide(len(self.running)))
        )

    def chain(self, last: ScheduleBatch) -> tuple[ScheduleBatch, ChainDecode]:
        """The decode that follows `last` before `last` is finalized, and its message
        (call only when `can_chain(last)`)."""
        self._alloc_decode(retract=False)
        if self.spec is not None:
            self.spec.take(len(self.running))
        batch = ScheduleBatch(ForwardMode.DECODE, list(self.running), launch_id=self._new_launch_id())
        return batch, ChainDecode(batch.launch_id, last.launch_id)

    def _new_launch_id(self) -> int:
        self.next_launch_id += 1
        return self.next_launch_id - 1

    def next_launch(self) -> tuple[ScheduleBatch, Launch] | None:
        """The next batch to run and the message that starts it; None when nothing is to run.

        A batch in a forward mode the worker does not support (DESIGN.md §4) is not sent:
        the refusal is logged and the batch's requests fail with a 500 carrying `launch`'s
        message (it names the mode and the supported set); their KV is released and the next
        batch is formed, so the server keeps serving.
        """
        while (batch := self.next_batch()) is not None:
            try:
                return batch, self.launch(batch)
            except ValueError as e:
                self.log.error("refused to launch a batch", error=str(e), requests=len(batch.reqs))
                self._fail_batch(batch, str(e))
        return None

    def launch(self, batch: ScheduleBatch) -> Launch:
        """Assign a launch id and return the message that starts `batch`.

        Raises `ValueError` for a mode the worker does not support (checked before sending).
        """
        if batch.mode not in WORKER_FORWARD_MODES:
            raise ValueError(
                f"scheduler will not send forward mode {mode_name(batch.mode)}; worker supports: {describe_modes(WORKER_FORWARD_MODES)}"
            )
        batch.launch_id = self._new_launch_id()
        return Launch(batch.launch_id, batch.mode, batch.to_forward_batch())

    def process_result(self, batch: ScheduleBatch, result: LaunchResult) -> None:
        """Apply launch `batch`'s sampled tokens: finish checks, token routing, worker frees.

        Rows of requests that ended while the launch was in flight are skipped (their extra
        token is never shown); non-final chunks yield no token. A row sampled under a grammar
        mask that allowed no token (`GRAMMAR_DEAD_END`) fails its request with a 400. A
        TARGET_VERIFY row yields its first token and its accepted run (`more_token_ids`):
        the slots of the draft tokens not accepted are freed, and the tokens are taken in
        order until one ends the request (an EOS, a stop token, max_tokens: the rest is
        dropped).
        """
        before, self.result_at = self.result_at, self.clock()
        if result.error:
            self._fail_batch(batch, f"model execution failed: {result.error}")
            return
        if batch.mode not in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY):
            joined = [
                r
                for i, r in enumerate(batch.reqs)
                if batch.chunks[i] is not None and batch.is_final(i) and not r.finished
            ]
            self.running += joined
            self._cache_prompts(joined)
        for req, err in zip(batch.reqs, result.row_errors):
            if err and not req.finished:  # its custom logit processor failed: the request chose it
                self._fail_req(req, err, 400, field=ReqField.LOGIT_PROCESSOR)
        self._take_prompt_logprobs(batch, result)
        now = self.clock()
        rows: list[tuple[Req, list[int]]] = []
        done: list[Req] = []
        produced_total = 0
        for i, (req, token) in enumerate(zip(batch.reqs, result.next_token_ids)):
            req.progress_at = now
            if req.finished or not batch.is_final(i):
                continue
            if req.first_token_at is None:
                req.first_token_at = now
            if req.grammar is not None and req.grammar.dead_end:
                self._fail_req(req, GRAMMAR_DEAD_END.format(n=len(req.output_ids)), 400, field=ReqField.GRAMMAR)
                continue
            more = result.more_token_ids[i] if result.more_token_ids else []
            if batch.drafts and batch.drafts[i]:
                self.mem.trim(req.kv, len(batch.drafts[i]) - len(more))
                self.spec.verified(req, len(batch.drafts[i]), len(more))
            show = []
            for j, tok in enumerate([token, *more]):
                produced = req.check_finish(tok)
                produced_total += produced
                if produced and req.shows(tok):
                    show.append(tok)
                if produced and req.logprobs is not None:  # an ending EOS too: usage counts it
                    lp = result.logprobs[i] if j == 0 and result.logprobs else None
                    if j and result.more_logprobs and (run := result.more_logprobs[i]) is not None:
                        lp = position(run, j - 1)
                    if lp is not None:
                        req.logprobs.output.append(lp)
                if req.finished:
                    break
            rows.append((req, show))
            if req.finished:
                done.append(req)
        self._measure(batch, produced_total, now - before)
        self.detok.tokens(rows)
        if done:
            gone = set(done)
            self.running = [r for r in self.running if r not in gone]
            stores = [(r.rid, *self._release(r, cache=True)) for r in done]
            stores = [x for x in stores if x[2] or x[3]]
            if stores:
                states = [x[3] for x in stores]
                self.out.to_worker(
                    StoreKV(
                        [x[0] for x in stores],
                        [x[1] for x in stores],
                        [x[2] for x in stores],
                        states if any(states) else [],
                    )
                )
            self.out.to_worker(WorkerAbort([r.rid for r in done]))
            for r in done:
                self._close(r, r.finish_reason)

    def _measure(self, batch: ScheduleBatch, tokens: int, seconds: float) -> None:
        """Feed the speculation speed policy a decode-type launch's tokens and its time from
        the previous result, when the previous result was a launch of the same mode."""
        if self.spec is None:
            return
        if batch.mode not in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY):
            self._last_cap = None
            return
        if self._last_cap == batch.draft_cap:
            self.spec.speed.record(len(batch.reqs), batch.draft_cap, tokens, seconds)
        self._last_cap = batch.draft_cap
        for size, cap, rates in self.spec.speed.switches:
            self.log.debug(
                "speculation cap",
                batch_size_bucket=size,
                cap=cap,
                tokens_per_s={c: round(r, 1) for c, r in rates.items()},
            )
        self.spec.speed.switches.clear()

    @staticmethod
    def _take_prompt_logprobs(batch: ScheduleBatch, result: LaunchResult) -> None:
        """Keep the prompt logprobs of the chunks this launch computed (only while a
        request has no output: a retracted request's recomputed prompt is not reported)."""
        for req, lp in zip(batch.reqs, result.prompt_logprobs):
            if lp is not None and req.logprobs is not None and not req.output_ids and not req.finished:
                req.logprobs.prompt.append(lp)

    def stats(self) -> SchedulerStats:
        """The current gauges and counters (see `SchedulerStats`); running counts the request
        being prefilled in chunks (it is not in the decode batch until its last chunk)."""
        m = self.mem
        chunking = self.chunked_req is not None and self.chunked_req not in self.running
        c = self.spec.counters if self.spec is not None else None
        return SchedulerStats(
            len(self.running) + chunking,
            len(self.waiting),
            m.total,
            m.allocator.free_count,
            m.radix.total_size,
            m.held,
            m.stats.prompt_tokens,
            m.stats.cached_tokens,
            m.stats.retractions,
            self.finished_count,
            **(
                dict(
                    spec_drafts_total=c.drafts,
                    spec_draft_tokens_total=c.draft_tokens,
                    spec_accepted_tokens_total=c.accepted_tokens,
                    spec_accept_lengths=list(c.accept_lengths),
                )
                if c is not None
                else {}
            ),
        )

    def expire(self) -> None:
        """Fail the requests past a deadline with a 503, logging each one's state (see
        `scheduler_proc.deadlines`). Call it every loop turn, also while a launch is in
        flight; it looks at most every `CHECK_INTERVAL_S`."""
        d = self.deadlines
        now = self.clock()
        if (d.queue_timeout is None and not d.stall_timeout) or now - self._expire_at < CHECK_INTERVAL_S:
            return
        self._expire_at = now
        for req in list(self.reqs.values()):
            queued = req.kv is None  # waiting, held or retracted: not admitted now
            if queued and req.admitted_at is None and d.queue_expired(now - req.arrived_at):
                self.log.warning("request timed out in the queue; failing it", **self.describe(req, now))
                self._fail_req(
                    req,
                    f"request timed out in the queue: it waited {now - req.arrived_at:.1f} s without "
                    f"being admitted (--queue-timeout {d.queue_timeout:g} s); retry later",
                    503,
                )
                continue
            bound = d.stall_bound(queued)
            idle = now - max(req.progress_at, self.result_at)  # waiting behind work the worker does is no stall
            if bound is not None and idle > bound:
                state = self.describe(req, now)
                self.log.warning(
                    "request stalled: no progress; failing it",
                    bound_s=bound,
                    worker_idle_s=round(now - self.result_at, 3),
                    **state,
                )
                self._fail_req(
                    req,
                    f"request made no progress for {now - req.progress_at:.1f} s while "
                    f"{state['state']}, and the worker returned no result for "
                    f"{now - self.result_at:.1f} s (bound {bound:g} s, --stall-timeout); the server "
                    f"may be stuck",
                    503,
                    detok_reason="stalled",
                )

    def describe(self, req: Req, now: float) -> dict:
        """`req`'s state for a log line: where it is (held: its grammar compiles or it waits
        for its n > 1 leader; queued: waiting, maybe retracted; prefilling; decoding), its
        age and time without progress, its prefill progress, output and KV slots, and the
        scheduler's load."""
        where = (
            "held"
            if req in self.held
            else "queued"
            if req.kv is None
            else "decoding"
            if req in self.running
            else "prefilling"
        )
        return dict(
            rid=req.rid,
            state=where,
            age_s=round(now - req.arrived_at, 3),
            idle_s=round(now - req.progress_at, 3),
            prompt_tokens=len(req.input_ids),
            prefilled=req.prefilled,
            to_prefill=len(req.fill_ids),
            output_tokens=len(req.output_ids),
            kv_slots=req.kv.kv_len if req.kv is not None else 0,
            cached_tokens=req.cached_tokens,
            detokenizer=req.detokenizer,
            running=len(self.running),
            waiting=len(self.waiting),
            kv_free=self.mem.allocator.free_count,
        )

    def fail_all(self, message: str, status: int = 503) -> None:
        """Fail every request held (shutdown): errors to the tokenizer, state dropped."""
        for req in list(self.reqs.values()):  # waiting, running and those in flight
            self._release(req)
            self.out.to_tokenizer(ReqError(req.rid, status, message))
            self.detok.abort(req)
            self._close(req, FinishReason.ABORT)
        self.waiting.clear()
        self.held.clear()
        self.running.clear()
        self.chunked_req = None

    def worker_lost(self, reason: str) -> int:
        """The worker died: every request on the device (holding KV: prefilling, chunked,
        decoding, or in a launch in flight) fails with a 503 carrying `reason`; waiting and
        held requests stay queued (a retracted one resumes from its tokens). Nothing is sent
        to the worker. Call `worker_ready` before the next batch. Returns how many failed."""
        lost = [r for r in self.reqs.values() if r.kv is not None or r in self.running or r is self.chunked_req]
        for req in lost:
            self._release(req)
            self.out.to_tokenizer(ReqError(req.rid, 503, reason))
            self.detok.abort(req)
            self._close(req, FinishReason.ABORT)
        self.running.clear()
        self.chunked_req = None
        return len(lost)

    def worker_ready(self, memory: KVMemory) -> None:
        """A new worker serves: account its KV pool with `memory` (an empty prefix cache; the
        counters of /metrics carry over). Call after `worker_lost`, when no request holds KV."""
        assert not self.running and all(r.kv is None for r in self.reqs.values()), "worker_lost first"
        memory.stats = self.mem.stats
        self.mem = memory

    # ------------------------------------------------------------------ helpers
    def _route(self, req: Req) -> None:
        """Choose the least-loaded detokenizer replica and seed it with the request."""
        self.detok.start(req)

    def _cache_prompts(self, reqs: list[Req]) -> None:
        """Put just-prefilled prompts into the radix cache and have the worker store their KV
        now, so that requests admitted before these finish share them."""
        stores = [(r.rid, *self.mem.cache_prompt(r.kv, r.fill_ids)) for r in reqs]
        stores = [x for x in stores if x[2]]
        if stores:
            self.out.to_worker(StoreKV([x[0] for x in stores], [x[1] for x in stores], [x[2] for x in stores]))

    def _release(self, req: Req, cache: bool = False) -> tuple[int, list[int], int]:
        """Free `req`'s KV slots (no-op when it holds none). cache: insert its computed
        tokens into the radix cache; returns (start, slots) the worker must store, and the
        state slot of its end snapshot (0: none; `KVMemory`)."""
        if req.kv is None:
            return 0, [], 0
        kv, req.kv = req.kv, None
        if not cache:
            return *self.mem.release(kv), 0
        seq = req.input_ids + req.output_ids
        computed = len(seq) - 1 if req.output_ids else len(seq)  # the last output token's KV never is
        return *self.mem.release(kv, seq[: min(computed, kv.kv_len)]), kv.end_state

    def _finish(self, req: Req, reason: FinishReason, emit: list[int]) -> None:
        req.finish_reason = reason
        self.detok.tokens([(req, emit)])
        self._close(req, reason)

    def _close(self, req: Req, reason: FinishReason) -> None:
        req.finish_reason = reason
        self.detok.close(req)
        self.reqs.pop(req.rid, None)
        self.finished_count += 1

    def _fail_req(
        self, req: Req, error: str, status: int = 500, detok_reason: str = "", field: ReqField = ReqField.NONE
    ) -> None:
        """End one request with `status` carrying `error`, wherever it is (queued, held,
        prefilling, decoding); the others go on. detok_reason: see `DetokAbort.reason`;
        field: the request field at fault (`ReqError.field`)."""
        for group in (self.waiting, self.held, self.running):
            if req in group:
                group.remove(req)
        if req is self.chunked_req:
            self.chunked_req = None
        if req.kv is not None:  # admitted: the worker knows it
            self._release(req)
            self.out.to_worker(WorkerAbort([req.rid]))
        self.out.to_tokenizer(ReqError(req.rid, status, error, field))
        self.detok.abort(req, detok_reason)
        self._close(req, FinishReason.ABORT)

    def _fail_batch(self, batch: ScheduleBatch, error: str) -> None:
        """End every request of `batch` that has not ended with a 500 carrying `error`,
        releasing its KV (the worker is told to drop the rows it holds)."""
        live = [r for r in batch.reqs if not r.finished]
        gone = set(live)
        self.running = [r for r in self.running if r not in gone]
        if self.chunked_req in gone:
            self.chunked_req = None
        for r in live:
            self._release(r)
        if live:
            self.out.to_worker(WorkerAbort([r.rid for r in live]))
        for r in live:
            self.out.to_tokenizer(ReqError(r.rid, 500, error))
            self.detok.abort(r)
            self._close(r, FinishReason.ABORT)
