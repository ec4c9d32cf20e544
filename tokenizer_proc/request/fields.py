"""Request-body building blocks every API surface shares (pydantic): bounded integer and
float field types, stop strings, client rids, token ids, UTF-8 checks, null-is-absent and
stream bases, and `bound_token_ids` for the OpenAPI document.

Every field a model declares is implemented, or is on the allow-list of fields accepted
because they ask for nothing that changes the answer (OpenAI's ``user``, ``metadata``,
``store``, ``service_tier`` "auto" / "default", ``modalities`` ["text"], the prompt-cache
and safety hints, ``stream_options.include_obfuscation``): the schema, and so the OpenAPI
document, says which values each takes. Undeclared top-level fields are checked against
`unsupported` (known fields this server does not implement are a 400), and the rest are
ignored, as OpenAI clients send vendor fields (named in a warning line and a response
header, `web.ignored_fields`); unknown keys inside the native
``sampling_params``, inside ``stream_options`` and inside ``prompt_cache_options`` are
refused (they can only be typos or options this server lacks). Value checks that pydantic expresses live here; checks that
need the model or the server's settings (context length, vocab size, ``--max-n``) live in
`request.builder`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Protocol

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from tokenizer_proc.errors import FieldValueError


def _integral(v: Any) -> Any:
    """JSON has one number type: 4.0 is the integer 4 (as JSON Schema counts it); 4.5 stays
    a float and is refused by the integer field."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def integer(**bounds: int) -> Any:
    """An integer field within `bounds` (pydantic's ge / le): an integer or an integral
    float, never a string or a bool. The bounds come before the conversion so that they
    stay in the JSON schema (minimum / maximum)."""
    return Annotated[StrictInt, Field(**bounds), BeforeValidator(_integral)]


Int = integer()

TopK = Annotated[integer(ge=-1, le=2**31 - 1), Field(description="-1 or 0: disabled")]
TokenBudget = integer(ge=0)
"""max_tokens and friends; the upper bound is the context length less the prompt."""
Seed = integer(ge=-(2**63), le=2**63 - 1)
MinP = Annotated[StrictFloat, Field(ge=0, le=1)]
Penalty = Annotated[StrictFloat, Field(ge=-2, le=2)]
"""frequency_penalty / presence_penalty (OpenAI's range)."""
MAX_TOKEN_IDS_LOGPROB = 64
"""token_ids_logprob entries at most (each position reports all of them)."""
RepetitionPenalty = Annotated[StrictFloat, Field(ge=0.01, le=100)]
"""Bounded so that dividing float32 logits by it neither overflows nor underflows."""
Count = integer(ge=0)
CacheSalt = Annotated[
    StrictStr,
    Field(
        min_length=1,
        max_length=1024,
        description="prefix-cache namespace: equal prompts with different salts share no cached KV (vLLM's)",
    ),
]
"""vLLM's ``cache_salt``: a non-empty string; requests share cached prompt KV only under the
same salt (or none), so one tenant's prompts cannot be probed by another's timings."""
N = integer(ge=1)
"""Choices per request; the upper bound is the server's ``--max-n``."""
TopLogprobs = integer(ge=0, le=20)
MAX_STOP_STRINGS = 16
"""Stop strings per request at most: 4x OpenAI's 4, for clients that send vLLM-style lists; the
detokenizer searches each one's text for every one of them."""
MAX_STOP_CHARS = 256
"""Characters per stop string at most; text that could begin one is held back from the stream."""


def _check_stop(v: str | list[str] | None) -> str | list[str] | None:
    stops = [v] if isinstance(v, str) else v or []
    if len(stops) > MAX_STOP_STRINGS:
        raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(stops)}")
    for i, s in enumerate(stops):
        if not s:
            raise ValueError(f"stop string {i} is empty (it would match before any text)")
        if len(s) > MAX_STOP_CHARS:
            raise ValueError(f"stop string {i} has {len(s)} characters, at most {MAX_STOP_CHARS} are allowed")
    return v


_STOP = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_CHARS}
Stop = Annotated[
    StrictStr | list[StrictStr] | None,
    AfterValidator(_check_stop),
    WithJsonSchema(
        {"anyOf": [_STOP, {"type": "array", "items": _STOP, "maxItems": MAX_STOP_STRINGS}, {"type": "null"}]}
    ),
]
MAX_RID_CHARS = 256
"""Characters of a client-chosen request id (native ``rid``) at most."""


def _check_rid(v: str) -> str:
    if not 0 < len(v) <= MAX_RID_CHARS or any(ord(c) < 0x20 or ord(c) == 0x7F for c in v):
        raise ValueError(
            f"a request id is 1 to {MAX_RID_CHARS} characters, none of them a control character "
            "(it is echoed in responses and written to logs)"
        )
    return v


ClientRid = Annotated[
    StrictStr,
    AfterValidator(_check_rid),
    WithJsonSchema(
        {"type": "string", "minLength": 1, "maxLength": MAX_RID_CHARS, "pattern": "^[^\\u0000-\\u001f\\u007f]+$"}
    ),
]
"""A request id a client chose (SGLang's ``rid``)."""
TOKEN_ID_MARK = "x-token-id"
"""Marks a token id's schema; `bound_token_ids` turns it into the model's vocabulary bound."""
TOKEN_IDS_SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0, TOKEN_ID_MARK: True}}
TokenIds = Annotated[list[Int], WithJsonSchema(TOKEN_IDS_SCHEMA)]
"""Token ids; each must lie in the model's vocabulary (checked by `request.builder`)."""
LogitBias = Annotated[
    dict[str, StrictFloat],
    WithJsonSchema(
        {
            "type": "object",
            "propertyNames": {"pattern": "^[0-9]{1,9}$"},
            "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
        }
    ),
]
"""Token id (as a string) -> a bias in [-100, 100] added to its logit (checked by `request.builder`)."""
TEXT_SCHEMA = {"type": "string", "minLength": 1}
Prompt = Annotated[
    StrictStr | list[StrictStr] | list[Int] | list[list[Int]],
    WithJsonSchema(
        {
            "anyOf": [
                TEXT_SCHEMA,
                {"type": "array", "items": TEXT_SCHEMA, "minItems": 1},
                {**TOKEN_IDS_SCHEMA, "minItems": 1},
                {"type": "array", "items": {**TOKEN_IDS_SCHEMA, "minItems": 1}, "minItems": 1},
            ]
        }
    ),
]
"""A completions prompt: text or token ids, or a list of prompts of either kind (n choices
each, at most ``--max-n`` in all); the schema says what is accepted, `request.builder` checks it."""
MessageContent = Annotated[
    StrictStr | list[dict[str, Any]] | None,
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string"},
                {"type": "null"},
                {
                    "type": "array",
                    "items": {
                        "anyOf": [
                            {
                                "type": "object",
                                "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                                "required": ["type", "text"],
                            },
                            {
                                "type": "object",
                                "properties": {"type": {"const": "refusal"}, "refusal": {"type": "string"}},
                                "required": ["type", "refusal"],
                            },
                        ]
                    },
                },
            ]
        }
    ),
]
"""A message's content: text, or text parts (an assistant's may hold refusal parts too; other
parts are a 400 from `chat_template`)."""
ResponseFormat = Annotated[
    dict[str, Any],
    WithJsonSchema(
        {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"type": {"enum": ["text", "json_object"]}},
                    "required": ["type"],
                    "additionalProperties": False,
                },
                {
                    "type": "object",
                    "properties": {
                        "type": {"const": "json_schema"},
                        "json_schema": {
                            "type": "object",
                            "properties": {
                                "name": {"type": "string"},
                                "description": {"type": "string"},
                                "schema": {"type": "object"},
                                "strict": {"type": ["boolean", "null"]},
                            },
                            "required": ["schema"],
                            "additionalProperties": False,
                        },
                    },
                    "required": ["type", "json_schema"],
                    "additionalProperties": False,
                },
            ]
        }
    ),
]
"""OpenAI's ``response_format``; `structured.check.from_response_format` checks it."""
ServiceTier = Literal["auto", "default"]
"""OpenAI's ``service_tier`` as a request may give it: one tier is served, `SERVED_TIER`,
which "auto" picks; flex, scale and priority (OpenAI's own scheduling) are a 400. The
response says the tier used, as OpenAI's do (chat completions and Responses; a completions
body has no such field)."""
SERVED_TIER = "default"
"""The ``service_tier`` every request is served on."""
Metadata = Annotated[
    dict[Annotated[str, Field(max_length=64)], Annotated[StrictStr, Field(max_length=512)]], Field(max_length=16)
]
"""OpenAI's ``metadata``: at most 16 pairs, keys of at most 64 characters, values of at most 512."""


def _find_surrogate(value: Any, path: str) -> str | None:
    """Path of the first string in `value` that cannot be UTF-8 (an unpaired UTF-16
    surrogate, which JSON escapes allow), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path or "body"
    elif isinstance(value, dict):
        for k, v in value.items():
            found = _find_surrogate(k, path) or _find_surrogate(v, f"{path}.{k}" if path else str(k))
            if found:
                return found
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found = _find_surrogate(v, f"{path}.{i}")
            if found:
                return found
    return None


class Utf8Only(BaseModel):
    """A request body whose strings must all be valid Unicode: an unpaired UTF-16 surrogate
    (which JSON escapes allow) is a 400 naming the body's own path to it, checked before
    the body is translated into another API's request (whose paths differ)."""

    @model_validator(mode="before")
    @classmethod
    def _utf8_only(cls, data: Any) -> Any:
        where = _find_surrogate(data, "")
        if where:
            raise FieldValueError(where, "text contains an unpaired UTF-16 surrogate (not valid Unicode)")
        return data


class Body(Utf8Only):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class NullIsAbsent(BaseModel):
    """An OpenAI body in which null for an optional field means the field was not sent, as
    OpenAI reads it (its spec marks them nullable, and its SDK sends null for a parameter
    given as None): such keys are dropped before validation, so the field takes its default
    (``n`` 1, ``stream`` false, ``echo`` false, ...) and does not count as set. A null for a
    required field stays, and is a 400 naming it."""

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {k: v for k, v in data.items() if v is not None or k not in fields or fields[k].is_required()}


class Streamed(BaseModel):
    """A body that may be streamed (chat, completions, Responses): ``stream``, and its
    ``stream_options``, which each such body declares with its own keys. One rule for all of
    them, as OpenAI, vLLM and SGLang answer: stream_options without ``stream: true`` is a 400
    naming it (null counts as absent, `NullIsAbsent`)."""

    stream: StrictBool = False
    stream_options: BaseModel | None = None

    @model_validator(mode="after")
    def _stream_options_only_when_streaming(self) -> Streamed:
        if self.stream_options is not None and not self.stream:
            raise FieldValueError("stream_options", "only allowed when stream is true")
        return self


class StreamOptions(Body, NullIsAbsent):
    """``include_usage``: send one usage chunk (choices: []) before ``[DONE]``;
    ``continuous_usage_stats`` (vLLM's), with ``include_usage``: every chunk also carries the
    usage so far; ``include_obfuscation``: accepted and ignored (chunks carry no padding).
    Unknown keys are a 400; null is absent."""

    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False
    include_obfuscation: StrictBool | None = None


class PromptCacheOptions(Body, NullIsAbsent):
    """OpenAI's ``prompt_cache_options`` (chat and Responses): caching hints that change no
    output here (the prefix cache reuses any shared prefix without breakpoints), accepted with
    their values checked. ``prewarm: true`` (fill the cache and generate nothing) is a 400:
    this server always generates. Unknown keys are a 400; null is absent."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["implicit", "explicit"] | None = None
    ttl: Literal["30m", "12h"] | None = None
    comparison_response_id: StrictStr | None = None
    prewarm: StrictBool | None = None

    @field_validator("prewarm")
    @classmethod
    def _generates(cls, prewarm: bool | None) -> bool | None:
        if prewarm:
            raise ValueError(
                "prewarming the prompt cache without generating output is not supported by this "
                "server: every request generates (send false or leave it out)"
            )
        return prewarm


class StopFields(Body):
    """Stopping and rendering fields shared by the OpenAI and native bodies (vLLM's names)."""

    stop: Stop = None
    stop_token_ids: TokenIds | None = None
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False


class SamplingBody(Protocol):
    """The sampling and stopping fields `RequestBuilder.build` reads, as both the OpenAI
    bodies (`openai.models.SamplingFields`) and the native ``sampling_params``
    (`native.models.NativeSamplingParams`) declare them (None: the server's default)."""

    stop: str | list[str] | None
    stop_token_ids: list[int] | None
    ignore_eos: bool
    skip_special_tokens: bool
    spaces_between_special_tokens: bool
    include_stop_str_in_output: bool
    temperature: float | None
    top_p: float | None
    top_k: int | None
    min_p: float | None
    seed: int | None
    frequency_penalty: float | None
    presence_penalty: float | None
    repetition_penalty: float | None
    speculative: bool | None


def bound_token_ids(schema: Any, vocab_size: int) -> Any:
    """`schema` (an OpenAPI document, changed in place and returned) with every token id
    bounded by the vocabulary: ``maximum: vocab_size - 1`` where `TOKEN_ID_MARK` was."""
    if isinstance(schema, dict):
        if schema.pop(TOKEN_ID_MARK, False):
            schema["maximum"] = vocab_size - 1
        for value in schema.values():
            bound_token_ids(value, vocab_size)
    elif isinstance(schema, list):
        for value in schema:
            bound_token_ids(value, vocab_size)
    return schema
