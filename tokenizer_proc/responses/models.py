"""Request bodies of the OpenAI Responses API (pydantic).

As on the other OpenAI routes, unknown top-level fields are ignored (clients send vendor
fields) and named in a warning line and a response header (`web.ignored_fields`); every field of the Responses API this server knows is declared, and one that asks
for something not served takes only its no-op values (``background`` false, ``include``
empty or ``reasoning.encrypted_content``, which reasoning items sent back do not need here as
they are left out, ``truncation`` "disabled", ...), so anything else is a 400 naming it. Objects inside
the body (input items, content parts, ``text``) refuse unknown keys. Input items without a
``type`` are messages.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    Tag,
    field_validator,
)

from tokenizer_proc.request.chat_template import decode_arguments
from tokenizer_proc.request.fields import Body, CacheSalt, NullIsAbsent, PromptCacheOptions, ServiceTier, Streamed
from tokenizer_proc.tools.models import tool_choice_type


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class CacheBreakpoint(_Strict):
    """A part's ``prompt_cache_breakpoint``: a caching hint that changes no output here (the
    prefix cache reuses any shared prefix without breakpoints), its values checked."""

    mode: Literal["explicit"]
    ttl: Literal["30m", "12h"] | None = None


class InputText(_Strict):
    """Text a user, system or developer gave (prompt_cache_breakpoint: see `CacheBreakpoint`)."""

    type: Literal["input_text"]
    text: StrictStr
    prompt_cache_breakpoint: CacheBreakpoint | None = None


class OutputText(_Strict):
    """Text an assistant wrote (an earlier response's output sent back)."""

    type: Literal["output_text"]
    text: StrictStr
    annotations: Annotated[list[Any], Field(max_length=0)] | None = None
    logprobs: list[Any] | None = None


class RefusalPart(_Strict):
    """A refusal an assistant wrote (an earlier output sent back): its words, read as text in
    an assistant message only, as chat completions read an assistant's refusal
    (`chat_template.part_key`)."""

    type: Literal["refusal"]
    refusal: StrictStr


Part = Annotated[InputText | OutputText | RefusalPart, Field(discriminator="type")]


class MessageItem(_Strict):
    """A message: content as text or parts. id / status: as an earlier output carried them."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: list[Part] | StrictStr
    id: StrictStr | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None
    phase: Literal["commentary", "final_answer"] | None = None


class FunctionCallItem(_Strict):
    """A function call the model made earlier (sent back with its output)."""

    type: Literal["function_call"]
    call_id: StrictStr
    name: StrictStr
    arguments: StrictStr
    id: StrictStr | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    @field_validator("arguments")
    @classmethod
    def _object(cls, text: str) -> str:
        """The arguments must be the JSON text of an object (checked here, so that the
        error names this item, not the chat message it becomes)."""
        decode_arguments(text)
        return text


class FunctionCallOutputItem(_Strict):
    """The output of function call `call_id`."""

    type: Literal["function_call_output"]
    call_id: StrictStr
    output: list[InputText] | StrictStr
    id: StrictStr | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


class ReasoningText(_Strict):
    """Reasoning text of an earlier output."""

    type: Literal["reasoning_text"]
    text: StrictStr


class ReasoningItem(_Strict):
    """An earlier output's reasoning, sent back: accepted and left out of the prompt (chat
    templates drop earlier turns' reasoning)."""

    type: Literal["reasoning"]
    id: StrictStr | None = None
    summary: list[dict[str, Any]] = []
    content: list[ReasoningText] | None = None
    encrypted_content: StrictStr | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


def _item_type(v: Any) -> str | None:
    return v.get("type", "message") if isinstance(v, dict) else getattr(v, "type", None)


Item = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_type),
]


class FunctionTool(_Strict):
    """A function the model may call: name, description, its arguments' JSON schema."""

    type: Literal["function"]
    name: StrictStr
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class FunctionChoice(_Strict):
    """``tool_choice`` naming the function the model must call."""

    type: Literal["function"]
    name: StrictStr


class TextFormat(_Strict):
    """``text.format``: text, json_object, or json_schema (with name and schema)."""

    type: Literal["text", "json_object", "json_schema"]
    name: StrictStr | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    description: StrictStr | None = None
    strict: StrictBool | None = None


class TextConfig(_Strict):
    """``text``: its format; ``verbosity`` only as OpenAI's default, ``medium`` (the model
    answers as it does), another value is a 400."""

    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None


class ReasoningConfig(_Strict):
    """``reasoning``, accepted when it asks for nothing: ``{}``, nulls, or ``summary: "auto"``
    (which leaves it to the server, and there is no summarizer here). An ``effort`` is a 400:
    nothing here steers how long a model reasons (``thinking_token_budget`` bounds it)."""

    effort: None = None
    summary: Literal["auto"] | None = None
    generate_summary: Literal["auto"] | None = None


class AccessPrograms(_Strict):
    """``access_programs``: only the standard program exists here (the model answers as it is),
    so another one (a Daybreak program, which OpenAI serves to authorized projects only) is a 400."""

    cyber: Literal["standard"] | None = None


class ImageOptions(_Strict):
    """``image``: options for input images, which change nothing here (images are refused)."""

    context_compression: Literal["auto", "enabled", "disabled"] | None = None


class StreamOptions(_Strict):
    """``include_obfuscation``: accepted, events carry no padding."""

    include_obfuscation: StrictBool | None = None


Includable = Literal["reasoning.encrypted_content"]
"""What ``include`` may ask for (on create and retrieve): encrypted reasoning, of which there is
none to add (reasoning items sent back are left out here, so they need none)."""


class ResponsesRequest(Body, Streamed, NullIsAbsent):
    """``POST /v1/responses``. input: text or items; instructions: a system message that is
    not carried to later responses; previous_response_id: continue a stored response (see
    `store`); store: keep this response for that (default true); thinking_token_budget: as
    on chat completions (vLLM's extension). Null for an optional field is the field absent
    (``stream``, ``store`` take their defaults), as on chat completions. Fields declared as
    None take null only: each asks for an effect not served (``moderation`` would block or
    score the text, ``context_management`` compact the input, ``background_options`` shape
    a background run, ...)."""

    model: StrictStr | None = None
    input: list[Item] | StrictStr
    instructions: StrictStr | None = None
    max_output_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Annotated[StrictFloat, Field(ge=0, le=2)] | None = None
    top_p: Annotated[StrictFloat, Field(gt=0, le=1)] | None = None
    tools: list[Annotated[FunctionTool, Field(discriminator="type")]] | None = None
    tool_choice: tool_choice_type(FunctionChoice) | None = None
    parallel_tool_calls: StrictBool | None = None
    max_tool_calls: None = None
    text: TextConfig | None = None
    stream_options: StreamOptions | None = None
    store: StrictBool = True
    previous_response_id: StrictStr | None = None
    metadata: (
        Annotated[
            dict[Annotated[str, Field(max_length=64)], Annotated[StrictStr, Field(max_length=512)]],
            Field(max_length=16),
        ]
        | None
    ) = None
    user: StrictStr | None = None
    safety_identifier: StrictStr | None = None
    prompt_cache_key: StrictStr | None = None
    cache_salt: CacheSalt | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    prompt_cache_options: PromptCacheOptions | None = None
    service_tier: ServiceTier | None = None
    truncation: Literal["disabled"] | None = None
    include: list[Includable] | None = None
    reasoning: ReasoningConfig | None = None
    thinking_token_budget: Annotated[StrictInt, Field(ge=0)] | None = None
    background: Literal[False] | None = None
    top_logprobs: Literal[0] | None = None
    conversation: None = None
    prompt: None = None
    moderation: None = None
    context_management: None = None
    background_options: None = None
    access_programs: AccessPrograms | None = None
    image: ImageOptions | None = None
