"""Request bodies of ``POST /v1/chat/completions`` and ``POST /v1/completions`` (pydantic),
built from the shared field types of `request.fields`; see there for what is accepted and refused."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    StrictBool,
    StrictFloat,
    StrictStr,
    field_validator,
)

from tokenizer_proc.request.fields import (
    Body,
    CacheSalt,
    Count,
    LogitBias,
    MessageContent,
    Metadata,
    MinP,
    N,
    NullIsAbsent,
    Penalty,
    Prompt,
    PromptCacheOptions,
    RepetitionPenalty,
    ResponseFormat,
    Seed,
    ServiceTier,
    StopFields,
    Streamed,
    StreamOptions,
    TokenBudget,
    TopK,
    TopLogprobs,
    integer,
)
from tokenizer_proc.tools.models import ToolCallIn, ToolChoice, ToolDef


class SamplingFields(StopFields, Streamed, NullIsAbsent):
    """Sampling and stopping fields shared by chat and completions (OpenAI plus vLLM's
    extras); null for any of them, or for another optional field of those bodies, is absent.
    speculative: false opts the request out of speculative decoding (``--speculative-algorithm``)."""

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
    cache_salt: CacheSalt | None = None
    speculative: StrictBool | None = None


class ChatMessage(Body):
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
            raise ValueError(
                "the role 'function' (legacy function calling) is not supported: answer a tool call "
                "with a message of role 'tool' carrying its tool_call_id"
            )
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
    `Prompt`). max_tokens: 16 when not given (OpenAI's default, see `request.builder`).
    logprobs: how many top alternatives to report per token (0..5); echo: the prompt comes
    first in the text (and in logprobs); suffix: text after the completion (fill-in-the-middle,
    for models with FIM tokens: `fim`)."""

    prompt: Prompt
    logprobs: integer(ge=0, le=5) | None = None
    echo: StrictBool = False
    suffix: StrictStr | None = None
