"""Enums that cross process boundaries (sent as ints on the wire)."""

from enum import IntEnum


class ForwardMode(IntEnum):
    """What one launch computes on the worker (DESIGN.md §4).

    IDLE: nothing to run; DECODE: one new token per running request; EXTEND: the tokens of
    new requests past any cached prefix (prefill); MIXED: decode requests folded into an
    extend batch; TARGET_VERIFY: speculative decoding's check of the running batch, each
    row's last token and its draft tokens (0..k, proposed by the scheduler) in one launch,
    keeping the longest run the model agrees with and the token after it
    (`scheduler_proc.spec`, `worker_proc.spec`).
    """

    IDLE = 0
    DECODE = 1
    EXTEND = 2
    MIXED = 3
    TARGET_VERIFY = 4


WORKER_FORWARD_MODES: frozenset[ForwardMode] = frozenset(
    {ForwardMode.DECODE, ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.TARGET_VERIFY}
)
"""The modes the worker can launch and finalize; the scheduler refuses to send any other.

One constant for both sides (DESIGN.md §4), so a mode added on one side only fails loudly.
"""


def mode_name(mode: int) -> str:
    """The name of a `ForwardMode` value, or the bare number for a value that is not one."""
    try:
        return ForwardMode(mode).name
    except ValueError:
        return str(mode)


def describe_modes(modes: frozenset[ForwardMode]) -> str:
    """Return the names of `modes` sorted by value, e.g. ``"DECODE, EXTEND"``."""
    return ", ".join(m.name for m in sorted(modes))


class FinishReason(IntEnum):
    """Why a request ended; `api_str` is the OpenAI `finish_reason` string."""

    STOP = 0
    LENGTH = 1
    ABORT = 2

    @property
    def api_str(self) -> str:
        """The OpenAI form: ``"stop"``, ``"length"`` or ``"abort"``."""
        return self.name.lower()


class Role(IntEnum):
    """Which kind of process sent a control message."""

    TOKENIZER = 0
    SCHEDULER = 1
    WORKER = 2
    DETOKENIZER = 3


class ReplicaState(IntEnum):
    """Where a detokenizer replica stands in the scheduler's registry; `api_str` for JSON.

    STARTING: registered, not yet Ready; LIVE: takes new requests; DRAINING: finishes the
    requests it holds, takes none; GONE: exited, lost or released.
    """

    STARTING = 0
    LIVE = 1
    DRAINING = 2
    GONE = 3

    @property
    def api_str(self) -> str:
        """``"starting"``, ``"live"``, ``"draining"`` or ``"gone"``."""
        return self.name.lower()


class GrammarKind(IntEnum):
    """What a `GrammarSpec`'s text is: OpenAI ``response_format`` json_schema / json_object,
    or SGLang's native ``json_schema``, ``regex`` and ``ebnf`` sampling params."""

    JSON_SCHEMA = 0
    JSON_OBJECT = 1
    REGEX = 2
    EBNF = 3


class ReqField(IntEnum):
    """The request field a scheduler refusal (`ReqError`) is about. The HTTP process names it
    as the body of the route the client used has it (a prompt is chat's ``messages``,
    completions' ``prompt``, Responses' ``input``, native ``text`` or ``input_ids``).

    NONE: no field (the server's state: a timeout, a lost worker); PROMPT: the prompt's
    tokens; GRAMMAR: the structured-output constraint (response_format, a tool grammar,
    native json_schema / regex / ebnf); REASONING_BUDGET: the reasoning token budget; RID:
    the client's request id (native ``rid``); LOGIT_PROCESSOR: the custom logit processor's name.
    """

    NONE = 0
    PROMPT = 1
    GRAMMAR = 2
    REASONING_BUDGET = 3
    RID = 4
    LOGIT_PROCESSOR = 5
