"""OpenAI chat and completions bodies as `GenerateReq` messages (`build_chat`,
`build_completion`), on the shared checks of `RequestBuilder`."""

from __future__ import annotations

import msgspec

from protocol.messages import (
    GenerateReq,
    GrammarSpec,
    ReasoningBudget,
)
from tokenizer_proc.errors import APIError
from tokenizer_proc.openai.models import ChatCompletionRequest, CompletionRequest, SamplingFields
from tokenizer_proc.output.chat_output import OutputPlan
from tokenizer_proc.output.reasoning import CLOSE as THINK_CLOSE
from tokenizer_proc.output.reasoning import OPEN as THINK_OPEN
from tokenizer_proc.output.reasoning import starts_in_reasoning
from tokenizer_proc.request.builder import Built, LogprobAsk, RequestBuilder, new_rid, request_fields
from tokenizer_proc.request.fan_out import choice_rid, fan_out
from tokenizer_proc.request.unsupported import CHAT, COMPLETION, MESSAGE, refuse_unsupported
from tokenizer_proc.structured.check import from_response_format
from tokenizer_proc.tools.grammar import Think, auto_calls
from tokenizer_proc.tools.plan import ToolPlan, plan_tools

COMPLETION_MAX_TOKENS = 16
"""Completions ``max_tokens`` when a request does not give it (OpenAI's, vLLM's and SGLang's
default for that route), cut to the room the context leaves; chat's default is all the room
(``--default-max-tokens`` replaces both)."""


def _first_choice(
    b: RequestBuilder, rid: str, ids: list[int], req: SamplingFields, ask: LogprobAsk, forced: GrammarSpec | None = None
) -> GenerateReq:
    """Choice 0 of an OpenAI request; forced: the grammar of a forced tool call."""
    if req.best_of not in (None, req.n):
        raise APIError(
            f"best_of={req.best_of} is not supported by this server yet (only best_of equal to n)", 400, "best_of"
        )
    grammar = from_response_format(req.response_format)
    if forced is not None:
        if grammar is not None:
            raise APIError(
                "response_format cannot be combined with a forced tool call (tool_choice)", 400, "response_format"
            )
        grammar = forced
    processor = b.processor(req.custom_logit_processor, req.custom_params, "custom_params")
    b.check_n(req.n, "n")
    if not ids:
        raise APIError("the prompt is empty (it has no tokens)", 400, "prompt")
    if None not in (req.max_tokens, req.max_completion_tokens) and req.max_tokens != req.max_completion_tokens:
        raise APIError(
            f"max_tokens={req.max_tokens} and max_completion_tokens={req.max_completion_tokens} are two "
            f"limits for one thing: give one of them (or the same value in both)",
            400,
            "max_completion_tokens",
        )
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    chat = isinstance(req, ChatCompletionRequest)
    max_new = b.max_new_tokens(
        requested, len(ids), param, "messages" if chat else "prompt", None if chat else COMPLETION_MAX_TOKENS
    )
    return b.build(
        rid,
        ids,
        max_new,
        req,
        logit_bias=b.logit_bias(req.logit_bias),
        min_tokens=req.min_tokens or 0,
        min_tokens_param="min_tokens",
        ask=ask,
        grammar=grammar,
        processor=processor,
        cache_salt=req.cache_salt,
    )


def _prompts(b: RequestBuilder, req: CompletionRequest) -> list[tuple[list[int], str]]:
    """(token ids, text) of each prompt of a completions request (text: the prompt as
    echo shows it; for token ids without echo, the ids' text is not needed and is ""). Raises `APIError` for ids out of the vocab, a suffix the model
    cannot fill in, or a list of prompts of more than ``--max-batch-choices`` choices."""
    prompt = req.prompt
    many = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], (str, list))
    if many:
        b.check_batch(len(prompt), req.n, "prompt")
    out = []
    for i, p in enumerate(prompt if many else [prompt]):
        param = f"prompt.{i}" if many else "prompt"
        if isinstance(p, str):
            ids = b.encode(p, param) if p else []
        else:
            ids = list(p)
            b.check_ids(ids, param)
        # echo shows the prompt whole, its special tokens too, as vLLM's echo does
        # (skip_special_tokens is about the output); without echo no decode is paid for
        text = p if isinstance(p, str) or not req.echo else b.tok.decode(ids, skip_special_tokens=False)
        out.append((ids, text))
    if not out:
        raise APIError("prompt is an empty list", 400, "prompt")
    if req.suffix:
        if b.fim is None:
            raise APIError(
                "suffix needs a model whose tokenizer has fill-in-the-middle tokens (such as "
                "<fim_prefix>, <fim_suffix>, <fim_middle>); this one has none",
                400,
                "suffix",
            )
        after = b.tok.encode(req.suffix, add_special_tokens=False)
        out = [(b.fim.prompt(ids, after), text) for ids, text in out]
    return out


def build_completion(b: RequestBuilder, req: CompletionRequest) -> Built:
    """Checks and tokenizes a completions request: n choices for each of its prompts
    (choice i of prompt p at index p * n + i). Raises `APIError`."""
    b.check_model(req.model)
    refuse_unsupported(req.model_extra, COMPLETION)
    prompts = _prompts(b, req)
    wants = req.logprobs is not None
    ask = LogprobAsk(req.logprobs if wants else -1, (), 0 if wants and req.echo else -1)
    rid = new_rid("cmpl-")
    reqs, echoes, heads, fields = [], [], [], []
    for p, (ids, text) in enumerate(prompts):
        param = f"prompt.{p}" if len(prompts) > 1 else "prompt"
        try:
            gen = _first_choice(b, choice_rid(rid, p * req.n), ids, req, ask)
        except APIError as e:
            if param != "prompt" and e.param == "prompt":  # a message led by "prompt: " is led by param instead
                e.param, e.message = param, f"{param}: {e.message.removeprefix('prompt: ')}"
            raise
        reqs += fan_out(gen, req.n)
        echoes += [text] * req.n
        heads += [b.head(gen)] * req.n
        fields += [request_fields(param, "response_format")] * req.n
    return Built(reqs, tuple(echoes) if req.echo else (), tuple(heads), fields=tuple(fields))


def build_chat(b: RequestBuilder, req: ChatCompletionRequest, rid_prefix: str = "chatcmpl-") -> Built:
    """Renders the chat template, then checks and tokenizes. rid_prefix: the start of the
    request's id (`new_rid`), the API's id prefix (a Responses request runs as ``resp_...``).
    Raises `APIError`."""
    b.check_model(req.model)
    refuse_unsupported(req.model_extra, CHAT)
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError("top_logprobs needs logprobs: true", 400, "top_logprobs")
    for i, message in enumerate(req.messages):
        refuse_unsupported(message.model_extra, MESSAGE, f"messages.{i}.")
    if req.continue_final_message and "add_generation_prompt" in req.model_fields_set and req.add_generation_prompt:
        raise APIError(
            "continue_final_message and add_generation_prompt cannot both be true", 400, "continue_final_message"
        )
    tools = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls, b.tool_parser)
    text = b.template.render(
        req.messages,
        parser=b.tool_parser,
        tools=tools.tools,
        add_generation_prompt=req.add_generation_prompt and not req.continue_final_message,
        continue_final_message=req.continue_final_message,
        kwargs=req.chat_template_kwargs,
    )
    ids = b.encode(text, "messages")
    ask = LogprobAsk(req.top_logprobs or 0) if req.logprobs else LogprobAsk()
    markers = (tools.parser.SPECIAL_MARKERS if tools.parser else ()) + (
        (THINK_OPEN, THINK_CLOSE) if b.reasoning_parser else ()
    )
    if set(markers) & set(b.tok.all_special_tokens):  # the parsers must see them in the text
        req = req.model_copy(update={"skip_special_tokens": False})
    gen = _first_choice(b, new_rid(rid_prefix), ids, req, ask, tools.grammar)
    gen = msgspec.structs.replace(gen, detok=tools.stops_outside_calls(gen.detok))
    if req.continue_final_message and gen.grammar is not None:
        raise APIError(
            "continue_final_message cannot be combined with response_format or a forced tool call: "
            "their grammar holds from the first generated token, so the reply would start over "
            "after the prefilled text instead of continuing it",
            400,
            "continue_final_message",
        )
    # under a grammar the output is the grammar's from its first token: no think block
    split = b.reasoning_parser is not None and gen.grammar is None
    output = OutputPlan(tools.parser, tools.max_calls, split, split and starts_in_reasoning(b.reasoning_parser, text))
    budget, budget_field = req.thinking_token_budget, "thinking_token_budget"
    if output.in_reasoning and (req.chat_template_kwargs or {}).get("enable_thinking") is False:
        # thinking is off but the prompt leaves the output inside the block: close it at once
        budget, budget_field = 0, "chat_template_kwargs"
    grammar_field = "response_format" if tools.grammar is None else "tools"
    if budget is not None:
        gen = msgspec.structs.replace(
            gen, reasoning_budget=_reasoning_budget(b, budget, output, gen.grammar is not None)
        )
    elif gen.grammar is None and not gen.sampling.min_tokens and (strict := _strict_auto(b, tools, output)):
        gen, grammar_field = msgspec.structs.replace(gen, grammar=strict), "tools"
    fields = request_fields("messages", grammar_field, budget_field)
    return Built(fan_out(gen, req.n), output=output, fields=(fields,) * req.n)


def _strict_auto(b: RequestBuilder, tools: ToolPlan, output: OutputPlan) -> GrammarSpec | None:
    """The grammar of strict tools under ``tool_choice: "auto"`` (`tools.grammar.auto_calls`),
    or None when the plan has none or a marker the output needs is a special token of
    this tokenizer: the family's call marker (Mistral's ``[TOOL_CALLS]``), or with a
    reasoning parser the think tags. A grammar never allows special tokens (the hand-off
    enters them as empty text, `structured.tokenizer_info`), so the model could not write them;
    such a request is served as before this grammar existed: calls parsed, not enforced.

    The caller leaves it out, keeping today's behaviour (calls parsed, not enforced), where
    another constraint holds: response_format (it is enforced; the tools are parsed),
    thinking_token_budget (the scheduler runs a budget or a grammar, not both), min_tokens
    (it masks EOS, which may be the only token the grammar allows after a call)."""
    if tools.strict is None or tools.parser is None:
        return None
    special = set(b.tok.all_special_tokens)
    think = Think(THINK_OPEN, THINK_CLOSE, output.in_reasoning) if output.reasoning else None
    if tools.parser.TRIGGER in special or (think is not None and {THINK_OPEN, THINK_CLOSE} & special):
        return None
    return auto_calls(tools.parser, tools.tools, list(tools.strict), tools.max_calls is None, think)


def _reasoning_budget(b: RequestBuilder, budget: int, output: OutputPlan, constrained: bool) -> ReasoningBudget:
    """The scheduler's form of ``thinking_token_budget``. Raises a 400 `APIError` without
    a reasoning parser (the think block is not known), or under a grammar (response_format
    or a forced tool call), which leaves no room for a think block."""
    param = "thinking_token_budget"
    if constrained:
        raise APIError(
            f"{param} cannot be combined with response_format or a forced tool call (their grammar "
            f"leaves no room for reasoning)",
            400,
            param,
        )
    if not output.reasoning:
        raise APIError(f"{param} needs a server started with --reasoning-parser", 400, param)
    return ReasoningBudget(
        budget,
        b.tok.encode(THINK_OPEN, add_special_tokens=False),
        b.tok.encode(THINK_CLOSE, add_special_tokens=False),
        output.in_reasoning,
    )
