"""Request fields this server knows but does not implement: a 400 naming the field.

A body has three kinds of fields. Those the request models declare are implemented, or are
accepted because they ask for nothing that changes the answer (the allow-list, see
`request.fields`). Those in the tables below are fields of the OpenAI API, or vLLM / SGLang
extras, whose effect this server does not provide, or the names another route of this
server gives a field (Responses, Anthropic, native): sending one with a value that asks for
that effect is a 400 naming the field and what to use instead, never silently ignored. Any
other top-level field is ignored, as OpenAI clients send vendor fields of their own (case V3
of the serving cases), and named in a warning line and a response header (`web.ignored_fields`); unknown keys inside native ``sampling_params`` and ``stream_options``
are refused by their models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args

from tokenizer_proc.errors import APIError
from tokenizer_proc.request.fields import ServiceTier

UNSUPPORTED = "is not supported by this server"
"""`Refusal.says` of a field whose effect this server does not provide."""
MISPLACED = "is not read at the top level"
"""`Refusal.says` of a field that is supported elsewhere in the body (the hint says where)."""
OTHER_ROUTE = "is not a field of this route"
"""`Refusal.says` of another route's name for a field (the hint says this route's)."""


@dataclass(frozen=True)
class Refusal:
    """hint: why, or what to use instead; accepts: the values that ask for nothing beyond
    what the server does anyway (null always counts as absent); says: what the error says
    of the field (`UNSUPPORTED`, `MISPLACED`, `OTHER_ROUTE`)."""

    hint: str
    accepts: tuple = ()
    says: str = UNSUPPORTED


NO_MODERATION = Refusal("moderation is not supported")
NO_EFFORT = (
    "use thinking_token_budget to cap the reasoning in tokens; chat_template_kwargs (e.g. enable_thinking: "
    "false) turns it off where the template allows"
)

EXTRAS: dict[str, Refusal] = {
    "min_characters": Refusal(
        "a minimum output length in characters is not supported; set a minimum in tokens", (0, 0.0)
    ),
    "repetition_detection": Refusal(
        "repetition detection is not supported; use repetition_penalty or frequency_penalty", (False,)
    ),
    "vllm_xargs": Refusal("vLLM's extra arguments are not read; use custom_logit_processor with custom_params", ({},)),
    "samplers": Refusal(
        "the order of the sampling steps is fixed (logit edits, penalties, then temperature, top-k, top-p and min-p)"
    ),
    "t_max_predict_ms": Refusal("a time limit on generation is not supported; cap the output in tokens", (0, 0.0)),
    "kv_transfer_params": Refusal("disaggregated prefill (KV transfer between servers) is not supported", ({},)),
    "return_progress": Refusal("prompt-processing progress is not reported", (False,)),
    "timings_per_token": Refusal("per-token timings are not reported; /metrics has latency histograms", (False,)),
}
"""vLLM and llama.cpp extras that change the answer or ask for more output, refused on every
route that reads unknown fields (both OpenAI routes, Responses and ``/generate``; the
Anthropic route refuses every undeclared field)."""

SHARED: dict[str, Refusal] = {
    **EXTRAS,
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
    "return_token_ids": Refusal("use /generate, whose output carries token ids", (False,)),
    "stop_regex": Refusal("use stop with plain strings", ([],)),
    "prompt_embeds": Refusal("prompt embeddings are not supported; send the prompt as text or token ids"),
    "grammar": Refusal("use /generate with sampling_params.ebnf"),
    "n_predict": Refusal("use max_tokens"),
    "repeat_penalty": Refusal("use repetition_penalty", (1, 1.0)),
    "n_probs": Refusal("use logprobs (top_logprobs in chat)", (0,)),
    "typical_p": Refusal("typical sampling is not supported", (1, 1.0)),
    "tfs_z": Refusal("tail-free sampling is not supported", (1, 1.0)),
    "mirostat": Refusal("mirostat sampling is not supported", (0,)),
    "dry_multiplier": Refusal("DRY sampling is not supported", (0, 0.0)),
    "xtc_probability": Refusal("XTC sampling is not supported", (0, 0.0)),
    "dynatemp_range": Refusal("dynamic temperature is not supported", (0, 0.0)),
}
"""vLLM, SGLang and llama.cpp extras of both OpenAI routes that would change the output."""

OTHER_ROUTES: dict[str, Refusal] = {
    "max_output_tokens": Refusal("use max_tokens (max_output_tokens is the Responses API's name)", says=OTHER_ROUTE),
    "max_new_tokens": Refusal("use max_tokens (max_new_tokens is /generate's, in sampling_params)", says=OTHER_ROUTE),
    "min_new_tokens": Refusal("use min_tokens (min_new_tokens is /generate's, in sampling_params)", says=OTHER_ROUTE),
    "stop_sequences": Refusal("use stop (stop_sequences is the Anthropic API's name)", ([],), says=OTHER_ROUTE),
    "sampling_params": Refusal(
        "/generate's; here its fields are top-level ones (max_tokens, temperature, stop, ...)", says=OTHER_ROUTE
    ),
    "output_config": Refusal("use response_format (output_config.format is the Anthropic API's)", says=OTHER_ROUTE),
    "max_tokens_to_sample": Refusal(
        "use max_tokens (max_tokens_to_sample is Anthropic's legacy Text Completions' name)", says=OTHER_ROUTE
    ),
}
"""Both OpenAI routes: the names this server's other routes (Responses, Anthropic,
``/generate``) give fields these routes have, which an unknown field would be taken for, and
dropped (a stop that never stopped, a budget left at the whole context)."""

CHAT: dict[str, Refusal] = {
    **SHARED,
    **OTHER_ROUTES,
    "system": Refusal("put it in a system message (system is the Anthropic API's field)", says=OTHER_ROUTE),
    "instructions": Refusal(
        "put them in a system message (instructions is the Responses API's field)", says=OTHER_ROUTE
    ),
    "input": Refusal("use messages (input is the Responses API's field)", says=OTHER_ROUTE),
    "prompt": Refusal("use messages, or completions for a prompt", says=OTHER_ROUTE),
    "text": Refusal(
        "use messages for the prompt and response_format for the output's format (text is /generate's "
        "prompt, text.format the Responses API's format)",
        says=OTHER_ROUTE,
    ),
    "input_ids": Refusal("use messages, or completions or /generate for a prompt of token ids", says=OTHER_ROUTE),
    "thinking": Refusal(f"the Anthropic API's field; {NO_EFFORT}", says=OTHER_ROUTE),
    "enable_thinking": Refusal(
        'use chat_template_kwargs: {"enable_thinking": ...} (a top-level enable_thinking is some vendors\' field)',
        says=OTHER_ROUTE,
    ),
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
}
"""``POST /v1/chat/completions``: OpenAI fields not implemented, then vLLM / SGLang extras."""

NO_TOOLS = "completions do not call tools; use chat completions"
NO_REASONING = "completions do not split out reasoning; use chat completions"

COMPLETION: dict[str, Refusal] = {
    **SHARED,
    **OTHER_ROUTES,
    "system": Refusal("put it in the prompt (completions apply no chat template)", says=OTHER_ROUTE),
    "instructions": Refusal("put them in the prompt (completions apply no chat template)", says=OTHER_ROUTE),
    "input": Refusal("use prompt (input is the Responses API's field)", says=OTHER_ROUTE),
    "messages": Refusal("use chat completions, or give the text as prompt", says=OTHER_ROUTE),
    "text": Refusal("use prompt (text is /generate's prompt)", says=OTHER_ROUTE),
    "input_ids": Refusal("use prompt, which takes a list of token ids", says=OTHER_ROUTE),
    "thinking": Refusal(NO_REASONING, says=OTHER_ROUTE),
    "enable_thinking": Refusal(NO_REASONING, says=OTHER_ROUTE),
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
}
"""``POST /v1/completions``: vLLM / SGLang extras, then chat fields (which an unknown field
would be taken for, and dropped) that would change the answer."""

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
    "max_new_tokens": Refusal(
        "use max_output_tokens (max_new_tokens is /generate's, in sampling_params)", says=OTHER_ROUTE
    ),
    "min_new_tokens": Refusal(f"/generate's, in sampling_params; {CHAT_ONLY} (min_tokens)", says=OTHER_ROUTE),
    "stop_sequences": Refusal(f"the Anthropic API's name for stop; {CHAT_ONLY}", ([],), says=OTHER_ROUTE),
    "system": Refusal(
        "use instructions, or a system message in input (system is the Anthropic API's field)", says=OTHER_ROUTE
    ),
    "output_config": Refusal("use text.format (output_config.format is the Anthropic API's)", says=OTHER_ROUTE),
    "thinking": Refusal(
        "use thinking_token_budget to cap the reasoning (thinking is the Anthropic API's field)", says=OTHER_ROUTE
    ),
    "sampling_params": Refusal(
        "/generate's; here its fields are top-level ones (max_output_tokens, temperature, ...)", says=OTHER_ROUTE
    ),
    "input_ids": Refusal("use input (input_ids is /generate's field)", says=OTHER_ROUTE),
    "max_tokens_to_sample": Refusal(
        "use max_output_tokens (max_tokens_to_sample is Anthropic's legacy Text Completions' name)", says=OTHER_ROUTE
    ),
    "enable_thinking": Refusal("use chat completions' chat_template_kwargs", says=OTHER_ROUTE),
    **SHARED,
}
"""``POST /v1/responses`` (and ``/v1/responses/input_tokens``): chat completions fields and their
vLLM / SGLang extras (which an unknown field would be taken for, and dropped) that would change
the answer, the input-token count's ``personality`` (a style preset, which changes the prompt),
and the Anthropic and ``/generate`` names of fields a response has."""

CONTINUE = "to continue the last assistant message, send continue_final_message: true and add_generation_prompt: false"

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
    **EXTRAS,
    "custom_params": Refusal("it goes inside sampling_params", says=MISPLACED),
    "input_embeds": Refusal("give text or input_ids"),
    "image_data": Refusal("only text is supported"),
    "audio_data": Refusal("only text is supported"),
    "video_data": Refusal("only text is supported"),
    "lora_path": Refusal("LoRA adapters are not supported"),
    "lora_id": Refusal("LoRA adapters are not supported"),
    "session_params": Refusal("sessions are not supported"),
    "return_hidden_states": Refusal("hidden states are not returned", (False,)),
    **{
        name: Refusal(f"use sampling_params.max_new_tokens ({name} is the OpenAI APIs' name)", says=OTHER_ROUTE)
        for name in ("max_tokens", "max_completion_tokens", "max_output_tokens")
    },
    "min_tokens": Refusal(
        "use sampling_params.min_new_tokens (min_tokens is the OpenAI routes' name)", says=OTHER_ROUTE
    ),
    "stop_sequences": Refusal(
        "use sampling_params.stop (stop_sequences is the Anthropic API's name)", ([],), says=OTHER_ROUTE
    ),
    "response_format": Refusal("use sampling_params.json_schema (a JSON schema as a string)", says=OTHER_ROUTE),
    "stream_options": Refusal(
        "each streamed chunk's meta_info carries the token counts (stream_options is the OpenAI routes' name)",
        says=OTHER_ROUTE,
    ),
    "messages": Refusal(
        "give text or input_ids; /v1/chat/completions renders messages with the chat template", says=OTHER_ROUTE
    ),
    "prompt": Refusal("use text, or input_ids for token ids", says=OTHER_ROUTE),
    "input": Refusal("use text, or input_ids for token ids", says=OTHER_ROUTE),
    "system": Refusal("put it in text (/generate applies no chat template)", says=OTHER_ROUTE),
    "instructions": Refusal("put them in text (/generate applies no chat template)", says=OTHER_ROUTE),
    "logprobs": Refusal(
        "use return_logprob (and top_logprobs_num; logprobs is the OpenAI routes' name)", says=OTHER_ROUTE
    ),
    "top_logprobs": Refusal("use top_logprobs_num (top_logprobs is the OpenAI routes' name)", says=OTHER_ROUTE),
}
"""Top level of native ``POST /generate`` (SGLang's fields), then the OpenAI and Anthropic
names of fields it has (dropped as unknown otherwise: ``max_tokens`` left the budget at 128,
``messages`` was no prompt); `native.convert.REFUSED` adds every ``sampling_params`` field
given at the top level."""


def refuse_unsupported(extra: dict[str, Any] | None, table: dict[str, Refusal], where: str = "") -> None:
    """Raise a 400 `APIError` naming the first field of `extra` (a body's undeclared fields)
    that `table` refuses with its value. where: the field path's prefix, e.g. ``messages.0.``."""
    for field, value in (extra or {}).items():
        refusal = table.get(field)
        if refusal is None or value is None or _accepted(value, refusal.accepts):
            continue
        param = where + field
        raise APIError(f"{param} {refusal.says}: {refusal.hint}", 400, param)


def _accepted(value: Any, accepts: tuple) -> bool:
    """`value` equals one of `accepts` with the same JSON type (so 0 is not False)."""
    return any(type(value) is type(a) and value == a for a in accepts)
