"""Message Structs, one tagged base class per channel (DESIGN.md §3).

Rules: field order is the wire contract (required fields first, defaults last, append
only); messages are frozen; batch traffic is columnar (parallel lists indexed by row).
Token ids are ``list[int]``; finish reasons are `FinishReason` or ``None`` while running.
"""

from __future__ import annotations

import msgspec

from protocol.enums import FinishReason, ForwardMode, ReplicaState, Role

_STRUCT = dict(array_like=True, omit_defaults=True, frozen=True, gc=False, tag=True)


class SamplingParams(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True, gc=False):
    """Per-request sampling, applied in the worker's MLX graph.

    temperature: 0 means greedy (argmax). top_p in (0, 1]; top_k: -1 or 0 disables.
    seed: makes sampling reproducible per request; None draws a fresh seed.
    logit_bias: token id -> additive bias on the logits (OpenAI semantics, clipped to ±100).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    logit_bias: dict[int, float] = {}


class DetokParams(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True, gc=False):
    """What a detokenizer replica needs to render one request's text.

    stop: stop strings; the text ends before the first match (or after it when
    include_stop_str_in_output). prompt_tail_ids: the last prompt tokens, so that the
    first generated token decodes with the right leading space.
    """

    stop: list[str] = []
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    prompt_tail_ids: list[int] = []


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


class DeliveredChars(ToScheduler):
    """The tokenizer's answer to `DeliveredQuery`: chars[i] characters (code points) of
    rids[i]'s text have reached it; -1 when that stream is closed or unknown."""

    rids: list[str]
    chars: list[int]


class StreamsClosed(ToScheduler):
    """From the tokenizer: these requests' streams ended (final text or an error delivered,
    or the client left), so nothing of them needs rendering again."""

    rids: list[str]


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
    """

    rids: list[str]
    input_ids: list[list[int]] = []
    sampling: list[SamplingParams | None] = []
    final: list[bool] = []
    prefix_slots: list[list[int]] = []


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
    positions starts[i] .. starts[i] + len(slots[i]) - 1 of its cache go to slots[i]."""

    rids: list[str]
    starts: list[int]
    slots: list[list[int]]


class WorkerShutdown(ToWorker):
    """Discard pendings and exit."""


# --------------------------------------------------------------------------- FromWorker
class FromWorker(msgspec.Struct, **_STRUCT):
    """Messages the scheduler receives from the worker."""


class LaunchResult(FromWorker):
    """next_token_ids[i] is the token sampled for rids[i] (-1 for a non-final prefill chunk);
    error is non-empty on failure."""

    launch_id: int
    rids: list[str]
    next_token_ids: list[int]
    error: str = ""


class WorkerReady(FromWorker):
    """Sent once by the worker after loading: the KV pool it allocated (slots, bytes per
    slot) and the context length (positions per request) of the model."""

    max_total_tokens: int
    bytes_per_token: int
    context_length: int


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
    """

    rids: list[str]
    new_token_ids: list[list[int]]
    completion_tokens: list[int]
    finish_reasons: list[FinishReason | None]
    matched_stop: list[int | None] = []


class DetokAbort(ToDetokenizer):
    """Forget `rid` without output."""

    rid: str


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
    tokenizer drops what it already has, so a re-seeded replica never repeats text)."""

    rids: list[str]
    text_deltas: list[str]
    completion_tokens: list[int]
    finish_reasons: list[FinishReason | None]
    matched_stop: list[str | int | None] = []
    cached_tokens: list[int] = []
    text_offsets: list[int] = []


class ReqError(ToTokenizer):
    """Request `rid` failed; `status` is the HTTP status to answer with."""

    rid: str
    status: int
    message: str


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


class ServerReady(ToTokenizer):
    """From launch: every process is ready; /health turns 200."""


class TokenizerShutdown(ToTokenizer):
    """Exit."""


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
