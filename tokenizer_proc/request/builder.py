"""`RequestBuilder`: what every API surface shares in turning a validated body into
`GenerateReq` messages (one per choice, `Built`), with the checks that need the model or
the server's settings: served name, context length, vocab size, ``--max-n``, token ids,
logit bias, custom logit processors. Each surface's conversion calls it: `openai.convert`
(chat and completions; Anthropic and Responses run on the chat path) and `native.convert`."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from protocol.enums import ReqField
from protocol.messages import (
    DEFAULT_SAMPLING,
    DetokParams,
    GenerateReq,
    GrammarSpec,
    LogprobEntries,
    SamplingParams,
    TokenLogprobs,
)
from text.hf_tokenizer import ModelFacts
from text.logprob_render import LogprobRenderer
from text.token_pieces import TokenPieces
from tokenizer_proc.errors import APIError
from tokenizer_proc.output.chat_output import OutputPlan
from tokenizer_proc.request.chat_template import ChatTemplate
from tokenizer_proc.request.fields import SamplingBody
from tokenizer_proc.request.fim import fim_tokens
from tokenizer_proc.tools.parsers import ToolParser

PROMPT_TAIL = 6
"""Prompt tokens sent to the detokenizer as context for the first token's leading space."""
HEAD_CHARS_PER_TOKEN = 32
"""A prompt text of more characters than this many per context token is tokenized in part
first (`RequestBuilder.encode`)."""
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


def request_fields(
    prompt: str, grammar: str | None, budget: str | None = None, rid: str | None = None
) -> dict[ReqField, str]:
    """The body's names of the fields a scheduler refusal may be about (`Built.fields`): the
    prompt, where the grammar comes from, the reasoning budget and the client's request id
    (None: the body has no such field), and ``custom_logit_processor``."""
    names = {
        ReqField.PROMPT: prompt,
        ReqField.GRAMMAR: grammar,
        ReqField.REASONING_BUDGET: budget,
        ReqField.RID: rid,
        ReqField.LOGIT_PROCESSOR: "custom_logit_processor",
    }
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
    ``--reasoning-parser`` name (None: no split); default_max_tokens: the output tokens of a
    request that gives no limit (``--default-max-tokens``; None: each route's own default).
    """

    def __init__(
        self,
        tokenizer,
        facts: ModelFacts,
        served_names: tuple[str, ...],
        max_n: int = 16,
        max_batch_choices: int = 1024,
        custom_logit_processor: bool = False,
        tool_parser: type[ToolParser] | None = None,
        reasoning_parser: str | None = None,
        default_max_tokens: int | None = None,
    ) -> None:
        self.tok = tokenizer
        self.template = ChatTemplate(tokenizer)
        self.tool_parser, self.reasoning_parser = tool_parser, reasoning_parser
        self.facts = facts
        self.served_names = served_names
        self.max_n, self.max_batch_choices = max_n, max_batch_choices
        self.custom_logit_processor = custom_logit_processor
        self.default_max_tokens = default_max_tokens
        self.pieces = TokenPieces(tokenizer)
        self.fim = fim_tokens(tokenizer)

    # ------------------------------------------------------------------ checks
    def check_model(self, name: str | None) -> None:
        """A 404 (code ``model_not_found``, as OpenAI's, whose message it begins with, then naming
        the model this server serves) unless `name` is None or a served model name."""
        if name is not None and name not in self.served_names:
            raise APIError(
                f"The model `{name}` does not exist. This server serves `{self.served_names[0]}`: "
                "send that name as `model` (GET /v1/models lists it)",
                404,
                "model",
                code="model_not_found",
            )

    def check_n(self, n: int, param: str) -> None:
        if n > self.max_n:
            raise APIError(f"{param}={n} is more choices than this server allows (--max-n {self.max_n})", 400, param)

    def check_batch(self, prompts: int, n: int, field: str) -> None:
        """A 400 naming `field` when a list of `prompts` prompts (one prompt too) of `n`
        choices each are more than ``--max-batch-choices`` (each prompt's `n` is checked
        against ``--max-n`` apart)."""
        if prompts * n > self.max_batch_choices:
            raise APIError(
                f"{field}: {prompts} prompts with n={n} each are {prompts * n} choices, more than this "
                f"server allows in one request (--max-batch-choices {self.max_batch_choices})",
                400,
                field,
            )

    def processor(self, name: str | None, params: dict | None, params_field: str) -> tuple[str, str]:
        """(processor name, its arguments as JSON text), ("", "") for none. Raises `APIError`
        when the server was not started with the flag, or arguments come without a name."""
        if name is None:
            if params is not None:
                raise APIError(f"{params_field} needs custom_logit_processor", 400, params_field)
            return "", ""
        if not self.custom_logit_processor:
            raise APIError(
                "custom logit processors are off; start the server with --enable-custom-logit-processor "
                "and --logit-processor-module MODULE",
                400,
                "custom_logit_processor",
            )
        return name, json.dumps(params or {})

    def check_ids(self, ids: list[int], param: str) -> None:
        bad = [t for t in ids if not 0 <= t < self.facts.vocab_size]
        if bad:
            raise APIError(f"{param}: token id {bad[0]} is out of range [0, {self.facts.vocab_size})", 400, param)

    def logit_bias(self, bias: dict[str, float] | None, param: str = "logit_bias") -> dict[int, float]:
        """`bias` (token id as decimal digits -> value in [-100, 100]) by token id; a 400
        naming `param` for a key that is no token id of the model, a value out of range, or two
        keys naming one token ("5" and "05": which value holds would be a guess)."""
        out: dict[int, float] = {}
        keys: dict[int, str] = {}
        for key, value in (bias or {}).items():
            if not (key.isascii() and key.isdigit()):  # int() would also take " 5", "+5", "1_0", "٥"
                raise APIError(f"{param}: key {key!r} is not a token id (decimal digits)", 400, param)
            tok = int(key)
            self.check_ids([tok], param)
            if tok in keys:
                raise APIError(
                    f"{param}: keys {keys[tok]!r} and {key!r} both name token {tok}; give each token once", 400, param
                )
            keys[tok] = key
            if not -100 <= value <= 100:
                raise APIError(f"{param}: value {value} for token {tok} is outside [-100, 100]", 400, param)
            out[tok] = float(value)
        return out

    def encode(self, text: str, param: str) -> list[int]:
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
                raise APIError(
                    f"{param}: the prompt is longer than the context length of {context} tokens: its "
                    f"first {head} characters alone are {n} tokens (it has {len(text)} characters)",
                    400,
                    param,
                )
        return self.tok.encode(text, add_special_tokens=False)

    def max_new_tokens(
        self, requested: int | None, prompt_len: int, param: str, prompt_param: str, route_default: int | None = None
    ) -> int:
        """The request's token budget: `requested`; when it is None, ``--default-max-tokens``,
        else `route_default` (None: all the room the context leaves), cut to that room.
        Raises a 400 naming `prompt_param` when the prompt fills the context, or `param`
        when `requested` is negative or does not fit."""
        room = self.facts.context_length - prompt_len
        if room <= 0:
            raise APIError(
                f"{prompt_param}: the prompt has {prompt_len} tokens, which leaves no room in the context length of "
                f"{self.facts.context_length} tokens: shorten it to at most {self.facts.context_length - 1} tokens",
                400,
                prompt_param,
            )
        if requested is None:
            default = route_default if self.default_max_tokens is None else self.default_max_tokens
            return room if default is None else min(room, default)
        if requested > room:
            raise APIError(
                f"{param}={requested} plus the prompt's {prompt_len} tokens exceeds the context length of "
                f"{self.facts.context_length} tokens: ask for at most {room}",
                400,
                param,
            )
        return requested

    # ------------------------------------------------------------------ building
    def build(
        self,
        rid: str,
        ids: list[int],
        max_new: int,
        p: SamplingBody,
        *,
        logit_bias: dict[int, float],
        min_tokens: int,
        min_tokens_param: str,
        ask: LogprobAsk,
        grammar: GrammarSpec | None,
        processor: tuple[str, str],
        cache_salt: str | None,
        sampling_field: str = "",
    ) -> GenerateReq:
        """Choice 0's `GenerateReq`. Raises `APIError` for ids out of the vocab, min_tokens
        above the token budget, or a logprob_start_len past the prompt. sampling_field: where
        `p`'s fields sit in the body, for the error's param ("sampling_params." natively);
        cache_salt: the prefix-cache namespace (`GenerateReq.cache_salt`; None: the shared one)."""
        stop = [p.stop] if isinstance(p.stop, str) else list(p.stop or [])
        stop_ids = list(p.stop_token_ids or [])
        self.check_ids(stop_ids, f"{sampling_field}stop_token_ids")
        self.check_ids(list(ask.token_ids_logprob), "token_ids_logprob")
        if grammar is not None and min_tokens:
            raise APIError(
                f"{min_tokens_param} cannot be combined with a grammar (its end allows EOS alone)",
                400,
                min_tokens_param,
            )
        if min_tokens > max_new:
            raise APIError(
                f"{min_tokens_param}={min_tokens} is more than the {max_new} tokens this request may generate",
                400,
                min_tokens_param,
            )
        if ask.logprob_start_len >= len(ids):
            raise APIError(
                f"logprob_start_len={ask.logprob_start_len} lies past the prompt's {len(ids)} tokens",
                400,
                "logprob_start_len",
            )
        eos = [] if p.ignore_eos else list(self.facts.eos_token_ids)
        if min_tokens and len(set(eos) | set(stop_ids)) >= self.facts.vocab_size:
            raise APIError(
                f"{min_tokens_param} masks the EOS and stop_token_ids tokens, which here are every token: "
                f"nothing would be left to sample",
                400,
                min_tokens_param,
            )
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
            speculative=p.speculative is not False,
        )
        first_scored = max(ask.logprob_start_len, 1)
        detok = DetokParams(
            stop=stop,
            include_stop_str_in_output=p.include_stop_str_in_output,
            skip_special_tokens=p.skip_special_tokens,
            spaces_between_special_tokens=p.spaces_between_special_tokens,
            prompt_tail_ids=ids[-PROMPT_TAIL:],
            logprob_context_ids=ids[max(0, first_scored - PROMPT_TAIL) : first_scored]
            if ask.logprob_start_len >= 0
            else [],
            min_tokens=min_tokens,
        )
        return GenerateReq(rid, ids, max_new, sampling, detok, eos, stop_ids, grammar, cache_salt=cache_salt or "")

    def head(self, req: GenerateReq) -> LogprobEntries | None:
        """The prompt's first token as an entry, when prompt logprobs start at position 0 (the
        prompt's last too when it is one token long: then it flushes an unfinished character)."""
        if req.sampling.logprob_start_len != 0:
            return None
        d = req.detok
        renderer = LogprobRenderer(self.tok, self.pieces, [], d.skip_special_tokens, d.spaces_between_special_tokens)
        return renderer.render(TokenLogprobs(req.input_ids[:1], [0.0]), 0, len(req.input_ids) == 1)
