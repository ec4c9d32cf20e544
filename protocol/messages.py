"""Message Structs, one tagged base class per channel (DESIGN.md §3).

Rules: field order is the wire contract (required fields first, defaults last, append
only); messages are frozen; batch traffic is columnar (parallel lists indexed by row).
Token ids are ``list[int]``; finish reasons are `FinishReason` or ``None`` while running.
"""

from __future__ import annotations

import msgspec

from protocol.enums import FinishReason, ForwardMode, GrammarKind, ReplicaState, ReqField, Role

_STRUCT = dict(array_like=True, omit_defaults=True, frozen=True, gc=False, tag=True)


class SamplingParams(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True, gc=False):
    """Per-request output control, applied in the worker's MLX graph (sent once per request).

    temperature: 0 means greedy (argmax). top_p in (0, 1]; top_k: -1 or 0 disables;
    min_p in [0, 1]: drop tokens whose probability is below min_p times the top one's.
    seed: makes sampling reproducible per request; None draws a fresh seed.
    logit_bias: token id -> additive bias on the logits (OpenAI semantics, clipped to ±100).
    frequency_penalty / presence_penalty in [-2, 2] (vLLM/OpenAI: over generated tokens only:
    logit -= frequency * count + presence * (count > 0)); repetition_penalty > 0 (over prompt
    and generated tokens: positive logits divided by it, negative ones multiplied; 1 = off).
    min_tokens: min_tokens_ids (EOS and the user's stop_token_ids) are masked until the
    request has generated this many tokens.
    top_logprobs: -1 = no output logprobs; k >= 0 = the chosen token's logprob and the k most
    likely tokens'; token_ids_logprob: also report these ids' logprobs at each position.
    logprob_start_len: -1 = no prompt logprobs; s >= 0 = logprobs of prompt tokens from
    position s on (position 0 has none). Logprobs are taken after logit edits and penalties,
    before temperature and top-k/top-p/min-p (README: "Logprobs").
    logit_processor: the name of an operator-installed processor (``--logit-processor-module``,
    behind ``--enable-custom-logit-processor``); logit_processor_args: its arguments as JSON
    text (parsed as JSON, never evaluated). "" = none.
    speculative: False opts the request out of speculative decoding (native ``speculative``;
    it then decodes one token per step even on a server started with
    ``--speculative-algorithm``).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    logit_bias: dict[int, float] = {}
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_tokens: int = 0
    min_tokens_ids: list[int] = []
    top_logprobs: int = -1
    token_ids_logprob: list[int] = []
    logprob_start_len: int = -1
    logit_processor: str = ""
    logit_processor_args: str = ""
    speculative: bool = True

    @property
    def wants_logprobs(self) -> bool:
        """True when the output tokens' logprobs are asked for."""
        return self.top_logprobs >= 0 or bool(self.token_ids_logprob)

    @property
    def penalized(self) -> bool:
        """True when any penalty is active (the worker then keeps token counts for the row)."""
        return bool(self.frequency_penalty or self.presence_penalty or self.repetition_penalty != 1.0)


DEFAULT_SAMPLING = SamplingParams()
"""The sampling of a request that sets none of its fields (temperature and top_p 1, as OpenAI's
APIs default them): what the HTTP process uses for a field not given, and reports so."""


class GrammarSpec(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True, gc=False):
    """A structured-output constraint, checked by the HTTP process before it is sent.

    kind: what `text` is (a JSON schema as JSON text, a regex, an EBNF grammar; JSON_OBJECT
    has an empty text: any JSON object)."""

    kind: GrammarKind
    text: str = ""


class ReasoningBudget(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True, gc=False):
    """A cap on a request's reasoning tokens (``thinking_token_budget``; Anthropic's
    ``thinking.budget_tokens``), enforced by the scheduler (`scheduler_proc.reasoning_budget`).

    budget: reasoning tokens allowed (>= 0), counted from the token after the think block
    opens; once that many were generated and the block is still open, the next tokens are
    forced to `close_ids`. open_ids / close_ids: the token ids of the block's tags as the
    tokenizer encodes them (``<think>``, ``</think>``; one added token each in Qwen3 and the
    R1 distills). inside: the output starts inside the block (the prompt opened it)."""

    budget: int
    open_ids: list[int]
    close_ids: list[int]
    inside: bool = False


class TokenLogprobs(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True, gc=False):
    """Logprobs at consecutive positions of one request, columnar by position j.

    token_ids[j]: the token scored at j (sampled, or the prompt's next token); logprobs[j]:
    its log-probability (<= 0); top_ids[j] / top_logprobs[j]: the k most likely tokens,
    most likely first (empty when k = 0); ids_logprobs[j][m]: logprob of the request's
    token_ids_logprob[m]."""

    token_ids: list[int]
    logprobs: list[float]
    top_ids: list[list[int]] = []
    top_logprobs: list[list[float]] = []
    ids_logprobs: list[list[float]] = []


class LogprobEntries(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True, gc=False):
    """`TokenLogprobs` rendered for the HTTP response by a detokenizer replica.

    start: index of the first entry in the request's entries (prompt or output), so that
    entries re-sent after a replica is lost are taken once. tokens[j]: the text token j adds
    to the output (entries concatenate to the text; "" for a partial UTF-8 character);
    token_bytes[j]: token j's own bytes (UTF-8 of the text it stands for, partial characters
    included); top_tokens / top_bytes: the same for the top alternatives (each decoded alone).
    """

    start: int
    token_ids: list[int]
    tokens: list[str]
    token_bytes: list[bytes]
    logprobs: list[float]
    top_ids: list[list[int]] = []
    top_tokens: list[list[str]] = []
    top_bytes: list[list[bytes]] = []
    top_logprobs: list[list[float]] = []
    ids_logprobs: list[list[float]] = []


class ReqTiming(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True, gc=False):
    """One request's scheduler-side times, in seconds (vLLM's names): queue_time from its
    arrival at the scheduler to its first admission (waiting, held for a grammar or its n > 1
    leader); prefill_time from that admission to its first sampled token."""

    queue_time: float
    prefill_time: float
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    """Speculative decoding: the request's draft tokens verified and accepted so far (sent
    with its first token and again with its last)."""


class DetokParams(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True, gc=False):
    """What a detokenizer replica needs to render one request's text.

    stop: stop strings; the text ends before the first match (or after it when
    include_stop_str_in_output). prompt_tail_ids: the last prompt tokens, so that the
    first generated token decodes with the right leading space. logprob_context_ids (only
    with prompt logprobs): the prompt tokens just before the first one scored (at most a
    few), the context that prompt logprob entries are rendered in. min_tokens: no stop
    string ends in the text of the first min_tokens tokens; one that begins there and ends
    after it matches (vLLM's min_tokens). call_markers: texts that begin a tool call anywhere
    in the output; call_at_start: an output whose first non-blank character is ``{`` is a
    tool call (Llama 3 JSON). From where a call begins, no stop string matches: a stop string
    never cuts a tool call (`detokenizer_proc.stop_strings.StopMatcher`).
    """

    stop: list[str] = []
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    prompt_tail_ids: list[int] = []
    logprob_context_ids: list[int] = []
    min_tokens: int = 0
    call_markers: list[str] = []
    call_at_start: bool = False


# --------------------------------------------------------------------------- ToScheduler
class ToScheduler(msgspec.Struct, **_STRUCT):
    """Messages the scheduler receives from the tokenizer and the detokenizer replicas."""


class GenerateReq(ToScheduler):
    """A new request. input_ids: prompt token ids (len >= 1); max_new_tokens >= 0.

    eos_token_ids: the model's end ids (empty when ignore_eos); stop_token_ids: the user's.
    """

    rid: str
    input_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()
    detok: DetokParams = DetokParams()
    eos_token_ids: list[int] = []
    stop_token_ids: list[int] = []
    grammar: GrammarSpec | None = None
    group: str = ""
    """For choice i > 0 of an ``n`` > 1 request: the rid of choice 0, whose prompt it shares.
    The scheduler admits it once that prompt is prefilled, so the prefix cache serves it."""
    reasoning_budget: ReasoningBudget | None = None
    cache_salt: str = ""
    """vLLM's ``cache_salt``: the prefix-cache namespace (equal prompts under different salts
    share no cached KV); "" is the namespace of every unsalted request."""


class AbortReq(ToScheduler):
    """End `rid` early: the client left (ABORT) or a stop string matched (STOP)."""

    rid: str
    reason: FinishReason = FinishReason.ABORT


class SchedulerShutdown(ToScheduler):
    """Stop after failing every request still held."""


class ReplicaHeartbeat(ToScheduler):
    """From detokenizer replica `index` (process `pid`) every 0.5 s while it serves; one
    silent for longer than the scheduler's timeout (5 s) is treated as dead."""

    index: int
    pid: int


class DrainReplica(ToScheduler):
    """Route no new request to replica `index` and send it `DetokShutdown` once the requests
    it renders are finished. From the replica on SIGTERM, or from ``--detach``."""

    index: int


class ReplicaExited(ToScheduler):
    """Replica `index` exited: from launch when a replica it started exits, and from the
    replica itself as it leaves. pid: the process (0: whichever holds `index`); reason: for
    the log."""

    index: int
    pid: int = 0
    reason: str = ""


class WorkerExited(ToScheduler):
    """From launch: the worker process `pid` of `generation` (0 for the first, +1 per
    restart) exited (reason: for the log). The scheduler fails the requests on the device,
    keeps the waiting ones, and waits for a `WorkerReady` of a later generation (launch
    restarts the worker)."""

    pid: int
    generation: int
    reason: str = ""


class DeliveredChars(ToScheduler):
    """The tokenizer's answer to `DeliveredQuery`: chars[i] characters (code points) of
    rids[i]'s text have reached it; -1 when that stream is closed or unknown."""

    rids: list[str]
    chars: list[int]


class StreamsClosed(ToScheduler):
    """From the tokenizer: these requests' streams ended (final text or an error delivered,
    or the client left), so nothing of them needs rendering again."""

    rids: list[str]


class FlushCache(ToScheduler):
    """From the tokenizer on ``POST /flush_cache``: drop every prefix the radix cache holds
    that no request in flight uses, and answer `CacheFlushed` with the same `seq`."""

    seq: int


class HealthProbe(ToScheduler):
    """From the tokenizer on ``GET /health``: answer `HealthAnswer` with the same `seq` from
    the scheduler's loop. The answer is the loop's heartbeat: the tokenizer times it, and a
    probe left unanswered for ``--stall-timeout`` seconds turns /health 503 (a loop stuck or
    stopped). One probe is out at a time; none is sent while nobody asks."""

    seq: int


# --------------------------------------------------------------------------- ToWorker
class ForwardBatch(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True, gc=False):
    """What one launch computes. rids: the rows, in order.

    EXTEND / MIXED rows are routed by the worker by request state, not length: an unseen
    rid is a prefill (input_ids[i] is its first chunk, sampling[i] its parameters, sent
    once); a rid with a partial prefill is a chunk continuation (sampling[i] None); in
    MIXED, a rid of the running decode batch is a decode row (input_ids[i] empty). final[i]
    says the chunk ends the prompt, so the row samples its first token and joins the decode
    batch; a non-final chunk skips the LM head and yields token -1.
    DECODE: rids only; the input tokens are the worker's own last sampled tokens and the
    rids must be exactly the worker's running batch, in order.
    prefix_slots[i] (with a request's first chunk; empty list when none, or the whole field
    empty when no row has one): the KV pool slots of the cached prefix that precedes
    input_ids[i], which the worker gathers instead of computing.
    prefix_ids[i] (first chunk of a row with penalties and a cached prefix; else empty; the
    whole field empty when no row has one): the token ids of that cached prefix, which the
    penalties count. num_generated[i] (first chunk; empty field
    when all 0): how many of the request's tokens are its own output (a retracted request
    is prefilled again with them), so penalties and seeded noise continue where they were.
    grammar_rows / grammar_masks (any mode): batch rows that sample under a grammar, and for
    each xgrammar's packed bitmask of allowed tokens (int32 words, little-endian, bit j % 32
    of word j // 32 set = token j allowed).
    state_save_at[i] / state_save_slots[i] (extend rows of a model with recurrent layers;
    empty fields when no row has any): positions inside row i's chunk or at its end
    (absolute, ascending) after which its recurrent state is copied into those state slots
    (at the end of a final chunk: after the whole prompt).
    state_restores[i] (first chunk; empty field when none): the state slot its cached prefix
    resumes from (0: none).
    draft_ids[i] (TARGET_VERIFY only; rids exactly the running batch, as DECODE): the draft
    tokens row i proposes after its last sampled token (empty: the row decodes one token).
    """

    rids: list[str]
    input_ids: list[list[int]] = []
    sampling: list[SamplingParams | None] = []
    final: list[bool] = []
    prefix_slots: list[list[int]] = []
    prefix_ids: list[list[int]] = []
    num_generated: list[int] = []
    grammar_rows: list[int] = []
    grammar_masks: list[bytes] = []
    state_save_at: list[list[int]] = []
    state_save_slots: list[list[int]] = []
    state_restores: list[int] = []
    draft_ids: list[list[int]] = []


class ToWorker(msgspec.Struct, **_STRUCT):
    """Messages the worker receives from the scheduler."""


class Launch(ToWorker):
    """Build the lazy forward pass for `batch`, start it with async_eval, keep the pending."""

    launch_id: int
    mode: ForwardMode
    batch: ForwardBatch


class ChainDecode(ToWorker):
    """A DECODE of the running batch fed by launch `prev_launch_id`'s still-lazy tokens.

    Sent before `prev_launch_id` is finalized so the device never waits for the scheduler;
    the rows are the worker's running batch (which must be prev's rows, less any aborted)."""

    launch_id: int
    prev_launch_id: int


class Finalize(ToWorker):
    """Block on launch `launch_id`'s arrays and reply with its `LaunchResult`."""

    launch_id: int


class WorkerAbort(ToWorker):
    """Drop these requests' KV caches and sampling state (finished or aborted)."""

    rids: list[str]


class StoreKV(ToWorker):
    """Copy finished requests' KV into the pool before they are dropped: for rids[i], the
    positions starts[i] .. starts[i] + len(slots[i]) - 1 of its cache go to slots[i].
    state_slots[i] (``--enable-mamba-extra-buffer``; empty field when none, 0 for a rid
    without): the state slot that takes rids[i]'s recurrent state after its first
    starts[i] + len(slots[i]) positions (the worker keeps the states of its last two steps
    for that: the step that computed them, and the one chained step that may follow)."""

    rids: list[str]
    starts: list[int]
    slots: list[list[int]]
    state_slots: list[int] = []


class WorkerShutdown(ToWorker):
    """Discard pendings and exit."""


# --------------------------------------------------------------------------- FromWorker
class FromWorker(msgspec.Struct, **_STRUCT):
    """Messages the scheduler receives from the worker."""


class LaunchResult(FromWorker):
    """next_token_ids[i] is the token sampled for rids[i] (-1 for a non-final prefill chunk);
    error is non-empty on failure. logprobs[i]: that token's logprobs (None when the row did
    not ask, or made no token); prompt_logprobs[i]: the logprobs of the prompt tokens this
    launch computed for row i and the request asked for (None when none). Both fields are
    empty when no row has any. row_errors[i]: non-empty when row i failed alone (its custom
    logit processor raised, returned a bad value or failed when evaluated; the message names
    the processor and the exception): that request fails with a 400 about its
    ``custom_logit_processor``, the others go on (empty field: none)."""

    launch_id: int
    rids: list[str]
    next_token_ids: list[int]
    error: str = ""
    logprobs: list[TokenLogprobs | None] = []
    prompt_logprobs: list[TokenLogprobs | None] = []
    row_errors: list[str] = []
    generation: int = 0
    """The sender's generation (see `WorkerReady`): a result of a dead worker is dropped."""
    more_token_ids: list[list[int]] = []
    """TARGET_VERIFY: the tokens row i produced after next_token_ids[i], in order (its
    accepted draft tokens but the first, then the token the model chose after them); empty
    field otherwise. The row's KV holds exactly its last token and the accepted drafts."""
    more_logprobs: list[TokenLogprobs | None] = []
    """TARGET_VERIFY: the logprobs of more_token_ids[i], one position each, for rows that
    ask for logprobs (None for the others; empty field when none)."""


class WorkerReady(FromWorker):
    """Sent once by the worker after loading: the KV pool it allocated (slots, bytes per
    slot), the context length (positions per request), the vocabulary size (logits per
    position) of the model, and the names of the custom logit processors it loaded.
    generation: which start of the worker this is (0 the first, +1 per restart by launch).
    recurrent_layers: layers with recurrent state (hybrid and SSM models); state_slots: the
    snapshots of that state the worker can hold (0: none, and then the scheduler keeps no
    prefix cache for such a model). graph_max_batch: the largest batch its compiled decode
    step captures (``--decode-graph-max-bs`` as resolved; 0: none compiled).
    prefill_call_tokens: the tokens of one model call of its prefills (a longer chunk is
    split into calls of this many; 0: unknown), which bounds the scheduler's chunks.
    window_layers: sliding-window attention layers, which a cached prefix restores from the
    same state snapshots as recurrent layers (no snapshot slots: no prefix cache either).
    """

    max_total_tokens: int
    bytes_per_token: int
    context_length: int
    vocab_size: int = 0
    logit_processors: list[str] = []
    generation: int = 0
    recurrent_layers: int = 0
    state_slots: int = 0
    graph_max_batch: int = 0
    prefill_call_tokens: int = 0
    window_layers: int = 0


# --------------------------------------------------------------------------- ToDetokenizer
class ToDetokenizer(msgspec.Struct, **_STRUCT):
    """Messages a detokenizer replica receives from the scheduler."""


class DetokSeed(ToDetokenizer):
    """Start rendering `rid`; sent before its first tokens. A re-seed (its replica was lost)
    is followed by every token so far; chars_sent: characters (code points) of its text the
    client already has, which the replica renders again but does not send."""

    rid: str
    params: DetokParams
    prompt_tokens: int
    cached_tokens: int = 0
    chars_sent: int = 0


class BatchTokenOut(ToDetokenizer):
    """New tokens, columnar. new_token_ids[i] are the ids to render for rids[i] (an EOS or
    stop token that ended the request is counted in completion_tokens but not rendered).
    logprobs[i]: the logprobs of the rendered tokens new_token_ids[i] (None when not asked);
    logprob_starts[i]: the index of its first entry among the request's output entries;
    prompt_logprobs[i]: the prompt's logprobs, sent once with the request's first tokens.
    The three fields are empty when no row has logprobs.
    timings[i]: the request's `ReqTiming`, on the row of its first token (and of a re-seed
    replay) only; empty when no row has one.
    """

    rids: list[str]
    new_token_ids: list[list[int]]
    completion_tokens: list[int]
    finish_reasons: list[FinishReason | None]
    matched_stop: list[int | None] = []
    logprobs: list[TokenLogprobs | None] = []
    prompt_logprobs: list[TokenLogprobs | None] = []
    logprob_starts: list[int] = []
    timings: list[ReqTiming | None] = []


class DetokAbort(ToDetokenizer):
    """Forget `rid` without output. reason: non-empty when the scheduler failed it (a stall):
    the replica then logs its state for the request before forgetting it."""

    rid: str
    reason: str = ""


class DetokShutdown(ToDetokenizer):
    """Exit."""


class ReplicaWelcome(ToDetokenizer):
    """Registration accepted: this replica is `index` from now on; it answers `Ready`."""

    index: int


class ReplicaRefused(ToDetokenizer):
    """Registration refused (wrong protocol version, bad index) or revoked (declared dead):
    exit with `message`."""

    message: str


# --------------------------------------------------------------------------- ToTokenizer
class ToTokenizer(msgspec.Struct, **_STRUCT):
    """Messages the tokenizer (HTTP) process receives."""


class BatchStrOut(ToTokenizer):
    """Text deltas, columnar. matched_stop[i]: the stop string or token id that ended row i;
    cached_tokens[i]: prompt tokens served from the prefix cache (OpenAI usage field);
    text_offsets[i]: where row i's delta starts in the request's text, in characters (the
    tokenizer drops what it already has, so a re-seeded replica never repeats text).
    logprobs[i] / prompt_logprobs[i]: rendered logprob entries of row i's new tokens / of its
    prompt (None when none; both fields empty when no row has any). timings[i]: the
    scheduler's `ReqTiming` for row i, passed on from `BatchTokenOut` (empty when no row has one)."""

    rids: list[str]
    text_deltas: list[str]
    completion_tokens: list[int]
    finish_reasons: list[FinishReason | None]
    matched_stop: list[str | int | None] = []
    cached_tokens: list[int] = []
    text_offsets: list[int] = []
    logprobs: list[LogprobEntries | None] = []
    prompt_logprobs: list[LogprobEntries | None] = []
    timings: list[ReqTiming | None] = []


class ReqError(ToTokenizer):
    """Request `rid` failed; `status` is the HTTP status to answer with; `field`: the request
    field the error is about, which the HTTP process names as the client's body has it (the
    error body's ``param``)."""

    rid: str
    status: int
    message: str
    field: ReqField = ReqField.NONE


class DeliveredQuery(ToTokenizer):
    """From the scheduler after it lost a replica: how many characters of each request's
    text have arrived? Answered with `DeliveredChars`."""

    rids: list[str]


class DetokStatus(ToTokenizer):
    """The detokenizer replicas, columnar by replica, for ``GET /v1/internal/detokenizers``
    (sent when it changes, at most every 0.2 s). loads[i]: requests replica i renders now;
    routed[i]: requests started on it; reseeded[i]: requests moved onto it from a lost
    replica. waiting: requests waiting for a replica; failed: requests that waited too long;
    lost: replicas lost (died or went silent)."""

    indexes: list[int]
    pids: list[int]
    states: list[ReplicaState]
    attached: list[bool]
    loads: list[int]
    routed: list[int]
    reseeded: list[int]
    waiting: int = 0
    failed: int = 0
    lost: int = 0


class SchedulerStats(ToTokenizer):
    """A snapshot of the scheduler's gauges and counters, for /metrics (sent about once a
    second while they change). Token counts are KV slots (page size 1)."""

    num_running: int
    num_waiting: int
    kv_total_tokens: int
    kv_free_tokens: int
    kv_cached_tokens: int
    kv_held_tokens: int
    prompt_tokens_total: int
    cached_prompt_tokens_total: int
    retractions_total: int
    finished_total: int
    spec_drafts_total: int = 0
    spec_draft_tokens_total: int = 0
    spec_accepted_tokens_total: int = 0
    spec_accept_lengths: list[int] = []
    """Speculative decoding: verified rows that carried a draft, their draft tokens, the
    draft tokens accepted, and how many drafts accepted j tokens at index j."""


class WorkerStatus(ToTokenizer):
    """From the scheduler: the worker died and is being restarted (ready False; reason: why,
    for /health), or its replacement serves again (ready True). /health is 503 meanwhile."""

    ready: bool
    reason: str = ""


class CacheFlushed(ToTokenizer):
    """From the scheduler: `FlushCache` `seq` is done. freed_tokens: KV slots the prefix cache
    gave back; held_tokens: prefix-cache tokens still held by requests in flight (kept)."""

    seq: int
    freed_tokens: int
    held_tokens: int


class ResolvedSettings(ToTokenizer):
    """From the scheduler on each `WorkerReady`: the settings the worker resolved, by their
    `protocol.config.ServerArgs` name (``max_total_tokens``: KV pool slots,
    ``context_length``: positions per request, ``decode_graph_max_bs``), for
    ``/get_server_info``, which otherwise shows null for those left to the worker."""

    values: dict[str, int]


class HealthAnswer(ToTokenizer):
    """From the scheduler's loop: `HealthProbe` `seq` was read (the loop turns)."""

    seq: int


class ServerReady(ToTokenizer):
    """From launch: every process is ready; /health turns 200."""


class TokenizerShutdown(ToTokenizer):
    """From launch when the scheduler exited (the server stops): answer every request in
    flight with a 503 carrying `reason`, refuse new ones, and stop (launch waits for that,
    then signals what is left to stop)."""

    reason: str = ""


class TokenizerDrain(ToTokenizer):
    """From launch on SIGTERM/SIGINT: refuse new requests (503; /health turns 503), let those
    in flight finish, and send `Drained` on launch's control socket once none is left."""


# --------------------------------------------------------------------------- Control
class Control(msgspec.Struct, **_STRUCT):
    """Start-up handshake messages from each child to launch, and from each detokenizer
    replica to the scheduler when it registers."""


class Hello(Control):
    """Sent first by a child: who it is and which protocol it speaks."""

    role: Role
    index: int
    pid: int
    protocol_version: int


class Ready(Control):
    """Sent when the child is ready to serve; info is free text for the start-up log; pid:
    the sender's process (a replica registering with the scheduler sends it; 0: unset)."""

    role: Role
    index: int
    info: str = ""
    pid: int = 0


class Failed(Control):
    """Sent when the child could not start; error is shown to the user."""

    role: Role
    index: int
    error: str


class Drained(Control):
    """From the tokenizer after `TokenizerDrain`: no request is in flight any more."""

    role: Role
    index: int = 0
