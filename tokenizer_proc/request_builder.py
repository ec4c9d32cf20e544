"""Turning validated HTTP bodies into `GenerateReq` messages (one per choice), with the
checks that need the model or the server's settings: served name, context length, vocab
size, ``--max-n``, supported features."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

import msgspec

from detokenizer_proc.logprob_render import LogprobRenderer
from protocol.enums import ReqField
from protocol.messages import (
    DEFAULT_SAMPLING,
    DetokParams,
    GenerateReq,
    GrammarSpec,
    LogprobEntries,
    ReasoningBudget,
    SamplingParams,
    TokenLogprobs,
)
from tokenizer_proc.api_models import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    NativeSamplingParams,
    SamplingFields,
)
from tokenizer_proc.chat_output import OutputPlan
from tokenizer_proc.chat_template import ChatTemplate
from tokenizer_proc.choices import choice_rid, fan_out
from tokenizer_proc.errors import APIError
from tokenizer_proc.fim import fim_tokens
from tokenizer_proc.grammar_check import NATIVE_FIELDS, from_native, from_response_format
from tokenizer_proc.hf_tokenizer import ModelFacts
from tokenizer_proc.native_batch import at_prompt, check_single, error_at_prompt, listed, prompt_field, split
from tokenizer_proc.reasoning import CLOSE as THINK_CLOSE
from tokenizer_proc.reasoning import OPEN as THINK_OPEN
from tokenizer_proc.reasoning import starts_in_reasoning
from tokenizer_proc.token_pieces import TokenPieces
from tokenizer_proc.tool_grammar import Think, auto_calls
from tokenizer_proc.tool_parsers import ToolParser
from tokenizer_proc.tools import ToolPlan, plan_tools
from tokenizer_proc.unsupported import CHAT, COMPLETION, MESSAGE, NATIVE, refuse_unsupported

NATIVE_MAX_NEW_TOKENS = 128
"""Native ``max_new_tokens`` when a request does not give it (SGLang's default), cut to the
room the context leaves."""
COMPLETION_MAX_TOKENS = 16
"""Completions ``max_tokens`` when a request does not give it (OpenAI's, vLLM's and SGLang's
default for that route), cut to the room the context leaves; chat's default is all the room."""
PROMPT_TAIL = 6
"""Prompt tokens sent to the detokenizer as context for the first token's leading space."""
HEAD_CHARS_PER_TOKEN = 32
"""A prompt text of more characters than this many per context token is tokenized in part
first (`RequestBuilder._encode`)."""
HEAD_SLACK_TOKENS = 64
"""Tokens by which a text's head may outnumber the whole text's tokens of that part (the cut
can split a word the whole text tokenizes otherwise)."""


def new_rid(prefix: str) -> str:
    """A fresh request id: `prefix`, separator included, then 32 hex digits, such as
    ``cmpl-3f2a...`` or ``resp_3f2a...``. The id is the one the response shows (a Responses
    request's ``resp_`` id, an Anthropic message's ``msg_`` id) and the one the logs show."""
    return f"{prefix}{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Built:
    """A checked request. reqs: one `GenerateReq` per choice, choice i of prompt p at index
    p * n + i (see `choices.fan_out`); echoes: per choice, the text shown before its own
    (completions ``echo``), () for none; heads: per choice, its prompt's first token as a
    one-entry `LogprobEntries` (shown with a null logprob) when prompt logprobs start at
    position 0, () for none; output: how a chat request's text is split into content,
    reasoning and tool calls (None: not chat); client_rids: per choice, the id its client chose
    (from the native ``rid``: choice i > 0 of a prompt whose id is ``rid`` as ``{rid}-{i}``),
    () for none. Such an id is only shown (``meta_info.id``) and held as in use while its
    choice runs: the choice runs under a fresh rid, so an id reused once its request ended
    never meets output of the old run still on its way (the fresh rid starts with the
    client's, for the logs). fields: per choice, the body's name of each field a scheduler
    refusal may be about (`request_fields`), () for none."""

    reqs: list[GenerateReq]
    echoes: tuple[str, ...] = ()
    heads: tuple[LogprobEntries | None, ...] = ()
    output: OutputPlan | None = None
    client_rids: tuple[str, ...] = ()
    fields: tuple[dict[ReqField, str], ...] = ()

    def param(self, i: int, field: ReqField) -> str | None:
        """The name of `field` in the body, as choice `i`'s error names it; None for none."""
        return self.fields[i].get(field) if self.fields else None

    @property
    def rid(self) -> str:
        """The request's id (choice 0's rid)."""
        return self.reqs[0].rid

    def shown_rid(self, i: int) -> str:
        """The id shown for choice `i`: the client's, else the choice's rid."""
        return self.client_rids[i] if self.client_rids else self.reqs[i].rid

    def echo(self, i: int) -> str | None:
        """The echoed text of choice `i`, or None."""
        return self.echoes[i] if self.echoes else None

    def head(self, i: int) -> LogprobEntries | None:
        """The head entry of choice `i` (see the class docstring), or None."""
        return self.heads[i] if self.heads else None

    @property
    def leaders(self) -> list[int]:
        """Indexes of the choices that lead their prompt's group (one per prompt)."""
        return [i for i, r in enumerate(self.reqs) if not r.group]

    def leader(self, i: int) -> int:
        """The index of the choice that leads choice `i`'s prompt (`i` itself for a leader)."""
        return max(j for j in self.leaders if j <= i)

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens of the request: each prompt counted once."""
        return sum(len(self.reqs[i].input_ids) for i in self.leaders)


def request_fields(prompt: str, grammar: str | None, budget: str | None = None,
                   rid: str | None = None) -> dict[ReqField, str]:
    """The body's names of the fields a scheduler refusal may be about (`Built.fields`): the
    prompt, where the grammar comes from, the reasoning budget and the client's request id
    (None: the body has no such field), and ``custom_logit_processor``."""
    names = {ReqField.PROMPT: prompt, ReqField.GRAMMAR: grammar, ReqField.REASONING_BUDGET: budget,
             ReqField.RID: rid, ReqField.LOGIT_PROCESSOR: "custom_logit_processor"}
    return {field: name for field, name in names.items() if name is not None}


@dataclass(frozen=True)
class LogprobAsk:
    """What a request asks for in logprobs, in `SamplingParams` terms (-1: none)."""

    top_logprobs: int = -1
    token_ids_logprob: tuple[int, ...] = ()
    logprob_start_len: int = -1


class RequestBuilder:
    """Validates and tokenizes requests for one model.

    tokenizer: a transformers tokenizer with the chat template; facts: context length,
    EOS ids, vocab size; served_names: model names a request may ask for, the first the one
    ``/v1/models`` lists (an unknown name's 404 tells the client to use it); max_n: the most
    choices one prompt may ask for (``--max-n``); max_batch_choices: the most choices a
    request with a list of prompts may ask for, prompts times n (``--max-batch-choices``);
    custom_logit_processor: whether requests may name a custom logit processor
    (``--enable-custom-logit-processor``); tool_parser: the
    ``--tool-call-parser`` family (None: tools are refused); reasoning_parser: the
    ``--reasoning-parser`` name (None: no split).
    """

    def __init__(self, tokenizer, facts: ModelFacts, served_names: tuple[str, ...], max_n: int = 16,
                 max_batch_choices: int = 1024, custom_logit_processor: bool = False,
                 tool_parser: type[ToolParser] | None = None, reasoning_parser: str | None = None) -> None:
        self.tok = tokenizer
        self.template = ChatTemplate(tokenizer)
        self.tool_parser, self.reasoning_parser = tool_parser, reasoning_parser
        self.facts = facts
        self.served_names = served_names
        self.max_n, self.max_batch_choices = max_n, max_batch_choices
        self.custom_logit_processor = custom_logit_processor
        self.pieces = TokenPieces(tokenizer)
        self.fim = fim_tokens(tokenizer)

    # ------------------------------------------------------------------ checks
    def check_model(self, name: str | None) -> None:
        """A 404 (code ``model_not_found``, as OpenAI's, whose message it begins with, then naming
        the model this server serves) unless `name` is None or a served model name."""
        if name is not None and name not in self.served_names:
            raise APIError(f"The model `{name}` does not exist. This server serves `{self.served_names[0]}`: "
                           "send that name as `model` (GET /v1/models lists it)", 404, "model",
                           code="model_not_found")

    def _check_n(self, n: int, param: str) -> None:
        if n > self.max_n:
            raise APIError(f"{param}={n} is more choices than this server allows (--max-n {self.max_n})", 400, param)

    def _check_batch(self, prompts: int, n: int, field: str) -> None:
        """A 400 naming `field` when a list of `prompts` prompts (one prompt too) of `n`
        choices each are more than ``--max-batch-choices`` (each prompt's `n` is checked
        against ``--max-n`` apart)."""
        if prompts * n > self.max_batch_choices:
            raise APIError(f"{field}: {prompts} prompts with n={n} each are {prompts * n} choices, more than this "
                           f"server allows in one request (--max-batch-choices {self.max_batch_choices})", 400, field)

    def _processor(self, name: str | None, params: dict | None, params_field: str) -> tuple[str, str]:
        """(processor name, its arguments as JSON text), ("", "") for none. Raises `APIError`
        when the server was not started with the flag, or arguments come without a name."""
        if name is None:
            if params is not None:
                raise APIError(f"{params_field} needs custom_logit_processor", 400, params_field)
            return "", ""
        if not self.custom_logit_processor:
            raise APIError("custom logit processors are off; start the server with --enable-custom-logit-processor "
                           "and --logit-processor-module MODULE", 400, "custom_logit_processor")
        return name, json.dumps(params or {})

    def _check_ids(self, ids: list[int], param: str) -> None:
        bad = [t for t in ids if not 0 <= t < self.facts.vocab_size]
        if bad:
            raise APIError(f"{param}: token id {bad[0]} is out of range [0, {self.facts.vocab_size})", 400, param)

    def _logit_bias(self, bias: dict[str, float] | None, param: str = "logit_bias") -> dict[int, float]:
        """`bias` (token id as decimal digits -> value in [-100, 100]) by token id; a 400
        naming `param` for a key that is no token id of the model, a value out of range, or two
        keys naming one token ("5" and "05": which value holds would be a guess)."""
        out: dict[int, float] = {}
        keys: dict[int, str] = {}
        for key, value in (bias or {}).items():
            if not (key.isascii() and key.isdigit()):  # int() would also take " 5", "+5", "1_0", "٥"
                raise APIError(f"{param}: key {key!r} is not a token id (decimal digits)", 400, param)
            tok = int(key)
            self._check_ids([tok], param)
            if tok in keys:
                raise APIError(f"{param}: keys {keys[tok]!r} and {key!r} both name token {tok}; give each token once",
                               400, param)
            keys[tok] = key
            if not -100 <= value <= 100:
                raise APIError(f"{param}: value {value} for token {tok} is outside [-100, 100]", 400, param)
            out[tok] = float(value)
        return out

    def _encode(self, text: str, param: str) -> list[int]:
        """The token ids of prompt `text` (no special tokens added). A text of more than
        `HEAD_CHARS_PER_TOKEN` characters per context token is first tokenized up to there:
        when that head alone is more than the context (by over `HEAD_SLACK_TOKENS`), the
        whole prompt is too, and it is a 400 naming `param` without tokenizing the rest (a
        14 MB prompt took 21-45 s of CPU and 2 GB of memory to tokenize before the context
        check refused it). Raises `APIError`."""
        context = self.facts.context_length
        head = context * HEAD_CHARS_PER_TOKEN
        if len(text) > head:
            n = len(self.tok.encode(text[:head], add_special_tokens=False))
            if n > context + HEAD_SLACK_TOKENS:
                raise APIError(f"{param}: the prompt is longer than the context length of {context} tokens: its "
                               f"first {head} characters alone are {n} tokens (it has {len(text)} characters)",
                               400, param)
        return self.tok.encode(text, add_special_tokens=False)

    def _max_new_tokens(self, requested: int | None, prompt_len: int, param: str, prompt_param: str) -> int:
        """The request's token budget: `requested`, or all the room the context leaves.
        Raises a 400 naming `prompt_param` when the prompt fills the context, or `param`
        when `requested` is negative or does not fit."""
        room = self.facts.context_length - prompt_len
        if room <= 0:
            raise APIError(
                f"{prompt_param}: the prompt has {prompt_len} tokens, which leaves no room in the context length of "
                f"{self.facts.context_length} tokens: shorten it to at most {self.facts.context_length - 1} tokens",
                400, prompt_param,
            )
        if requested is None:
            return room
        if requested > room:
            raise APIError(
                f"{param}={requested} plus the prompt's {prompt_len} tokens exceeds the context length of "
                f"{self.facts.context_length} tokens: ask for at most {room}", 400, param,
            )
        return requested

    # ------------------------------------------------------------------ building
    def _build(self, rid: str, ids: list[int], max_new: int, p: SamplingFields | NativeSamplingParams, *,
               logit_bias: dict[int, float], min_tokens: int, min_tokens_param: str, ask: LogprobAsk,
               grammar: GrammarSpec | None, processor: tuple[str, str], sampling_field: str = "") -> GenerateReq:
        """Choice 0's `GenerateReq`. Raises `APIError` for ids out of the vocab, min_tokens
        above the token budget, or a logprob_start_len past the prompt. sampling_field: where
        `p`'s fields sit in the body, for the error's param ("sampling_params." natively)."""
        stop = [p.stop] if isinstance(p.stop, str) else list(p.stop or [])
        stop_ids = list(p.stop_token_ids or [])
        self._check_ids(stop_ids, f"{sampling_field}stop_token_ids")
        self._check_ids(list(ask.token_ids_logprob), "token_ids_logprob")
        if grammar is not None and min_tokens:
            raise APIError(f"{min_tokens_param} cannot be combined with a grammar (its end allows EOS alone)", 400,
                           min_tokens_param)
        if min_tokens > max_new:
            raise APIError(f"{min_tokens_param}={min_tokens} is more than the {max_new} tokens this request may "
                           f"generate", 400, min_tokens_param)
        if ask.logprob_start_len >= len(ids):
            raise APIError(f"logprob_start_len={ask.logprob_start_len} lies past the prompt's {len(ids)} tokens",
                           400, "logprob_start_len")
        eos = [] if p.ignore_eos else list(self.facts.eos_token_ids)
        if min_tokens and len(set(eos) | set(stop_ids)) >= self.facts.vocab_size:
            raise APIError(f"{min_tokens_param} masks the EOS and stop_token_ids tokens, which here are every token: "
                           f"nothing would be left to sample", 400, min_tokens_param)
        sampling = SamplingParams(
            temperature=DEFAULT_SAMPLING.temperature if p.temperature is None else p.temperature,
            top_p=DEFAULT_SAMPLING.top_p if p.top_p is None else p.top_p,
            top_k=-1 if p.top_k in (None, 0) else p.top_k,
            seed=p.seed,
            logit_bias=logit_bias,
            min_p=p.min_p or 0.0,
            frequency_penalty=p.frequency_penalty or 0.0,
            presence_penalty=p.presence_penalty or 0.0,
            repetition_penalty=1.0 if p.repetition_penalty is None else p.repetition_penalty,
            min_tokens=min_tokens,
            min_tokens_ids=eos + stop_ids if min_tokens else [],
            top_logprobs=ask.top_logprobs,
            token_ids_logprob=list(ask.token_ids_logprob),
            logprob_start_len=ask.logprob_start_len,
            logit_processor=processor[0],
            logit_processor_args=processor[1],
        )
        first_scored = max(ask.logprob_start_len, 1)
        detok = DetokParams(
            stop=stop,
            include_stop_str_in_output=p.include_stop_str_in_output,
            skip_special_tokens=p.skip_special_tokens,
            spaces_between_special_tokens=p.spaces_between_special_tokens,
            prompt_tail_ids=ids[-PROMPT_TAIL:],
            logprob_context_ids=ids[max(0, first_scored - PROMPT_TAIL):first_scored] if ask.logprob_start_len >= 0 else [],
            min_tokens=min_tokens,
        )
        return GenerateReq(rid, ids, max_new, sampling, detok, eos, stop_ids, grammar)

    def _head(self, req: GenerateReq) -> LogprobEntries | None:
        """The prompt's first token as an entry, when prompt logprobs start at position 0 (the
        prompt's last too when it is one token long: then it flushes an unfinished character)."""
        if req.sampling.logprob_start_len != 0:
            return None
        d = req.detok
        renderer = LogprobRenderer(self.tok, self.pieces, [], d.skip_special_tokens, d.spaces_between_special_tokens)
        return renderer.render(TokenLogprobs(req.input_ids[:1], [0.0]), 0, len(req.input_ids) == 1)

    def _openai(self, rid: str, ids: list[int], req: SamplingFields, ask: LogprobAsk,
                forced: GrammarSpec | None = None) -> GenerateReq:
        """Choice 0 of an OpenAI request; forced: the grammar of a forced tool call."""
        if req.best_of not in (None, req.n):
            raise APIError(f"best_of={req.best_of} is not supported by this server yet (only best_of equal to n)",
                           400, "best_of")
        grammar = from_response_format(req.response_format)
        if forced is not None:
            if grammar is not None:
                raise APIError("response_format cannot be combined with a forced tool call (tool_choice)", 400,
                               "response_format")
            grammar = forced
        processor = self._processor(req.custom_logit_processor, req.custom_params, "custom_params")
        self._check_n(req.n, "n")
        if not ids:
            raise APIError("the prompt is empty (it has no tokens)", 400, "prompt")
        if None not in (req.max_tokens, req.max_completion_tokens) and req.max_tokens != req.max_completion_tokens:
            raise APIError(f"max_tokens={req.max_tokens} and max_completion_tokens={req.max_completion_tokens} are two "
                           f"limits for one thing: give one of them (or the same value in both)", 400,
                           "max_completion_tokens")
        requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        chat = isinstance(req, ChatCompletionRequest)
        max_new = self._max_new_tokens(requested, len(ids), param, "messages" if chat else "prompt")
        if requested is None and not chat:
            max_new = min(max_new, COMPLETION_MAX_TOKENS)
        return self._build(rid, ids, max_new, req, logit_bias=self._logit_bias(req.logit_bias),
                           min_tokens=req.min_tokens or 0, min_tokens_param="min_tokens", ask=ask, grammar=grammar,
                           processor=processor)

    def _prompts(self, req: CompletionRequest) -> list[tuple[list[int], str]]:
        """(token ids, text) of each prompt of a completions request (text: the prompt as
        echo shows it). Raises `APIError` for ids out of the vocab, a suffix the model
        cannot fill in, or a list of prompts of more than ``--max-batch-choices`` choices."""
        prompt = req.prompt
        many = isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], (str, list))
        if many:
            self._check_batch(len(prompt), req.n, "prompt")
        out = []
        for i, p in enumerate(prompt if many else [prompt]):
            param = f"prompt.{i}" if many else "prompt"
            if isinstance(p, str):
                ids = self._encode(p, param) if p else []
            else:
                ids = list(p)
                self._check_ids(ids, param)
            text = p if isinstance(p, str) else self.tok.decode(ids, skip_special_tokens=req.skip_special_tokens)
            out.append((ids, text))
        if not out:
            raise APIError("prompt is an empty list", 400, "prompt")
        if req.suffix:
            if self.fim is None:
                raise APIError("suffix needs a model whose tokenizer has fill-in-the-middle tokens (such as "
                               "<fim_prefix>, <fim_suffix>, <fim_middle>); this one has none", 400, "suffix")
            after = self.tok.encode(req.suffix, add_special_tokens=False)
            out = [(self.fim.prompt(ids, after), text) for ids, text in out]
        return out

    def completion(self, req: CompletionRequest) -> Built:
        """Checks and tokenizes a completions request: n choices for each of its prompts
        (choice i of prompt p at index p * n + i). Raises `APIError`."""
        self.check_model(req.model)
        refuse_unsupported(req.model_extra, COMPLETION)
        prompts = self._prompts(req)
        wants = req.logprobs is not None
        ask = LogprobAsk(req.logprobs if wants else -1, (), 0 if wants and req.echo else -1)
        rid = new_rid("cmpl-")
        reqs, echoes, heads, fields = [], [], [], []
        for p, (ids, text) in enumerate(prompts):
            param = f"prompt.{p}" if len(prompts) > 1 else "prompt"
            try:
                gen = self._openai(choice_rid(rid, p * req.n), ids, req, ask)
            except APIError as e:
                if param != "prompt" and e.param == "prompt":  # a message led by "prompt: " is led by param instead
                    e.param, e.message = param, f"{param}: {e.message.removeprefix('prompt: ')}"
                raise
            reqs += fan_out(gen, req.n)
            echoes += [text] * req.n
            heads += [self._head(gen)] * req.n
            fields += [request_fields(param, "response_format")] * req.n
        return Built(reqs, tuple(echoes) if req.echo else (), tuple(heads), fields=tuple(fields))

    def chat(self, req: ChatCompletionRequest, rid_prefix: str = "chatcmpl-") -> Built:
        """Renders the chat template, then checks and tokenizes. rid_prefix: the start of the
        request's id (`new_rid`), the API's id prefix (a Responses request runs as ``resp_...``).
        Raises `APIError`."""
        self.check_model(req.model)
        refuse_unsupported(req.model_extra, CHAT)
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError("top_logprobs needs logprobs: true", 400, "top_logprobs")
        for i, message in enumerate(req.messages):
            refuse_unsupported(message.model_extra, MESSAGE, f"messages.{i}.")
        if req.continue_final_message and "add_generation_prompt" in req.model_fields_set and req.add_generation_prompt:
            raise APIError("continue_final_message and add_generation_prompt cannot both be true", 400,
                           "continue_final_message")
        tools = plan_tools(req.tools, req.tool_choice, req.parallel_tool_calls, self.tool_parser)
        text = self.template.render(req.messages, parser=self.tool_parser, tools=tools.tools,
                                    add_generation_prompt=req.add_generation_prompt and not req.continue_final_message,
                                    continue_final_message=req.continue_final_message, kwargs=req.chat_template_kwargs)
        ids = self._encode(text, "messages")
        ask = LogprobAsk(req.top_logprobs or 0) if req.logprobs else LogprobAsk()
        markers = (tools.parser.SPECIAL_MARKERS if tools.parser else ()) + (
            (THINK_OPEN, THINK_CLOSE) if self.reasoning_parser else ())
        if set(markers) & set(self.tok.all_special_tokens):  # the parsers must see them in the text
            req = req.model_copy(update={"skip_special_tokens": False})
        gen = self._openai(new_rid(rid_prefix), ids, req, ask, tools.grammar)
        gen = msgspec.structs.replace(gen, detok=tools.stops_outside_calls(gen.detok))
        if req.continue_final_message and gen.grammar is not None:
            raise APIError("continue_final_message cannot be combined with response_format or a forced tool call: "
                           "their grammar holds from the first generated token, so the reply would start over "
                           "after the prefilled text instead of continuing it", 400, "continue_final_message")
        # under a grammar the output is the grammar's from its first token: no think block
        split = self.reasoning_parser is not None and gen.grammar is None
        output = OutputPlan(tools.parser, tools.max_calls, split,
                            split and starts_in_reasoning(self.reasoning_parser, text))
        budget, budget_field = req.thinking_token_budget, "thinking_token_budget"
        if output.in_reasoning and (req.chat_template_kwargs or {}).get("enable_thinking") is False:
            # thinking is off but the prompt leaves the output inside the block: close it at once
            budget, budget_field = 0, "chat_template_kwargs"
        grammar_field = "response_format" if tools.grammar is None else "tools"
        if budget is not None:
            gen = msgspec.structs.replace(gen, reasoning_budget=self._reasoning_budget(
                budget, output, gen.grammar is not None))
        elif gen.grammar is None and not gen.sampling.min_tokens and (strict := self._strict_auto(tools, output)):
            gen, grammar_field = msgspec.structs.replace(gen, grammar=strict), "tools"
        fields = request_fields("messages", grammar_field, budget_field)
        return Built(fan_out(gen, req.n), output=output, fields=(fields,) * req.n)

    def _strict_auto(self, tools: ToolPlan, output: OutputPlan) -> GrammarSpec | None:
        """The grammar of strict tools under ``tool_choice: "auto"`` (`tool_grammar.auto_calls`),
        or None when the plan has none or a marker the output needs is a special token of
        this tokenizer: the family's call marker (Mistral's ``[TOOL_CALLS]``), or with a
        reasoning parser the think tags. A grammar never allows special tokens (the hand-off
        enters them as empty text, `grammar_tokenizer`), so the model could not write them;
        such a request is served as before this grammar existed: calls parsed, not enforced.

        The caller leaves it out, keeping today's behaviour (calls parsed, not enforced), where
        another constraint holds: response_format (it is enforced; the tools are parsed),
        thinking_token_budget (the scheduler runs a budget or a grammar, not both), min_tokens
        (it masks EOS, which may be the only token the grammar allows after a call)."""
        if tools.strict is None or tools.parser is None:
            return None
        special = set(self.tok.all_special_tokens)
        think = Think(THINK_OPEN, THINK_CLOSE, output.in_reasoning) if output.reasoning else None
        if tools.parser.TRIGGER in special or (think is not None and {THINK_OPEN, THINK_CLOSE} & special):
            return None
        return auto_calls(tools.parser, tools.tools, list(tools.strict), tools.max_calls is None, think)

    def _reasoning_budget(self, budget: int, output: OutputPlan, constrained: bool) -> ReasoningBudget:
        """The scheduler's form of ``thinking_token_budget``. Raises a 400 `APIError` without
        a reasoning parser (the think block is not known), or under a grammar (response_format
        or a forced tool call), which leaves no room for a think block."""
        param = "thinking_token_budget"
        if constrained:
            raise APIError(f"{param} cannot be combined with response_format or a forced tool call (their grammar "
                           f"leaves no room for reasoning)", 400, param)
        if not output.reasoning:
            raise APIError(f"{param} needs a server started with --reasoning-parser", 400, param)
        return ReasoningBudget(budget, self.tok.encode(THINK_OPEN, add_special_tokens=False),
                               self.tok.encode(THINK_CLOSE, add_special_tokens=False), output.in_reasoning)

    @staticmethod
    def _native_ask(req: GenerateRequest) -> LogprobAsk:
        """The logprob fields of a native request; they need return_logprob (else a 400)."""
        if req.return_logprob:
            return LogprobAsk(req.top_logprobs_num, tuple(req.token_ids_logprob or ()), req.logprob_start_len)
        for field, unset in (("top_logprobs_num", req.top_logprobs_num == 0),
                             ("token_ids_logprob", not req.token_ids_logprob),
                             ("logprob_start_len", req.logprob_start_len < 0)):
            if not unset:
                raise APIError(f"{field} needs return_logprob: true", 400, field)
        return LogprobAsk()

    def native(self, req: GenerateRequest) -> Built:
        """Checks and tokenizes a native ``/generate`` request: one prompt, or a batch of
        them (`native_batch`), choice i of prompt p at index p * n + i. Every prompt is
        checked here, before anything is sent, so a bad one refuses the whole batch with a 400
        naming its index. Raises `APIError`."""
        refuse_unsupported(req.model_extra, NATIVE)
        if (req.text is None) == (req.input_ids is None):
            raise APIError("give exactly one of text and input_ids", 400, "text")
        if req.batch_size is None:
            check_single(req)
            return self._native_prompt(req)
        parts = split(req)
        field, each, n = prompt_field(req), listed(req), parts[0].sampling_params.n
        self._check_batch(len(parts), n, field)
        reqs, heads, rids, fields = [], [], [], []
        for p, part in enumerate(parts):
            try:
                built = self._native_prompt(part)
            except APIError as e:
                raise error_at_prompt(e, p, each, f"{field}.{p}") from None
            reqs += built.reqs
            heads += built.heads
            rids += built.client_rids
            fields += [{k: at_prompt(name, p, each) for k, name in f.items()} for f in built.fields]
        seen: set[str] = set()
        for i, rid in enumerate(rids):
            if rid in seen:
                param = at_prompt("rid", i // n, each)
                raise APIError(f"{param}: request id {rid!r} is given twice in this batch (choice i > 0 of a "
                               f"prompt whose id is R is shown as R-i)", 400, param)
            seen.add(rid)
        return Built(reqs, (), tuple(heads), client_rids=tuple(rids), fields=tuple(fields))

    def _native_prompt(self, req: GenerateRequest) -> Built:
        """Checks and tokenizes a native body of one prompt (a batch's: `native_batch.split`)."""
        if req.input_ids is not None:
            ids = list(req.input_ids)
            self._check_ids(ids, "input_ids")
        else:
            ids = self._encode(req.text, prompt_field(req)) if req.text else []
        field = prompt_field(req)
        if not ids:
            raise APIError(f"{field}: the prompt is empty (it has no tokens)", 400, field)
        p = req.sampling_params
        self._check_n(p.n, "sampling_params.n")
        max_new = self._max_new_tokens(p.max_new_tokens, len(ids), "sampling_params.max_new_tokens", field)
        if p.max_new_tokens is None:
            max_new = min(max_new, NATIVE_MAX_NEW_TOKENS)
        gen = self._build(new_rid(f"{req.rid or 'gen'}-"), ids, max_new, p,
                          logit_bias=self._logit_bias(p.logit_bias, "sampling_params.logit_bias"),
                          min_tokens=p.min_new_tokens, min_tokens_param="sampling_params.min_new_tokens",
                          ask=self._native_ask(req), grammar=from_native(p.json_schema, p.regex, p.ebnf),
                          processor=self._processor(req.custom_logit_processor, p.custom_params,
                                                    "sampling_params.custom_params"),
                          sampling_field="sampling_params.")
        grammar = next((NATIVE_FIELDS + name for name in ("json_schema", "regex", "ebnf")
                        if getattr(p, name) is not None), None)
        fields = request_fields(field, grammar, rid="rid" if req.rid is not None else None)
        client_rids = tuple(choice_rid(req.rid, i) for i in range(p.n)) if req.rid else ()
        return Built(fan_out(gen, p.n), (), (self._head(gen),) * p.n, client_rids=client_rids,
                     fields=(fields,) * p.n)
