"""Request fields this server knows but does not implement: a 400 naming the field.

A body has three kinds of fields. Those the request models declare are implemented, or are
accepted because they ask for nothing that changes the answer (the allow-list, see
`api_models`). Those in the tables below are fields of the OpenAI API, or vLLM / SGLang
extras, whose effect this server does not provide: sending one with a value that asks for
that effect is a 400 naming the field and what to use instead, never silently ignored. So is
a field of one of this server's other APIs sent to a route that does not read it (Anthropic's
``system`` or ``stop_sequences``, SGLang's ``max_new_tokens`` on chat completions, OpenAI's
``max_tokens`` on native ``/generate``, ...: `foreign`): dropped, it left a request without its
system prompt, or generating up to the whole context. Any other top-level field is ignored, as
OpenAI clients send vendor fields of their own (case V3 of the serving cases); unknown keys
inside native ``sampling_params`` and ``stream_options`` are refused by their models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args

from tokenizer_proc.api_models import GenerateRequest, NativeSamplingParams, ServiceTier
from tokenizer_proc.errors import APIError


@dataclass(frozen=True)
class Refusal:
    """hint: why, or what to use instead; accepts: the values that ask for nothing beyond
    what the server does anyway (null always counts as absent); misplaced: the field is
    supported, elsewhere in the body (the hint says where), so the error does not call it
    unsupported; owner: the API of this server whose field it is, for a field this route
    does not read (`foreign`)."""

    hint: str
    accepts: tuple = ()
    misplaced: bool = False
    owner: str = ""


ANTHROPIC, RESPONSES_API, NATIVE_API = "Anthropic Messages (/v1/messages)", "the Responses API", "native /generate"
OWNERS = {
    "system": ANTHROPIC, "stop_sequences": ANTHROPIC, "thinking": ANTHROPIC, "output_config": ANTHROPIC,
    "max_tokens_to_sample": "Anthropic's legacy Text Completions",
    "instructions": RESPONSES_API, "input": RESPONSES_API, "max_output_tokens": RESPONSES_API,
    "text": NATIVE_API, "input_ids": NATIVE_API, "sampling_params": NATIVE_API, "max_new_tokens": NATIVE_API,
    "min_new_tokens": NATIVE_API,
    "enable_thinking": "some vendors' chat completions",
    "messages": "chat completions", "prompt": "completions", "max_tokens": "the OpenAI routes",
    "max_completion_tokens": "the OpenAI routes", "min_tokens": "the OpenAI routes",
    "response_format": "the OpenAI routes", "logprobs": "the OpenAI routes", "top_logprobs": "the OpenAI routes",
}
"""Field name -> the API of this server (or the vendors) whose field it is."""


def foreign(hints: dict[str, str]) -> dict[str, Refusal]:
    """Refusals of other APIs' fields (`OWNERS` names the API), each with what to use on
    the route instead: sent to a route that does not read them, they would be dropped."""
    return {name: Refusal(hint, owner=OWNERS[name]) for name, hint in hints.items()}


NO_MODERATION = Refusal("moderation is not supported")
NO_EFFORT = ("use thinking_token_budget to cap the reasoning in tokens; chat_template_kwargs (e.g. enable_thinking: "
             "false) turns it off where the template allows")

SHARED: dict[str, Refusal] = {
    "guided_json": Refusal("use response_format"),
    "guided_regex": Refusal("use /generate with sampling_params.regex"),
    "guided_choice": Refusal("use response_format or /generate with sampling_params.regex"),
    "guided_grammar": Refusal("use /generate with sampling_params.ebnf"),
    "guided_decoding_backend": Refusal("grammars use xgrammar"),
    "guided_whitespace_pattern": Refusal("grammars allow at most 2 whitespace characters between JSON tokens"),
    "structured_outputs": Refusal("use response_format"),
    "structural_tag": Refusal("use response_format"),
    "json_schema": Refusal("use response_format"),
    "regex": Refusal("use /generate with sampling_params.regex"),
    "ebnf": Refusal("use /generate with sampling_params.ebnf"),
    "prompt_logprobs": Refusal("use completions echo with logprobs"),
    "use_beam_search": Refusal("beam search is not supported", (False,)),
    "length_penalty": Refusal("it only acts with beam search, which is not supported", (1, 1.0)),
    "allowed_token_ids": Refusal("use logit_bias"),
    "bad_words": Refusal("use logit_bias", ([],)),
    "truncate_prompt_tokens": Refusal("shorten the prompt"),
    "add_special_tokens": Refusal("the prompt is tokenized without added special tokens", (False,)),
    "return_tokens_as_token_ids": Refusal("use /generate, whose logprobs carry token ids", (False,)),
    "logits_processors": Refusal("use custom_logit_processor"),
    "no_stop_trim": Refusal("use include_stop_str_in_output", (False,)),
    "lora_path": Refusal("LoRA adapters are not supported"),
    "return_hidden_states": Refusal("hidden states are not returned", (False,)),
}
"""vLLM and SGLang extras of both OpenAI routes that would change the output."""

CHAT: dict[str, Refusal] = {
    **SHARED,
    "functions": Refusal("use tools", ([],)),
    "function_call": Refusal("use tool_choice", ("none",)),
    "audio": Refusal("audio output is not supported"),
    "prediction": Refusal("predicted outputs are not supported"),
    "web_search_options": Refusal("web search is not supported"),
    "reasoning_effort": Refusal(NO_EFFORT),
    "thinking_budget": Refusal(NO_EFFORT),
    "verbosity": Refusal("not supported; ask for brevity in the prompt"),
    "moderation": NO_MODERATION,
    "echo": Refusal("chat does not echo; use completions echo", (False,)),
    "suffix": Refusal("chat has no suffix"),
    "chat_template": Refusal("the model's own chat template is used"),
    "documents": Refusal("put the documents in a message"),
    "mm_processor_kwargs": Refusal("only text is supported"),
    **foreign({
        "system": "here a system prompt is a message with role system",
        "instructions": "here instructions are a message with role system",
        "input": "use messages",
        "prompt": "use messages (or POST /v1/completions)",
        "text": "use messages",
        "input_ids": "use POST /v1/completions, whose prompt takes token ids",
        "sampling_params": "give its parameters at the top level under OpenAI's names",
        "max_output_tokens": "use max_tokens or max_completion_tokens",
        "max_new_tokens": "use max_tokens or max_completion_tokens",
        "max_tokens_to_sample": "use max_tokens or max_completion_tokens",
        "min_new_tokens": "use min_tokens",
        "stop_sequences": "use stop",
        "thinking": NO_EFFORT,
        "enable_thinking": "use chat_template_kwargs: {\"enable_thinking\": ...}",
        "output_config": "use response_format",
    }),
}
"""``POST /v1/chat/completions``: OpenAI fields not implemented, then vLLM / SGLang extras,
then other APIs' fields."""

NO_TOOLS = "completions do not call tools; use chat completions"
NO_REASONING = "completions do not split out reasoning; use chat completions"

COMPLETION: dict[str, Refusal] = {
    **SHARED,
    "thinking_token_budget": Refusal(NO_REASONING),
    "thinking_budget": Refusal(NO_REASONING),
    "reasoning_effort": Refusal(NO_REASONING),
    "top_logprobs": Refusal("completions take logprobs: N (0..5), the top alternatives per token"),
    "tools": Refusal(NO_TOOLS, ([],)),
    "tool_choice": Refusal(NO_TOOLS, ("none",)),
    "functions": Refusal(NO_TOOLS, ([],)),
    "function_call": Refusal(NO_TOOLS, ("none",)),
    "chat_template_kwargs": Refusal("completions apply no chat template; the prompt is sent as it is", ({},)),
    "audio": Refusal("audio output is not supported"),
    "modalities": Refusal("completions answer text only", (["text"],)),
    "prediction": Refusal("predicted outputs are not supported"),
    "web_search_options": Refusal("web search is not supported"),
    "verbosity": Refusal("not supported; ask for brevity in the prompt"),
    "moderation": NO_MODERATION,
    "service_tier": Refusal("only the default tier is served", get_args(ServiceTier)),
    **foreign({
        "messages": "use POST /v1/chat/completions (completions take a prompt)",
        "system": "completions take one prompt: write it there, or use chat completions",
        "instructions": "completions take one prompt: write it there, or use chat completions",
        "input": "use prompt",
        "text": "use prompt",
        "input_ids": "use prompt, which takes a list of token ids",
        "sampling_params": "give its parameters at the top level under OpenAI's names",
        "max_output_tokens": "use max_tokens",
        "max_new_tokens": "use max_tokens",
        "max_tokens_to_sample": "use max_tokens",
        "min_new_tokens": "use min_tokens",
        "stop_sequences": "use stop",
        "thinking": NO_REASONING,
        "enable_thinking": NO_REASONING,
        "output_config": "use response_format",
    }),
}
"""``POST /v1/completions``: vLLM / SGLang extras, then chat fields (which an unknown field
would be taken for, and dropped) that would change the answer, then other APIs' fields."""

CHAT_ONLY = "not a Responses field; use chat completions"

RESPONSES: dict[str, Refusal] = {
    "max_tokens": Refusal("use max_output_tokens"),
    "max_completion_tokens": Refusal("use max_output_tokens"),
    "messages": Refusal("use input"),
    "response_format": Refusal("use text.format"),
    "n": Refusal("a response has one output; send several requests", (1,)),
    "stop": Refusal(CHAT_ONLY, ([],)),
    "seed": Refusal(CHAT_ONLY),
    "frequency_penalty": Refusal(CHAT_ONLY, (0, 0.0)),
    "presence_penalty": Refusal(CHAT_ONLY, (0, 0.0)),
    "logit_bias": Refusal(CHAT_ONLY, ({},)),
    "logprobs": Refusal(CHAT_ONLY, (False,)),
    "top_k": Refusal(CHAT_ONLY, (-1, 0)),
    "min_p": Refusal(CHAT_ONLY, (0, 0.0)),
    "repetition_penalty": Refusal(CHAT_ONLY, (1, 1.0)),
    "min_tokens": Refusal(CHAT_ONLY, (0,)),
    "best_of": Refusal(CHAT_ONLY, (1,)),
    "stop_token_ids": Refusal(CHAT_ONLY, ([],)),
    "ignore_eos": Refusal(CHAT_ONLY, (False,)),
    "custom_logit_processor": Refusal(CHAT_ONLY),
    "custom_params": Refusal(CHAT_ONLY),
    "personality": Refusal("style presets are not supported; describe the style in instructions"),
    **SHARED,
    **foreign({
        "system": "use instructions",
        "input_ids": "use input",
        "sampling_params": "give its parameters at the top level under the Responses API's names",
        "max_new_tokens": "use max_output_tokens",
        "max_tokens_to_sample": "use max_output_tokens",
        "stop_sequences": "stop strings are not a Responses field; use chat completions",
        "thinking": NO_EFFORT,
        "enable_thinking": "use chat completions' chat_template_kwargs",
        "output_config": "use text.format",
    }),
}
"""``POST /v1/responses`` (and ``/v1/responses/input_tokens``): chat completions fields and their
vLLM / SGLang extras (which an unknown field would be taken for, and dropped) that would change
the answer, and the input-token count's ``personality`` (a style preset, which changes the prompt)."""

CONTINUE = ("to continue the last assistant message, send continue_final_message: true and "
            "add_generation_prompt: false")

MESSAGE: dict[str, Refusal] = {
    "function_call": Refusal("use tool_calls"),
    "audio": Refusal("audio is not supported"),
    "prefix": Refusal(CONTINUE, (False,)),
    "partial": Refusal(CONTINUE, (False,)),
}
"""One chat message (``messages.i.``): OpenAI's fields not implemented, then the vendors' marks
of an assistant prefill (DeepSeek's ``prefix``, Moonshot's ``partial``), which, dropped, left
the model starting a new turn instead of continuing the message."""

NATIVE: dict[str, Refusal] = {
    "custom_params": Refusal("it goes inside sampling_params", misplaced=True),
    "input_embeds": Refusal("give text or input_ids"),
    "image_data": Refusal("only text is supported"),
    "audio_data": Refusal("only text is supported"),
    "video_data": Refusal("only text is supported"),
    "lora_path": Refusal("LoRA adapters are not supported"),
    "lora_id": Refusal("LoRA adapters are not supported"),
    "session_params": Refusal("sessions are not supported"),
    "return_hidden_states": Refusal("hidden states are not returned", (False,)),
    **foreign({
        "messages": "/generate takes text or input_ids (use POST /v1/chat/completions for messages)",
        "prompt": "/generate takes text or input_ids",
        "input": "/generate takes text or input_ids",
        "system": "/generate takes text or input_ids; write it into the text",
        "max_tokens": "SGLang's name here is sampling_params.max_new_tokens",
        "max_completion_tokens": "SGLang's name here is sampling_params.max_new_tokens",
        "max_output_tokens": "SGLang's name here is sampling_params.max_new_tokens",
        "min_tokens": "SGLang's name here is sampling_params.min_new_tokens",
        "stop_sequences": "SGLang's name here is sampling_params.stop",
        "response_format": "structured output here is sampling_params.json_schema (the schema as a JSON string), "
                           "regex or ebnf",
        "logprobs": "use return_logprob (and top_logprobs_num)",
        "top_logprobs": "use top_logprobs_num",
    }),
}
"""Top level of native ``POST /generate`` (SGLang's fields, then other APIs'); `NATIVE` also refuses every
``sampling_params`` field given at the top level (``{"text", "regex"}`` or
``{"text", "max_new_tokens"}`` would otherwise run unconstrained or with the default budget)."""
NATIVE.update({name: Refusal("it is a sampling parameter: put it inside sampling_params", misplaced=True)
               for name in NativeSamplingParams.model_fields
               if name not in GenerateRequest.model_fields and name not in NATIVE})


def refuse_unsupported(extra: dict[str, Any] | None, table: dict[str, Refusal], where: str = "") -> None:
    """Raise a 400 `APIError` naming the first field of `extra` (a body's undeclared fields)
    that `table` refuses with its value. where: the field path's prefix, e.g. ``messages.0.``."""
    for field, value in (extra or {}).items():
        refusal = table.get(field)
        if refusal is None or value is None or _accepted(value, refusal.accepts):
            continue
        param = where + field
        what = ("is not read at the top level" if refusal.misplaced
                else f"is a field of {refusal.owner}, not of this route" if refusal.owner
                else "is not supported by this server")
        raise APIError(f"{param} {what}: {refusal.hint}", 400, param)


def _accepted(value: Any, accepts: tuple) -> bool:
    """`value` equals one of `accepts` with the same JSON type (so 0 is not False)."""
    return any(type(value) is type(a) and value == a for a in accepts)
