"""Request bodies of the OpenAI-compatible and native endpoints (pydantic).

Every field a model declares is implemented, or is on the allow-list of fields accepted
because they ask for nothing that changes the answer (OpenAI's ``user``, ``metadata``,
``store``, ``service_tier`` "auto" / "default", ``modalities`` ["text"], the prompt-cache
and safety hints, ``stream_options.include_obfuscation``): the schema, and so the OpenAPI
document, says which values each takes. Undeclared top-level fields are checked against
`unsupported` (known fields this server does not implement are a 400), and the rest are
ignored, as OpenAI clients send vendor fields; unknown keys inside the native
``sampling_params``, inside ``stream_options`` and inside ``prompt_cache_options`` are
refused (they can only be typos or options this server lacks). Value checks that pydantic expresses live here; checks that
need the model or the server's settings (context length, vocab size, ``--max-n``) live in
`request_builder`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    field_validator,
    model_validator,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
    WithJsonSchema,
)

from tokenizer_proc.errors import FieldValueError
from tokenizer_proc.tool_models import ToolCallIn, ToolChoice, ToolDef


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
Stop = Annotated[Union[StrictStr, list[StrictStr], None], AfterValidator(_check_stop), WithJsonSchema({
    "anyOf": [_STOP, {"type": "array", "items": _STOP, "maxItems": MAX_STOP_STRINGS}, {"type": "null"}]})]
MAX_RID_CHARS = 256
"""Characters of a client-chosen request id (native ``rid``) at most."""


def _check_rid(v: str) -> str:
    if not 0 < len(v) <= MAX_RID_CHARS or any(ord(c) < 0x20 or ord(c) == 0x7F for c in v):
        raise ValueError(f"a request id is 1 to {MAX_RID_CHARS} characters, none of them a control character "
                         "(it is echoed in responses and written to logs)")
    return v


ClientRid = Annotated[StrictStr, AfterValidator(_check_rid), WithJsonSchema(
    {"type": "string", "minLength": 1, "maxLength": MAX_RID_CHARS, "pattern": "^[^\\u0000-\\u001f\\u007f]+$"})]
"""A request id a client chose (SGLang's ``rid``)."""
TOKEN_ID_MARK = "x-token-id"
"""Marks a token id's schema; `bound_token_ids` turns it into the model's vocabulary bound."""
_TOKEN_IDS_SCHEMA = {"type": "array", "items": {"type": "integer", "minimum": 0, TOKEN_ID_MARK: True}}
TokenIds = Annotated[list[Int], WithJsonSchema(_TOKEN_IDS_SCHEMA)]
"""Token ids; each must lie in the model's vocabulary (checked by `request_builder`)."""
LogitBias = Annotated[dict[str, StrictFloat], WithJsonSchema({
    "type": "object", "propertyNames": {"pattern": "^[0-9]{1,9}$"},
    "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}})]
"""Token id (as a string) -> a bias in [-100, 100] added to its logit (checked by `request_builder`)."""
_TEXT = {"type": "string", "minLength": 1}
Prompt = Annotated[Union[StrictStr, list[StrictStr], list[Int], list[list[Int]]], WithJsonSchema({
    "anyOf": [_TEXT, {"type": "array", "items": _TEXT, "minItems": 1},
              {**_TOKEN_IDS_SCHEMA, "minItems": 1},
              {"type": "array", "items": {**_TOKEN_IDS_SCHEMA, "minItems": 1}, "minItems": 1}]})]
"""A completions prompt: text or token ids, or a list of prompts of either kind (n choices
each, at most ``--max-n`` in all); the schema says what is accepted, `request_builder` checks it."""
MessageContent = Annotated[Union[StrictStr, list[dict[str, Any]], None], WithJsonSchema({
    "anyOf": [{"type": "string"}, {"type": "null"}, {"type": "array", "items": {"anyOf": [
        {"type": "object", "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
         "required": ["type", "text"]},
        {"type": "object", "properties": {"type": {"const": "refusal"}, "refusal": {"type": "string"}},
         "required": ["type", "refusal"]}]}}]})]
"""A message's content: text, or text parts (an assistant's may hold refusal parts too; other
parts are a 400 from `chat_template`)."""
ResponseFormat = Annotated[dict[str, Any], WithJsonSchema({"oneOf": [
    {"type": "object", "properties": {"type": {"enum": ["text", "json_object"]}}, "required": ["type"],
     "additionalProperties": False},
    {"type": "object", "properties": {"type": {"const": "json_schema"}, "json_schema": {
        "type": "object", "properties": {"name": {"type": "string"}, "description": {"type": "string"},
                                         "schema": {"type": "object"}, "strict": {"type": ["boolean", "null"]}},
        "required": ["schema"], "additionalProperties": False}}, "required": ["type", "json_schema"],
     "additionalProperties": False}]})]
"""OpenAI's ``response_format``; `grammar_check.from_response_format` checks it."""
ServiceTier = Literal["auto", "default"]
"""OpenAI's ``service_tier`` as a request may give it: one tier is served, `SERVED_TIER`,
which "auto" picks; flex, scale and priority (OpenAI's own scheduling) are a 400. The
response says the tier used, as OpenAI's do (chat completions and Responses; a completions
body has no such field)."""
SERVED_TIER = "default"
"""The ``service_tier`` every request is served on."""
Metadata = Annotated[dict[Annotated[str, Field(max_length=64)], Annotated[StrictStr, Field(max_length=512)]],
                     Field(max_length=16)]
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


class _Body(Utf8Only):
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
    def _stream_options_only_when_streaming(self) -> "Streamed":
        if self.stream_options is not None and not self.stream:
            raise FieldValueError("stream_options", "only allowed when stream is true")
        return self


class StreamOptions(_Body, NullIsAbsent):
    """``include_usage``: send one usage chunk (choices: []) before ``[DONE]``;
    ``continuous_usage_stats`` (vLLM's), with ``include_usage``: every chunk also carries the
    usage so far; ``include_obfuscation``: accepted and ignored (chunks carry no padding).
    Unknown keys are a 400; null is absent."""

    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False
    include_obfuscation: StrictBool | None = None


class PromptCacheOptions(_Body, NullIsAbsent):
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
            raise ValueError("prewarming the prompt cache without generating output is not supported by this "
                             "server: every request generates (send false or leave it out)")
        return prewarm


class StopFields(_Body):
    """Stopping and rendering fields shared by the OpenAI and native bodies (vLLM's names)."""

    stop: Stop = None
    stop_token_ids: TokenIds | None = None
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False


class SamplingFields(StopFields, Streamed, NullIsAbsent):
    """Sampling and stopping fields shared by chat and completions (OpenAI plus vLLM's
    extras); null for any of them, or for another optional field of those bodies, is absent."""

    model: str | None = None
    max_tokens: TokenBudget | None = None
    max_completion_tokens: TokenBudget | None = None
    temperature: StrictFloat | None = Field(default=None, ge=0, le=2)  # OpenAI's range, as /v1/responses
    top_p: StrictFloat | None = Field(default=None, gt=0, le=1)
    top_k: TopK | None = None
    min_p: MinP | None = None
    seed: Seed | None = None
    n: N = 1
    logit_bias: LogitBias | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    min_tokens: Count | None = None
    best_of: integer(ge=1) | None = None
    response_format: ResponseFormat | None = None
    user: StrictStr | None = None
    custom_logit_processor: StrictStr | None = None
    custom_params: dict[str, Any] | None = None


class ChatMessage(_Body):
    """One chat turn. content: a string, or a list of ``{"type": "text", "text": ...}`` parts
    (null for an assistant turn that only calls tools); refusal: an assistant turn's refusal
    as OpenAI answers it, text the assistant wrote (after its content); tool_calls: an
    assistant turn's calls; tool_call_id: the call a ``tool`` message answers."""

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: MessageContent = None
    refusal: StrictStr | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: StrictStr | None = None

    @field_validator("role", mode="before")
    @classmethod
    def _no_function_role(cls, role: object) -> object:
        """OpenAI's deprecated ``function`` role (the answer to a ``function_call``) is a 400
        that says what to send instead (pydantic's own listed the roles, and no more)."""
        if role == "function":
            raise ValueError("the role 'function' (legacy function calling) is not supported: answer a tool call "
                             "with a message of role 'tool' carrying its tool_call_id")
        return role


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``. tools / tool_choice / parallel_tool_calls: see
    `tools`; add_generation_prompt, continue_final_message, chat_template_kwargs: see
    `chat_template` (vLLM's names); thinking_token_budget (vLLM's name): the most tokens
    the model may write inside its think block before the block is closed for it (needs
    ``--reasoning-parser``; `scheduler_proc.reasoning_budget`). metadata, store, service_tier, modalities and the
    prompt-cache and safety fields are the allow-list: accepted with the values their types
    allow, they change nothing."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    logprobs: StrictBool | None = None
    top_logprobs: TopLogprobs | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template_kwargs: dict[str, Any] | None = None
    thinking_token_budget: Count | None = None
    metadata: Metadata | None = None
    store: StrictBool | None = None
    service_tier: ServiceTier | None = None
    modalities: list[Literal["text"]] | None = None
    prompt_cache_key: StrictStr | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    safety_identifier: StrictStr | None = None


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``. prompt: a string, token ids, or a list of prompts (see
    `Prompt`). max_tokens: 16 when not given (OpenAI's default, see `request_builder`).
    logprobs: how many top alternatives to report per token (0..5); echo: the prompt comes
    first in the text (and in logprobs); suffix: text after the completion (fill-in-the-middle,
    for models with FIM tokens: `fim`)."""

    prompt: Prompt
    logprobs: integer(ge=0, le=5) | None = None
    echo: StrictBool = False
    suffix: StrictStr | None = None


class NativeSamplingParams(StopFields):
    """``sampling_params`` of the native ``POST /generate`` (SGLang's names; min_new_tokens
    is OpenAI's min_tokens). Unknown keys are a 400 naming the key. json_schema / regex /
    ebnf: structured-output constraints (at most one); custom_params: the JSON arguments of
    the request's custom logit processor."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: TokenBudget | None = None
    min_new_tokens: Count = 0
    temperature: StrictFloat = Field(default=1.0, ge=0)
    top_p: StrictFloat = Field(default=1.0, gt=0, le=1)
    top_k: TopK = -1
    min_p: MinP = 0.0
    frequency_penalty: Penalty = 0.0
    presence_penalty: Penalty = 0.0
    repetition_penalty: RepetitionPenalty = 1.0
    seed: Seed | None = None
    n: N = 1
    logit_bias: LogitBias | None = None
    json_schema: StrictStr | None = None
    regex: StrictStr | None = None
    ebnf: StrictStr | None = None
    custom_params: dict[str, Any] | None = None


def given_per_prompt(value: Any, nested: bool = False) -> bool:
    """Whether `value`, of a `per_prompt` field, is a list of per-prompt values: an array;
    nested (a field whose single value is itself an array, such as token ids): an array
    whose first item is an array (``[]`` is one empty value)."""
    return isinstance(value, list) and (not nested or (bool(value) and isinstance(value[0], list)))


def per_prompt(one: Any, *, nested: bool = False, item: Any = None) -> Any:
    """The type of a native field that a batch may give per prompt (SGLang's form): `one`
    value, or a list of such values (of `item`, default `one`), one per prompt (their count
    is checked by `native_batch`). A list (`given_per_prompt`) is checked against the list
    member alone, anything else against `one` alone, so an error names the item at fault
    (``sampling_params.1.max_new_tokens``) rather than saying the value is not an object.
    The members' tags, ``one`` and ``list``, are labels that error paths leave out."""
    return Annotated[Union[Annotated[one, Tag("one")], Annotated[list[item or one], Tag("list")]],
                     Discriminator(lambda value: "list" if given_per_prompt(value, nested) else "one")]


def _one_or_list(one: dict, *extra: dict) -> Any:
    """The JSON schema of a `per_prompt` field whose items have no schema of their own to
    build it from: `one`, or a non-empty array of it (or one of `extra`)."""
    return WithJsonSchema({"anyOf": [one, {"type": "array", "items": one, "minItems": 1}, *extra]})


_PROMPT_IDS = {**_TOKEN_IDS_SCHEMA, "minItems": 1}
_IDS_LOGPROB = {**_TOKEN_IDS_SCHEMA, "maxItems": MAX_TOKEN_IDS_LOGPROB}


class GenerateRequest(_Body):
    """``POST /generate``: ``text`` or ``input_ids``, ``sampling_params``, ``stream``, and
    SGLang's logprob fields: return_logprob (output logprobs in ``meta_info``),
    top_logprobs_num (top alternatives per token, 0..20), token_ids_logprob (also these ids'
    logprobs at each position), logprob_start_len (-1: no prompt logprobs; s >= 0: the
    prompt's from position s on). The last three need return_logprob. custom_logit_processor:
    the name of an operator-installed processor (needs ``--enable-custom-logit-processor``).

    A batch (SGLang's form): ``text`` as a list of prompts or ``input_ids`` as a list of
    token-id lists; then sampling_params, rid, the logprob fields and custom_logit_processor
    may each be one value for all prompts or a list of one per prompt (see `native_batch`).
    A single prompt takes one value of each."""

    model_config = ConfigDict(json_schema_extra={"oneOf": [{"required": ["text"]}, {"required": ["input_ids"]}]})

    text: Annotated[per_prompt(StrictStr) | None, _one_or_list(_TEXT)] = None
    input_ids: Annotated[per_prompt(list[Int], nested=True) | None, _one_or_list(_PROMPT_IDS)] = None
    sampling_params: per_prompt(NativeSamplingParams) = NativeSamplingParams()
    stream: StrictBool = False
    rid: per_prompt(ClientRid) | None = None
    return_logprob: per_prompt(StrictBool) = False
    top_logprobs_num: per_prompt(TopLogprobs) = 0
    token_ids_logprob: Annotated[per_prompt(Annotated[list[Int], Field(max_length=MAX_TOKEN_IDS_LOGPROB)], nested=True)
                                 | None, _one_or_list(_IDS_LOGPROB, {"type": "null"})] = None
    logprob_start_len: per_prompt(integer(ge=-1)) = -1
    custom_logit_processor: per_prompt(StrictStr, item=StrictStr | None) | None = None

    @property
    def batch_size(self) -> int | None:
        """How many prompts the body holds when it is a batch (``text`` a list, or
        ``input_ids`` a list of lists); None for a single prompt."""
        if given_per_prompt(self.text):
            return len(self.text)
        if given_per_prompt(self.input_ids, nested=True):
            return len(self.input_ids)
        return None


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
