"""The worker's batch state and its lazy launches (DESIGN.md §1, §4, §5).

`ModelRunner` keeps one running decode batch: per-layer `BatchKVCache`s (left-padded, one
row per request; batched `ArraysCache`s for recurrent layers, `layer_caches`), the last sampled tokens as a lazy int32 [B] array, and each row's
sampling state; and, for prompts prefilled in chunks, each request's own partial cache.
A launch builds the forward pass lazily, starts it with `mx.async_eval` and stores a
`Pending`; only `finalize` blocks, and only on that launch's tokens. A chained decode
(`chain_decode`) reads the previous launch's tokens while they are still lazy.
"""

from __future__ import annotations

import time
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass, field

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from protocol.enums import WORKER_FORWARD_MODES, ForwardMode, describe_modes, mode_name
from protocol.messages import ForwardBatch, TokenLogprobs
from worker_proc.cpu.blas_threads import PrefillThreads
from worker_proc.logits.custom import Processor
from worker_proc.logits.logprobs import LazyLogprobs
from worker_proc.logits.penalties import PenaltyState
from worker_proc.logits.pipeline import process
from worker_proc.logits.prompt_logprobs import score_chunk
from worker_proc.logits.row import RowSampling
from worker_proc.memory.kv_pool import KVPool
from worker_proc.memory.layer_caches import batch_of, cache_arrays, is_full
from worker_proc.memory.state_pool import StatePool
from worker_proc.model.batched_prefill import plan_groups, prefill_rows
from worker_proc.model.decode_graph import DecodeGraph
from worker_proc.model.forward import decode_logits, prefill_all_logits, prefill_hidden
from worker_proc.model.loader import LoadedModel
from worker_proc.model.running_batch import RunningBatch
from worker_proc.spec.verify import VerifyPending, accept, rollback, sample_drafted, unsupported, verify_inputs
from worker_proc.trace import StepTrace

RECENT_STEPS = 2
"""Launches whose resulting recurrent state `ModelRunner.recent` keeps: the one whose result
ended a request, and the chained decode that may already follow it."""
CLEAR_CACHE_EVERY = 256
"""Finalized launches between `mx.clear_cache()` calls (made only when nothing is in flight)."""


@dataclass
class Pending:
    """A launched, not yet finalized forward pass: its mode (as received, possibly not a
    valid `ForwardMode`), rows, lazy tokens [B] and the KV arrays it fills."""

    mode: int
    rids: list[str]
    tokens: mx.array | None
    error: str = ""
    filled: list[mx.array] = field(default_factory=list)
    """KV arrays the launch fills without sampling from them (non-final prefill chunks):
    computed with the tokens, and waited for at finalize."""
    logprobs: list[tuple[list[int], LazyLogprobs]] = field(default_factory=list)
    """(launch rows, their output-token logprobs, one position per row)."""
    prompt_logprobs: list[tuple[int, LazyLogprobs]] = field(default_factory=list)
    """(launch row, the prompt positions this launch scored for it)."""
    row_errors: dict[int, str] = field(default_factory=dict)
    """Launch rows that failed alone (a custom logit processor raised) -> message."""
    verify: VerifyPending | None = None
    """A TARGET_VERIFY with drafts: what its finalize accepts and rolls back."""

    def arrays(self) -> list[mx.array]:
        """Everything `finalize` reads: tokens, filled KV, lazy logprobs."""
        out = [self.tokens, *self.filled]
        if self.verify is not None:
            out += self.verify.arrays()
        for _, lazy in self.logprobs:
            out += lazy.arrays()
        for _, lazy in self.prompt_logprobs:
            out += lazy.arrays()
        return out

    def wire_logprobs(self) -> tuple[list[TokenLogprobs | None], list[TokenLogprobs | None]]:
        """(output logprobs per launch row, prompt logprobs per launch row), each [] when no
        row has any. Blocks on the lazy arrays."""
        n = len(self.rids)
        out: list[TokenLogprobs | None] = [None] * n if self.logprobs else []
        for launch_rows, lazy in self.logprobs:
            for row, tl in zip(launch_rows, lazy.rows([[j] for j in range(len(launch_rows))])):
                out[row] = tl
        prompt: list[TokenLogprobs | None] = [None] * n if self.prompt_logprobs else []
        for row, lazy in self.prompt_logprobs:
            prompt[row] = lazy.rows([list(range(len(lazy.ks)))])[0]
        return out, prompt


@dataclass
class _NewRows:
    """Requests of one extend launch prefilled together: their launch rows, states, logits
    [rows, V] of their last prompt token, per-layer batched caches (`BatchKVCache`, or
    `ArraysCache` for recurrent layers) and lengths (positions)."""

    launch_rows: list[int]
    parts: list[PartialPrefill]
    logits: mx.array
    caches: list
    lengths: list[int]


@dataclass
class PartialPrefill:
    """A request whose prompt has been prefilled in part: its own per-layer caches (KV and
    recurrent state), the positions they hold (`length`) and its sampling."""

    cache: list
    row: RowSampling
    ids: list[int] = field(default_factory=list)
    """The request's tokens so far (cached prefix and chunks), kept for penalized rows."""
    num_generated: int = 0
    carry: mx.array | None = None
    """[1, V] logits of the last position prefilled, for the next chunk's prompt logprobs."""
    length: int = 0
    """Positions its caches hold (cached prefix and chunks)."""
    end_saves: list[int] = field(default_factory=list)
    """State slots that take its recurrent state after the whole prompt."""
    pool_slots: list[int] = field(default_factory=list)
    """Pool slots of a cached prefix whose KV is not in `cache` yet (counted in `length`):
    `prefill_rows` gathers all rows' in one indexing per layer, anything else first calls
    `ModelRunner._materialize`."""


class ModelRunner:
    """Runs EXTEND, MIXED and DECODE launches on one loaded model, one thread, one stream."""

    def __init__(
        self,
        loaded: LoadedModel,
        trace: StepTrace | None = None,
        pool: KVPool | None = None,
        processors: dict[str, Processor] | None = None,
        graph: DecodeGraph | None = None,
        states: StatePool | None = None,
        end_states: bool = False,
        threads: PrefillThreads | None = None,
    ) -> None:
        self.loaded = loaded
        self.threads = threads
        """BLAS threads of prefill launches on the CPU (None: every launch keeps the
        environment's count)."""
        self.graph = graph
        """Captured decode steps (None: every decode runs uncompiled)."""
        self.processors = processors or {}
        self.model = loaded.model
        self.vocab = loaded.vocab_size
        self.pool = pool
        self.states = states
        """Recurrent-state snapshots (None: no recurrent layers, or no prefix cache)."""
        self.recent: deque[tuple[list[list[mx.array]], dict[str, tuple[int, int]]]] | None = (
            deque(maxlen=RECENT_STEPS) if end_states and states is not None else None
        )
        """``--enable-mamba-extra-buffer``: the running batch's recurrent state after each of
        the last launches, with rid -> (physical row, positions) then, for `store`'s end
        snapshots."""
        self.batch = RunningBatch(self.vocab)
        self.partial: dict[str, PartialPrefill] = {}
        self.pending: dict[int, Pending] = {}
        self.last_launch_id: int | None = None
        self.trace = trace
        self._finalized = 0
        self.last_block_s = 0.0
        self.last_logprobs: tuple[list[TokenLogprobs | None], list[TokenLogprobs | None]] = ([], [])
        self.last_row_errors: list[str] = []
        self.last_more: list[list[int]] = []
        """A finalized TARGET_VERIFY's tokens per row after the first (`LaunchResult.more_token_ids`)."""
        self.last_more_logprobs: list[TokenLogprobs | None] = []
        """Their logprobs per row, for rows that ask (`LaunchResult.more_logprobs`; [] when none)."""
        self.deferred: set[str] = set()
        """Requests aborted while a TARGET_VERIFY was pending, dropped after its finalize."""

    # ------------------------------------------------------------------ launches
    def launch(self, launch_id: int, mode: ForwardMode, batch: ForwardBatch) -> None:
        """Build and start launch `launch_id`; never blocks on the device.

        Raises `ValueError` for a mode outside `WORKER_FORWARD_MODES`, a DECODE whose rids
        are not exactly the running batch, or a malformed extend batch; the error is also
        kept for `finalize`.
        """
        try:
            if mode not in WORKER_FORWARD_MODES:
                raise ValueError(
                    f"worker cannot launch forward mode {mode_name(mode)}; supported: {describe_modes(WORKER_FORWARD_MODES)}"
                )
            self._check_no_verify(launch_id)
            if mode in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY):
                if list(batch.rids) != self.batch.rids:
                    raise ValueError(
                        f"{mode_name(mode)} rids {batch.rids[:4]}... do not match the worker's running batch "
                        f"{self.batch.rids[:4]}..."
                    )
                pending = Pending(mode, list(batch.rids), None)
                if mode == ForwardMode.DECODE:
                    pending.tokens = self._decode(mode, pending, list(range(len(batch.rids))), _grammar(batch))
                else:
                    pending.tokens = self._verify(pending, batch)
            else:
                pending = self._extend(mode, batch)
        except Exception as e:
            self.pending[launch_id] = Pending(int(mode), list(batch.rids), None, f"{type(e).__name__}: {e}")
            raise
        self._start(launch_id, pending)

    def chain_decode(self, launch_id: int, prev_launch_id: int, start: bool = True) -> None:
        """Launch a DECODE of the running batch on launch `prev_launch_id`'s tokens: still
        lazy when prev is pending, already computed when it was finalized first. With
        `start=False` the graph is only built; `start(launch_id)` queues it on the device
        (so that prev can be finalized in between: `worker_proc.finalize_order`).

        Raises `ValueError` when `prev_launch_id` is not the latest launch built (the chain
        would not continue from its tokens); the error is kept for `finalize`.
        """
        try:
            if prev_launch_id != self.last_launch_id:
                raise ValueError(f"ChainDecode {launch_id} must follow the latest launch, got prev={prev_launch_id}")
            self._check_no_verify(launch_id)
            pending = Pending(ForwardMode.DECODE, list(self.batch.rids), None)
            pending.tokens = self._decode(ForwardMode.DECODE, pending, list(range(len(self.batch.rids))), {})
        except Exception as e:
            self.pending[launch_id] = Pending(
                ForwardMode.DECODE, list(self.batch.rids), None, f"{type(e).__name__}: {e}"
            )
            raise
        self._start(launch_id, pending, start)

    def _check_no_verify(self, launch_id: int) -> None:
        """Raise `ValueError` while a TARGET_VERIFY with drafts is pending: the running batch's
        KV and last tokens are only known once its finalize has accepted and rolled back."""
        for other, p in self.pending.items():
            if p.verify is not None:
                raise ValueError(
                    f"launch {launch_id} arrived before TARGET_VERIFY launch {other} was finalized (a launch "
                    "cannot build on a verify's tokens before its acceptance is known)"
                )

    def _start(self, launch_id: int, pending: Pending, queue: bool = True) -> None:
        self.pending[launch_id] = pending
        self.last_launch_id = launch_id
        if queue:
            self.start(launch_id)

    def start(self, launch_id: int) -> None:
        """Queue a built launch on the device (`mx.async_eval`); never blocks. A launch
        that failed to build, or was already finalized, is left alone."""
        p = self.pending.get(launch_id)
        if p is None or p.tokens is None:
            return
        if self.trace is not None:
            self.trace.queueing(launch_id)
        with nullcontext() if self.threads is None else self.threads.applied(p.mode != ForwardMode.DECODE):
            mx.async_eval(*p.arrays())
        if self.trace is not None:
            self.trace.launched(launch_id)

    def _decode(
        self, mode: ForwardMode, pending: Pending, launch_rows: list[int], grammar: dict[int, bytes]
    ) -> mx.array:
        """One decode step of the running batch within a launch of `mode`; its rows are
        `launch_rows` of the launch (logprobs are recorded in `pending` under those rows);
        grammar: launch row -> mask. A DECODE the graph covers replays the captured step;
        other modes (MIXED) and larger batches build it uncompiled."""
        if not self.batch.rids:
            raise ValueError("DECODE with an empty running batch")
        b = self.batch
        if self.graph is not None and mode == ForwardMode.DECODE and self.graph.covers(b.size):
            logits = self.graph.run(mode, b.last_tokens, b.cache)
        else:
            logits = decode_logits(self.model, b.last_tokens, b.cache)
        return self._sample_step(pending, launch_rows, grammar, logits)

    def _sample_step(
        self, pending: Pending, launch_rows: list[int], grammar: dict[int, bytes], logits: mx.array
    ) -> mx.array:
        """Sample the running batch's next tokens from `logits` [size, V] (by physical row)
        and advance the batch by one position; returns them in `rids` order (lazy)."""
        b = self.batch
        launch_of = dict(zip(b.slots, launch_rows))  # physical row -> launch row (free rows: none)
        failed: dict[int, str] = {}
        t0 = time.perf_counter() if self.trace is not None else 0.0
        tokens, lazy, asking = process(
            logits, b.rows, b.penalties, {s: grammar[lr] for s, lr in launch_of.items() if lr in grammar}, failed
        )
        if self.trace is not None:
            self.trace.sampled(time.perf_counter() - t0)
        pending.row_errors.update({launch_of[s]: msg for s, msg in failed.items() if s in launch_of})
        if lazy is not None:
            pending.logprobs.append(([launch_of[s] for s in asking], lazy))
        b.last_tokens = tokens
        b.lengths = [n + 1 for n in b.lengths]
        b.trim_windows()
        self._remember()
        return b.live_tokens(tokens)

    def _verify(self, pending: Pending, batch: ForwardBatch) -> mx.array:
        """TARGET_VERIFY (`worker_proc.spec.verify`): the running batch's last tokens and
        drafts in one call; position 0 sampled as a DECODE, the drafted rows' later positions
        kept lazy in `pending.verify` for `finalize` to accept and roll back. Without any
        draft it is a DECODE step. Raises `ValueError` for drafts of the wrong count, token
        ids outside the vocabulary, a drafted row with state read per step (penalties,
        logprobs, a custom processor, a grammar mask), or a model whose layers cannot roll
        back (`verify.unsupported`)."""
        b, n = self.batch, len(batch.rids)
        if batch.draft_ids and len(batch.draft_ids) != n:
            raise ValueError(f"TARGET_VERIFY has {len(batch.draft_ids)} drafts for {n} rows")
        rows = list(range(n))
        drafts = {b.slots[i]: list(d) for i, d in enumerate(batch.draft_ids) if d}
        if not drafts:
            return self._decode(ForwardMode.DECODE, pending, rows, _grammar(batch))
        if why := unsupported(self.loaded.caches):
            raise ValueError(why)
        grammar = _grammar(batch)
        for i, d in enumerate(batch.draft_ids):
            p = b.row(i).params if d else None
            if p is not None and (p.penalized or p.logit_processor or i in grammar):
                raise ValueError(
                    f"request {batch.rids[i]!r} reads each token (penalties, a processor or a grammar) and cannot take a draft"
                )
            if any(not 0 <= t < self.vocab for t in d):
                raise ValueError(f"request {batch.rids[i]!r} has a draft token outside the vocabulary of {self.vocab}")
        spec = sorted(drafts)
        inputs, width = verify_inputs(b.last_tokens, drafts, b.size)
        logits = self.model(inputs, cache=b.cache)
        later, lazy, asking = sample_drafted(logits[mx.array(spec, dtype=mx.int32)], [b.rows[s] for s in spec], width)
        tokens = self._sample_step(pending, rows, grammar, logits[:, 0, :])
        b.lengths = [k + width - 1 for k in b.lengths]
        pending.verify = VerifyPending(
            width, spec, [drafts[s] for s in spec], later, list(b.slots), (asking, lazy) if lazy is not None else None
        )
        return tokens

    def _accept(self, v: VerifyPending, ids: list[int]) -> list[list[int]]:
        """Finalize a TARGET_VERIFY: accept each drafted row's run (`verify.accept`), roll
        every row's KV back to its last token and accepted drafts, and make each row's last
        produced token its next input. `ids`: position 0's tokens by launch row. Returns the
        tokens each launch row produced after its first; their logprobs, for the rows that
        ask, go to `last_more_logprobs`."""
        b = self.batch
        launch_of = {s: i for i, s in enumerate(v.slots)}
        runs = accept([ids[launch_of[s]] for s in v.spec], v.drafts, v.later.tolist())
        scored = v.run_logprobs(runs)
        if scored:
            self.last_more_logprobs = [None] * len(v.slots)
            for k, tl in scored.items():
                self.last_more_logprobs[launch_of[v.spec[k]]] = tl
        discard = [v.width - 1] * b.size
        more: list[list[int]] = [[] for _ in v.slots]
        moved, bonus = [], []
        for s, run in zip(v.spec, runs):
            discard[s] -= len(run)
            more[launch_of[s]] = run
            if run:
                b.rows[s].generated += len(run)
                moved.append(s)
                bonus.append(run[-1])
        rollback(b.cache, discard)
        b.lengths = [k - d for k, d in zip(b.lengths, discard)]
        if moved:
            last = mx.array(b.last_tokens)  # a new array: the finalized launch may return the old one
            last[mx.array(moved, dtype=mx.int32)] = mx.array(bonus, dtype=mx.int32)
            b.last_tokens = last
        return more

    def _extend(self, mode: ForwardMode, batch: ForwardBatch) -> Pending:
        """EXTEND/MIXED: route each row by state; the pending's tokens are int32 [rows] with
        -1 for rows that produce no token (non-final chunks), and its `filled` holds the KV
        arrays those chunks fill (which the tokens do not depend on, so they must be
        evaluated alongside)."""
        n = len(batch.rids)
        if not n or len(batch.input_ids) != n or len(batch.sampling) != n or len(batch.final) != n:
            raise ValueError("EXTEND batch needs input_ids, sampling and final for every rid")
        pending = Pending(mode, list(batch.rids), None)
        grammar = _grammar(batch)
        running = {rid: i for i, rid in enumerate(self.batch.rids)}
        decode_rows = [i for i, rid in enumerate(batch.rids) if rid in running]
        if decode_rows:
            if mode != ForwardMode.MIXED:
                raise ValueError(
                    f"request {batch.rids[decode_rows[0]]!r} is decoding; only MIXED batches hold decode rows"
                )
            if [batch.rids[i] for i in decode_rows] != self.batch.rids:
                raise ValueError("a MIXED batch must hold every running request, in batch order")
        out: list[mx.array | None] = [None] * n
        if decode_rows:
            dec = self._decode(mode, pending, decode_rows, grammar)
            for j, i in enumerate(decode_rows):
                out[i] = dec[j : j + 1]
        finals: list[tuple[int, PartialPrefill, list[int]]] = []  # (launch row, state, tokens), prefilled batched
        segments: list[_NewRows] = []
        for i, rid in enumerate(batch.rids):
            if rid in running:
                continue
            ids = batch.input_ids[i]
            if not ids:
                raise ValueError(f"request {rid!r} has an empty chunk")
            part = self.partial.pop(rid, None) or self._new_partial(batch, i)
            if part.row.params.penalized:
                part.ids += ids
            at, slots = self._state_saves(batch, i, part, ids)
            if at or part.row.params.logprob_start_len >= 0 or not batch.final[i]:
                self._materialize(part)  # these paths prefill the row alone
            if at:
                ids = self._snapshots(pending, part, ids, at, slots)
            if part.row.params.logprob_start_len >= 0:
                logits = prefill_all_logits(self.model, ids, part.cache)
                lazy, part.carry = score_chunk(logits, ids, part.length, part.carry, part.row)
                part.length += len(ids)
                if lazy is not None:
                    pending.prompt_logprobs.append((i, lazy))
                if batch.final[i]:
                    segments.append(_NewRows([i], [part], logits[-1:], batch_of(part.cache), [part.length]))
                    continue
                pending.filled.append(part.carry)
            elif batch.final[i]:
                finals.append((i, part, ids))
                continue
            else:
                prefill_hidden(self.model, ids, part.cache)
                part.length += len(ids)
            self.partial[rid] = part
            pending.filled += cache_arrays(part.cache)
        ragged = self.loaded.pads_exactly
        for group in plan_groups([len(ids) for _, _, ids in finals], ragged=ragged):
            rows = [finals[g] for g in group]
            logits, caches = prefill_rows(
                self.model,
                [ids for _, _, ids in rows],
                [p.cache for _, p, _ in rows],
                ragged=ragged,
                pool=self.pool,
                prefix=[p.pool_slots for _, p, _ in rows],
            )
            segments.append(
                _NewRows(
                    [i for i, _, _ in rows],
                    [p for _, p, _ in rows],
                    logits,
                    caches,
                    [p.length + len(ids) for _, p, ids in rows],
                )
            )
        if segments:
            self._join(pending, list(batch.rids), segments, grammar, out)
        none = mx.array([-1], dtype=mx.int32)
        pending.tokens = mx.concatenate([o if o is not None else none for o in out])
        return pending

    def _join(
        self,
        pending: Pending,
        rids: list[str],
        segments: list[_NewRows],
        grammar: dict[int, bytes],
        out: list[mx.array | None],
    ) -> None:
        """Sample the first token of every prefilled request, write it to `out` at its launch
        row, and append the requests to the running batch in launch-row order (the order the
        scheduler appends them in)."""
        pos = [i for seg in segments for i in seg.launch_rows]
        parts = [p for seg in segments for p in seg.parts]
        lengths = [n for seg in segments for n in seg.lengths]
        logits = segments[0].logits if len(segments) == 1 else mx.concatenate([seg.logits for seg in segments])
        caches = segments[0].caches
        for seg in segments[1:]:
            for mine, theirs in zip(caches, seg.caches):
                mine.extend(theirs)
        order = sorted(range(len(pos)), key=pos.__getitem__)
        if order != list(range(len(pos))):  # groups interleave: gather the rows into launch order
            perm = mx.array(order, dtype=mx.int32)
            logits = logits[perm]
            for c in caches:
                c.filter(perm)
            pos, parts, lengths = ([xs[k] for k in order] for xs in (pos, parts, lengths))
        rows = [p.row for p in parts]
        penalties = PenaltyState.for_rows(
            rows,
            [p.ids for p in parts],
            [p.ids[len(p.ids) - p.num_generated :] if p.num_generated else [] for p in parts],
            self.vocab,
        )
        failed: dict[int, str] = {}
        toks, lazy, asking = process(
            logits, rows, penalties, {j: grammar[i] for j, i in enumerate(pos) if i in grammar}, failed
        )
        pending.row_errors.update({pos[j]: msg for j, msg in failed.items()})
        if lazy is not None:
            pending.logprobs.append(([pos[j] for j in asking], lazy))
        for j, i in enumerate(pos):
            out[i] = toks[j : j + 1]
        physical = self.batch.append([rids[i] for i in pos], caches, toks, rows, lengths, penalties)
        saves = [(slot, s) for p, s in zip(parts, physical) for slot in p.end_saves]
        if saves:
            pending.filled += self.states.save([s for s, _ in saves], self.batch.cache, [r for _, r in saves])
        self._remember()

    def _remember(self) -> None:
        """Keep the running batch's recurrent state as it is now (`recent`)."""
        if self.recent is not None:
            b = self.batch
            self.recent.append(
                (self.states.arrays_of(b.cache), {rid: (s, b.lengths[s]) for rid, s in zip(b.rids, b.slots)})
            )

    def _state_saves(
        self, batch: ForwardBatch, i: int, part: PartialPrefill, ids: list[int]
    ) -> tuple[list[int], list[int]]:
        """Extend row i's state saves: one that follows its whole prompt (at the end of a
        final chunk) goes to `part`, for `_join`; returns the others (positions, slots) for
        `_snapshots`. Raises `ValueError` for saves without a state pool, or a bad slot."""
        at = list(batch.state_save_at[i]) if batch.state_save_at else []
        slots = list(batch.state_save_slots[i]) if batch.state_save_slots else []
        if not at:
            return at, slots
        if self.states is None:
            raise ValueError("state snapshots were asked for but this worker keeps none")
        if batch.final[i] and len(slots) == len(at) and at[-1] == part.length + len(ids):
            self.states.check(slots[-1])
            part.end_saves.append(slots.pop())
            at.pop()
        return at, slots

    def _snapshots(
        self, pending: Pending, part: PartialPrefill, ids: list[int], at: list[int], slots: list[int]
    ) -> list[int]:
        """Prefill `ids` (a chunk) up to each position of `at` in turn, copying the recurrent
        state there into the state slot of `slots` (lazy, evaluated with the launch); returns
        the ids after the last position (`_state_saves` has checked there is a pool).
        Raises `ValueError` for positions outside the chunk or not ascending."""
        if len(at) != len(slots) or at != sorted(at) or not part.length < at[0] <= at[-1] <= part.length + len(ids):
            raise ValueError(f"snapshot positions {at} do not lie in the chunk {part.length}..{part.length + len(ids)}")
        for position, slot in zip(at, slots):
            k = position - part.length
            prefill_hidden(self.model, ids[:k], part.cache)
            part.length, ids = position, ids[k:]
            pending.filled += self.states.save([slot], part.cache, [0])
        return ids

    def _new_partial(self, batch: ForwardBatch, i: int) -> PartialPrefill:
        """State for unseen row i of an extend batch: a prefill after any cached prefix."""
        params = batch.sampling[i]
        if params is None:
            raise ValueError(f"request {batch.rids[i]!r} is unseen but came without sampling parameters")
        generated = batch.num_generated[i] if batch.num_generated else 0
        row = RowSampling.start(params, self.vocab, generated, self.processors)
        part = PartialPrefill(
            make_prompt_cache(self.model), row, list(batch.prefix_ids[i]) if batch.prefix_ids else [], generated
        )
        prefix = batch.prefix_slots[i] if batch.prefix_slots else []
        if prefix:
            self._load_prefix(part, prefix, batch.state_restores[i] if batch.state_restores else 0)
        return part

    def _load_prefix(self, part: PartialPrefill, slots: list[int], state: int) -> None:
        """Start a fresh per-request cache at a cached prefix: the recurrent and window
        layers take the snapshot in state slot `state` now; the KV at `slots` stays in the
        pool (`part.pool_slots`) until `_materialize` or `prefill_rows` gathers it. Raises
        `ValueError` without a pool, or for a model with such layers without a snapshot to
        resume."""
        if self.pool is None:
            raise ValueError("a cached prefix was sent but this worker has no KV pool")
        if not all(is_full(c) for c in part.cache):
            if not state or self.states is None:
                raise ValueError("a cached prefix was sent without the recurrent or window state it ends with")
            self.states.load(state, part.cache, len(slots))
        part.pool_slots = list(slots)
        part.length = len(slots)

    def _materialize(self, part: PartialPrefill) -> None:
        """Gather `part`'s cached prefix from the pool into its own KV caches (no-op when
        they hold it already)."""
        if not part.pool_slots:
            return
        n = len(part.pool_slots)
        for c, (k, v) in zip([c for c in part.cache if is_full(c)], self.pool.gather(part.pool_slots)):
            c.keys, c.values, c.offset = k, v, n
        part.pool_slots = []

    def store(self, rids: list[str], starts: list[int], slots: list[list[int]], state_slots: list[int] = ()) -> None:
        """Copy positions starts[i].. of running request rids[i]'s KV into the pool at
        slots[i] (before the request is dropped), and, where state_slots[i] is not 0, its
        recurrent state after starts[i] + len(slots[i]) positions into that state slot
        (`StoreKV`). Raises `ValueError` for an unknown rid, positions past the row's KV, no
        pool, or a state not among the last launches' (`recent`)."""
        if self.pool is None:
            raise ValueError("StoreKV sent but this worker has no KV pool")
        rows = {rid: i for i, rid in enumerate(self.batch.rids)}
        spans = []
        for rid, start, sl in zip(rids, starts, slots):
            if rid not in rows:
                raise ValueError(f"StoreKV for {rid!r}, which is not running")
            i = rows[rid]
            if start + len(sl) > self.batch.length(i):
                raise ValueError(
                    f"StoreKV for {rid!r} asks positions up to {start + len(sl)}, the row has {self.batch.length(i)}"
                )
            if sl:
                spans.append((i, start, start + len(sl)))
        if spans:
            self.pool.store([s for sl in slots for s in sl], self.batch.rows_kv(spans))
        for rid, start, sl, slot in zip(rids, starts, slots, state_slots):
            if slot:
                self._end_state(rid, start + len(sl), slot)

    def _end_state(self, rid: str, length: int, slot: int) -> None:
        """Copy `rid`'s recurrent state after `length` positions, as one of the last
        launches left it, into state slot `slot`. Raises `ValueError` when none did."""
        if self.recent is None:
            raise ValueError(
                "an end-of-request state was asked for but this worker keeps none (--enable-mamba-extra-buffer)"
            )
        for states, rows in reversed(self.recent):
            if rows.get(rid, (0, -1))[1] == length:
                self.states.store([slot], states, [rows[rid][0]])
                return
        raise ValueError(f"no recent state of {rid!r} after {length} positions")

    # ------------------------------------------------------------------ finalize / abort
    def finalize(self, launch_id: int) -> tuple[list[str], list[int]]:
        """Block on launch `launch_id`'s arrays; return (rids, token ids). Its logprobs are
        left in `last_logprobs` (output logprobs per row, prompt logprobs per row; each []
        when no row has any), rows that failed alone in `last_row_errors` (a message per
        row, "" for the others; [] when none), the seconds it blocked in `last_block_s`.

        Raises `KeyError` for an unknown launch id, `ValueError` for a pending whose mode
        this worker cannot finalize, `RuntimeError` carrying the launch's own error.
        """
        self.last_block_s, self.last_logprobs, self.last_row_errors = 0.0, ([], []), []
        self.last_more, self.last_more_logprobs = [], []
        p = self.pending.pop(launch_id)
        try:
            return self._finalize(launch_id, p)
        finally:
            if self.deferred and not any(q.verify is not None for q in self.pending.values()):
                self.abort(list(self.deferred))

    def _finalize(self, launch_id: int, p: Pending) -> tuple[list[str], list[int]]:
        """`finalize` of the popped pending `p` (deferred aborts are applied by the caller)."""
        if p.mode not in WORKER_FORWARD_MODES:
            raise ValueError(
                f"cannot finalize launch in mode {mode_name(p.mode)}; supported: {describe_modes(WORKER_FORWARD_MODES)}"
            )
        if p.error:
            raise RuntimeError(p.error)
        if self.trace is not None:
            self.trace.waiting(launch_id)
        t0 = time.perf_counter()
        if p.filled:
            mx.eval(p.filled)
        ids = p.tokens.tolist()
        if p.verify is not None:
            self.last_more = self._accept(p.verify, ids)
        self.last_logprobs = p.wire_logprobs()
        self.last_row_errors = [p.row_errors.get(i, "") for i in range(len(p.rids))] if p.row_errors else []
        self._record_outputs(p.rids, ids)
        self.last_block_s = time.perf_counter() - t0
        if self.trace is not None:
            self.trace.ready(launch_id, p.mode, len(p.rids))
        self._finalized += 1
        if not self.pending and (self._finalized % CLEAR_CACHE_EVERY == 0 or not self.batch.rids):
            mx.clear_cache()  # only with nothing in flight: a launch still running keeps its buffers
        return p.rids, ids

    def _record_outputs(self, rids: list[str], ids: list[int]) -> None:
        """Give the rows with a custom processor their finalized tokens (it reads them)."""
        if not any(r.processor for r in self.batch.rows):
            return
        rows = {
            rid: self.batch.row(i) for i, rid in enumerate(self.batch.rids) if self.batch.row(i).processor is not None
        }
        for rid, t in zip(rids, ids):
            if rid in rows and t >= 0:
                rows[rid].processor.output_ids.append(t)

    def discard(self) -> int:
        """Drop every pending launch without waiting (shutdown); returns how many."""
        n = len(self.pending)
        self.pending.clear()
        return n

    def abort(self, rids: list[str]) -> None:
        """Forget these requests' KV and sampling state (running or partly prefilled). While
        a TARGET_VERIFY is pending, running rows are dropped after its finalize (its
        acceptance is by physical row)."""
        for rid in rids:
            self.partial.pop(rid, None)
        if any(p.verify is not None for p in self.pending.values()):
            self.deferred.update(rids)
            return
        self.deferred.clear()
        self.batch.drop(set(rids))


def _grammar(batch: ForwardBatch) -> dict[int, bytes]:
    """Launch row -> packed grammar mask for this step. Raises `ValueError` when the two
    grammar fields differ in length or name a row outside the batch."""
    if len(batch.grammar_rows) != len(batch.grammar_masks):
        raise ValueError("grammar_rows and grammar_masks differ in length")
    if any(not 0 <= r < len(batch.rids) for r in batch.grammar_rows):
        raise ValueError(f"grammar row outside the batch of {len(batch.rids)} rows")
    return dict(zip(batch.grammar_rows, batch.grammar_masks))
