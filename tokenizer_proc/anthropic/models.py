"""Request bodies of the Anthropic Messages API (pydantic), as Anthropic's API takes them.

Unknown keys are a 400 naming the key, at every level, as Anthropic's own API answers them.
``metadata``, ``service_tier`` and ``cache_control`` (on the request and on blocks) are
accepted and change nothing: the prefix cache reuses prompts without being asked; so are
``inference_geo``, ``speed`` "standard", ``user_profile_id`` and ``workspace_id`` (where and
for whom it runs), and ``container`` and ``diagnostics`` when null (a 400 otherwise). Blocks
other than text, tool_use, tool_result and (sent back) thinking (images, documents, ...)
fail validation, naming the block's path. A number JSON has not (NaN, Infinity, ``1e400``) is
a 400 wherever it is, free-form objects (`JsonObject`) included.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)

from tokenizer_proc.request.fields import CacheSalt, Utf8Only
from tokenizer_proc.structured.check import unreadable_number


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def _json_numbers(value: dict[str, Any]) -> dict[str, Any]:
    """`value` (a free-form JSON object), when a 64-bit float holds each of its numbers.
    Raises ValueError naming the first that is not (`structured.check.unreadable_number`)."""
    if (bad := unreadable_number(value)) is not None:
        where, problem = bad
        raise ValueError(f"{problem} (at {where})")
    return value


JsonObject = Annotated[dict[str, Any], AfterValidator(_json_numbers)]
"""A free-form JSON object (a tool's input, a schema): a number JSON has not (NaN, Infinity,
which Python's JSON reader takes) or that a double cannot hold (``1e400``, read as infinity)
is refused, at any depth, as float fields refuse them (``allow_inf_nan``)."""


def _no_toolset(name: str | None) -> None:
    if name is not None:
        raise ValueError(f"toolset {name!r}: no toolset is served here (send null or leave it out)")


NoToolset = Annotated[StrictStr | None, AfterValidator(_no_toolset)]
"""``toolset_name`` of a tool_use or tool_result block: null or absent only."""


class CacheControl(_Strict):
    """A prompt-caching hint: accepted, the prefix cache works without it."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class TextBlock(_Strict):
    """``{"type": "text", "text": ...}``; citations must be absent or empty."""

    type: Literal["text"]
    text: StrictStr
    cache_control: CacheControl | None = None
    citations: Annotated[list[Any], Field(max_length=0)] | None = None


class DirectCaller(_Strict):
    """Who called a tool: the model itself (the only caller here)."""

    type: Literal["direct"]


class ToolUseBlock(_Strict):
    """An assistant's earlier tool call: its id, the tool's name and the input it gave
    (caller: as a response block carries it, sent back)."""

    type: Literal["tool_use"]
    id: StrictStr
    name: StrictStr
    input: JsonObject
    caller: DirectCaller | None = None
    cache_control: CacheControl | None = None
    toolset_name: NoToolset = None
    """The toolset a server-side toolset's call belongs to: none here (the SDK sends its
    blocks back with ``toolset_name: null``; a name is refused, no toolset is served)."""


class ThinkingBlock(_Strict):
    """An assistant's earlier thinking, sent back as clients must in tool-use loops:
    accepted and left out of the prompt (chat templates drop earlier turns' reasoning)."""

    type: Literal["thinking"]
    thinking: StrictStr
    signature: StrictStr | None = None


class RedactedThinkingBlock(_Strict):
    """Encrypted thinking of Anthropic's models: accepted and left out, like `ThinkingBlock`."""

    type: Literal["redacted_thinking"]
    data: StrictStr


class ToolResultBlock(_Strict):
    """The result of tool call `tool_use_id`, as text or text blocks."""

    type: Literal["tool_result"]
    tool_use_id: StrictStr
    content: list[TextBlock] | StrictStr = ""
    is_error: StrictBool = False
    cache_control: CacheControl | None = None
    toolset_name: NoToolset = None
    """As `ToolUseBlock.toolset_name`."""


Block = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock, Field(discriminator="type")
]


class Message(_Strict):
    """One turn: content as a string or a list of blocks."""

    role: Literal["user", "assistant"]
    content: list[Block] | StrictStr


class Tool(_Strict):
    """A client tool: name, description and the JSON schema of its input. strict: as a chat
    function's (a forced call is always schema-valid, its grammar enforces the schema; under
    ``auto`` a strict tool's input is enforced by `tools.grammar.auto_calls`);
    eager_input_streaming: accepted, input is always streamed as the model writes it."""

    name: Annotated[StrictStr, Field(min_length=1, max_length=128)]
    description: StrictStr | None = None
    input_schema: JsonObject
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None
    strict: StrictBool | None = None
    eager_input_streaming: StrictBool | None = None

    @model_validator(mode="before")
    @classmethod
    def client_tools_only(cls, data: Any) -> Any:
        """An Anthropic-defined tool (a ``type`` other than custom: server tools such as web
        search, and client tools whose schema Anthropic defines, such as bash or the text
        editor) is refused saying so (its missing input_schema was reported instead)."""
        kind = data.get("type") if isinstance(data, dict) else None
        if kind is not None and kind != "custom":
            raise ValueError(
                f"Anthropic-defined tools (type {kind!r}) are not supported by this server: only "
                "custom tools (name, description, input_schema) are"
            )
        return data


def _refuse_fields_of_other_types(model: BaseModel, fields: dict[str, frozenset[str]]) -> None:
    """Raise ValueError naming the first field of `model` that is set (not null) but does not
    belong to its ``type`` (`fields`: type -> the fields it takes), as Anthropic's API refuses
    a key its type does not define; such a field would otherwise be ignored."""
    for f in sorted(model.model_fields_set - fields[model.type] - {"type"}):
        if getattr(model, f) is not None:
            takes = ", ".join(sorted(fields[model.type])) or "no other field"
            raise ValueError(f"{f} is not a field of type {model.type!r} (it takes {takes})")


class ToolChoice(_Strict):
    """auto, any (some tool must be called), tool (the one named), none; ``name`` only with
    tool, ``disable_parallel_tool_use`` not with none (as Anthropic's types: a 400 otherwise)."""

    type: Literal["auto", "any", "tool", "none"]
    name: StrictStr | None = None
    disable_parallel_tool_use: StrictBool | None = None

    @model_validator(mode="after")
    def fields_of_its_type(self) -> ToolChoice:
        """Refuse a field the choice's type does not take (`_refuse_fields_of_other_types`):
        ``{"type": "any", "name": "f"}`` does not force f."""
        parallel = frozenset({"disable_parallel_tool_use"})
        _refuse_fields_of_other_types(
            self, {"auto": parallel, "any": parallel, "tool": parallel | {"name"}, "none": frozenset()}
        )
        return self


class Thinking(_Strict):
    """Extended thinking: enabled with a token budget, disabled, or adaptive (no budget); display
    ``omitted``: thinking blocks come without their text (`render`), ``summarized`` (the
    default here): with it, as the model wrote it."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    display: Literal["summarized", "omitted"] | None = None

    @model_validator(mode="after")
    def fields_of_its_type(self) -> Thinking:
        """Refuse a field the type does not take (`_refuse_fields_of_other_types`):
        ``budget_tokens`` only with enabled (an adaptive one's would not be enforced),
        ``display`` not with disabled."""
        _refuse_fields_of_other_types(
            self,
            {
                "enabled": frozenset({"budget_tokens", "display"}),
                "disabled": frozenset(),
                "adaptive": frozenset({"display"}),
            },
        )
        return self


class Metadata(_Strict):
    """``user_id``: accepted, changes nothing."""

    user_id: StrictStr | None = None


class OutputFormat(_Strict):
    """``output_config.format``: the output must match `schema` (an xgrammar grammar)."""

    type: Literal["json_schema"]
    schema_: JsonObject = Field(alias="schema")


class OutputConfig(_Strict):
    """``format``: structured output; ``effort``: must be absent (no reasoning effort here)."""

    format: OutputFormat | None = None
    effort: None = None


class CountTokensRequest(_Strict, Utf8Only):
    """``POST /v1/messages/count_tokens``: the prompt part of a messages request."""

    model: StrictStr
    messages: Annotated[list[Message], Field(min_length=1)]
    system: list[TextBlock] | StrictStr | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    cache_control: CacheControl | None = None
    speed: Literal["standard"] | None = None
    user_profile_id: StrictStr | None = None
    workspace_id: StrictStr | None = None


class MessagesRequest(CountTokensRequest):
    """``POST /v1/messages``. max_tokens is required (as in Anthropic's API)."""

    max_tokens: Annotated[StrictInt, Field(ge=1)]
    stop_sequences: list[StrictStr] | None = None
    stream: StrictBool = False
    temperature: Annotated[StrictFloat, Field(ge=0, le=1)] | None = None
    top_p: Annotated[StrictFloat, Field(gt=0, le=1)] | None = None
    top_k: Annotated[StrictInt, Field(ge=0)] | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    cache_salt: CacheSalt | None = None  # vLLM's prefix-cache namespace, as on its OpenAI routes
    thread: JsonObject | None = None  # server-held conversation state: refused (see translate.refuse_thread)
    inference_geo: StrictStr | None = None
    container: None = None
    diagnostics: None = None
