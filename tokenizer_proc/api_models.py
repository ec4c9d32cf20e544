"""Request bodies of the OpenAI-compatible and native endpoints (pydantic).

Unknown extra fields of a body are accepted and ignored, as OpenAI clients send vendor
fields; unknown keys inside the native ``sampling_params`` are refused (they can only be
typos of a sampling parameter). Value checks that pydantic expresses live here; checks that
need the model or the server's settings (context length, vocab size, ``--max-n``) live in
`request_builder`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    model_validator,
)

from tokenizer_proc.tool_models import ToolCallIn, ToolChoice, ToolDef


def _check_top_k(v: int) -> int:
    if v < -1:
        raise ValueError("top_k must be -1 or 0 (disabled) or a positive integer")
    return v


TopK = Annotated[StrictInt, AfterValidator(_check_top_k), Field(le=2**31 - 1)]
Seed = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)]
MinP = Annotated[float, Field(ge=0, le=1)]
Penalty = Annotated[float, Field(ge=-2, le=2)]
"""frequency_penalty / presence_penalty (OpenAI's range)."""
MAX_TOKEN_IDS_LOGPROB = 64
"""token_ids_logprob entries at most (each position reports all of them)."""
RepetitionPenalty = Annotated[float, Field(ge=0.01, le=100)]
"""Bounded so that dividing float32 logits by it neither overflows nor underflows."""
Count = Annotated[StrictInt, Field(ge=0)]
N = Annotated[StrictInt, Field(ge=1)]
"""Choices per request; the upper bound is the server's ``--max-n``."""
TopLogprobs = Annotated[StrictInt, Field(ge=0, le=20)]
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
        if len(s) > MAX_STOP_CHARS:
            raise ValueError(f"stop string {i} has {len(s)} characters, at most {MAX_STOP_CHARS} are allowed")
    return v


Stop = Annotated[Union[StrictStr, list[StrictStr], None], AfterValidator(_check_stop)]


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


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _utf8_only(cls, data: Any) -> Any:
        where = _find_surrogate(data, "")
        if where:
            raise ValueError(f"{where}: text contains an unpaired UTF-16 surrogate (not valid Unicode)")
        return data


class StreamOptions(_Body):
    """``include_usage``: send one usage chunk (choices: []) before ``[DONE]``."""

    include_usage: StrictBool = False


class StopFields(_Body):
    """Stopping and rendering fields shared by the OpenAI and native bodies (vLLM's names)."""

    stop: Stop = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    skip_special_tokens: StrictBool = True
    spaces_between_special_tokens: StrictBool = True
    include_stop_str_in_output: StrictBool = False


class SamplingFields(StopFields):
    """Sampling and stopping fields shared by chat and completions (OpenAI plus vLLM's extras)."""

    model: str | None = None
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: TopK | None = None
    min_p: MinP | None = None
    seed: Seed | None = None
    n: N = 1
    logit_bias: dict[str, float] | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    min_tokens: Count | None = None
    response_format: dict[str, Any] | None = None
    user: str | None = None
    custom_logit_processor: StrictStr | None = None
    custom_params: dict[str, Any] | None = None


class ChatMessage(_Body):
    """One chat turn. content: a string, or a list of ``{"type": "text", "text": ...}`` parts
    (null for an assistant turn that only calls tools); tool_calls: an assistant turn's
    calls; tool_call_id: the call a ``tool`` message answers."""

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Union[StrictStr, list[dict[str, Any]], None] = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: StrictStr | None = None


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``. tools / tool_choice / parallel_tool_calls: see
    `tools`; add_generation_prompt, continue_final_message, chat_template_kwargs: see
    `chat_template` (vLLM's names)."""

    messages: list[ChatMessage]
    logprobs: StrictBool | None = None
    top_logprobs: TopLogprobs | None = None
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``. prompt: a string, token ids, or a one-element list of either.
    logprobs: how many top alternatives to report per token (0..5); echo: the prompt comes
    first in the text (and in logprobs)."""

    prompt: Union[StrictStr, list[StrictStr], list[StrictInt], list[list[StrictInt]]]
    logprobs: Annotated[StrictInt, Field(ge=0, le=5)] | None = None
    echo: StrictBool = False
    suffix: str | None = None
    best_of: StrictInt | None = None


class NativeSamplingParams(StopFields):
    """``sampling_params`` of the native ``POST /generate`` (SGLang's names; min_new_tokens
    is OpenAI's min_tokens). Unknown keys are a 400 naming the key. json_schema / regex /
    ebnf: structured-output constraints (at most one); custom_params: the JSON arguments of
    the request's custom logit processor."""

    model_config = ConfigDict(extra="forbid")

    max_new_tokens: StrictInt | None = None
    min_new_tokens: Count = 0
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: TopK = -1
    min_p: MinP = 0.0
    frequency_penalty: Penalty = 0.0
    presence_penalty: Penalty = 0.0
    repetition_penalty: RepetitionPenalty = 1.0
    seed: Seed | None = None
    n: N = 1
    logit_bias: dict[str, float] | None = None
    json_schema: StrictStr | None = None
    regex: StrictStr | None = None
    ebnf: StrictStr | None = None
    custom_params: dict[str, Any] | None = None


class GenerateRequest(_Body):
    """``POST /generate``: ``text`` or ``input_ids``, ``sampling_params``, ``stream``, and
    SGLang's logprob fields: return_logprob (output logprobs in ``meta_info``),
    top_logprobs_num (top alternatives per token, 0..20), token_ids_logprob (also these ids'
    logprobs at each position), logprob_start_len (-1: no prompt logprobs; s >= 0: the
    prompt's from position s on). The last three need return_logprob. custom_logit_processor:
    the name of an operator-installed processor (needs ``--enable-custom-logit-processor``)."""

    text: StrictStr | None = None
    input_ids: list[StrictInt] | None = None
    sampling_params: NativeSamplingParams = NativeSamplingParams()
    stream: StrictBool = False
    rid: str | None = None
    return_logprob: StrictBool = False
    top_logprobs_num: TopLogprobs = 0
    token_ids_logprob: Annotated[list[StrictInt], Field(max_length=MAX_TOKEN_IDS_LOGPROB)] | None = None
    logprob_start_len: Annotated[StrictInt, Field(ge=-1)] = -1
    custom_logit_processor: StrictStr | None = None
