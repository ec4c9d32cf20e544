"""Turning validated HTTP bodies into `GenerateReq` messages, with the checks that need the
model: served name, context length, vocab size, supported features."""

from __future__ import annotations

import uuid
from typing import Any

from protocol.messages import DetokParams, GenerateReq, SamplingParams
from tokenizer_proc.api_models import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    NativeSamplingParams,
    SamplingFields,
)
from tokenizer_proc.errors import APIError
from tokenizer_proc.hf_tokenizer import ModelFacts

PROMPT_TAIL = 6
"""Prompt tokens sent to the detokenizer as context for the first token's leading space."""


def new_rid(prefix: str) -> str:
    """A fresh request id such as ``cmpl-3f2a...``."""
    return f"{prefix}-{uuid.uuid4().hex}"


class RequestBuilder:
    """Validates and tokenizes requests for one model.

    tokenizer: a transformers tokenizer with the chat template; facts: context length,
    EOS ids, vocab size; served_names: model names a request may ask for.
    """

    def __init__(self, tokenizer, facts: ModelFacts, served_names: set[str]) -> None:
        self.tok = tokenizer
        self.facts = facts
        self.served_names = served_names

    # ------------------------------------------------------------------ checks
    def check_model(self, name: str | None) -> None:
        """404 unless `name` is None or a served model name."""
        if name is not None and name not in self.served_names:
            raise APIError(f"The model `{name}` does not exist.", 404, "model", "model_not_found")

    def _check_unsupported(self, req: SamplingFields) -> None:
        for field, ok in (
            ("presence_penalty", not req.presence_penalty),
            ("frequency_penalty", not req.frequency_penalty),
            ("repetition_penalty", req.repetition_penalty in (None, 1.0)),
            ("response_format", req.response_format is None or req.response_format.get("type") == "text"),
        ):
            if not ok:
                raise APIError(f"{field} is not supported by this server yet", 400, field)

    def _check_ids(self, ids: list[int], param: str) -> None:
        bad = [t for t in ids if not 0 <= t < self.facts.vocab_size]
        if bad:
            raise APIError(f"{param}: token id {bad[0]} is out of range [0, {self.facts.vocab_size})", 400, param)

    def _logit_bias(self, bias: dict[str, float] | None) -> dict[int, float]:
        out = {}
        for key, value in (bias or {}).items():
            try:
                tok = int(key)
            except ValueError:
                raise APIError(f"logit_bias: key {key!r} is not a token id", 400, "logit_bias") from None
            self._check_ids([tok], "logit_bias")
            if not -100 <= value <= 100:
                raise APIError(f"logit_bias: value {value} for token {tok} is outside [-100, 100]", 400, "logit_bias")
            out[tok] = float(value)
        return out

    def _max_new_tokens(self, requested: int | None, prompt_len: int, param: str) -> int:
        room = self.facts.context_length - prompt_len
        if room <= 0:
            raise APIError(
                f"the prompt has {prompt_len} tokens, which leaves no room in the context length of "
                f"{self.facts.context_length} tokens", 400, "prompt" if param != "max_new_tokens" else "input_ids",
            )
        if requested is None:
            return room
        if requested < 0:
            raise APIError(f"{param} must be at least 0, got {requested}", 400, param)
        if requested > room:
            raise APIError(
                f"{param}={requested} plus the prompt's {prompt_len} tokens exceeds the context length of "
                f"{self.facts.context_length} tokens", 400, param,
            )
        return requested

    # ------------------------------------------------------------------ building
    def _build(self, rid: str, ids: list[int], max_new: int, p: SamplingFields | NativeSamplingParams,
               logit_bias: dict[int, float]) -> GenerateReq:
        stop = [p.stop] if isinstance(p.stop, str) else list(p.stop or [])
        stop_ids = list(p.stop_token_ids or [])
        self._check_ids(stop_ids, "stop_token_ids")
        temperature = 1.0 if p.temperature is None else p.temperature
        sampling = SamplingParams(
            temperature=temperature,
            top_p=1.0 if p.top_p is None else p.top_p,
            top_k=-1 if p.top_k in (None, 0) else p.top_k,
            seed=p.seed,
            logit_bias=logit_bias,
        )
        detok = DetokParams(
            stop=stop,
            include_stop_str_in_output=p.include_stop_str_in_output,
            skip_special_tokens=p.skip_special_tokens,
            spaces_between_special_tokens=p.spaces_between_special_tokens,
            prompt_tail_ids=ids[-PROMPT_TAIL:],
        )
        eos = [] if p.ignore_eos else list(self.facts.eos_token_ids)
        return GenerateReq(rid, ids, max_new, sampling, detok, eos, stop_ids)

    def _openai(self, rid: str, ids: list[int], req: SamplingFields) -> GenerateReq:
        self._check_unsupported(req)
        if not ids:
            raise APIError("the prompt is empty (it has no tokens)", 400, "prompt")
        requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        max_new = self._max_new_tokens(requested, len(ids), param)
        return self._build(rid, ids, max_new, req, self._logit_bias(req.logit_bias))

    def completion(self, req: CompletionRequest) -> GenerateReq:
        """Checks and tokenizes a completions request. Raises `APIError`."""
        self.check_model(req.model)
        for field, ok in (("logprobs", req.logprobs is None), ("echo", not req.echo),
                          ("suffix", req.suffix is None), ("best_of", req.best_of in (None, 1))):
            if not ok:
                raise APIError(f"{field} is not supported by this server yet", 400, field)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise APIError("only one prompt per request is supported", 400, "prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = self.tok.encode(prompt, add_special_tokens=False) if prompt else []
        else:
            ids = list(prompt)
            self._check_ids(ids, "prompt")
        return self._openai(new_rid("cmpl"), ids, req)

    def chat(self, req: ChatCompletionRequest) -> GenerateReq:
        """Renders the chat template, then checks and tokenizes. Raises `APIError`."""
        self.check_model(req.model)
        if req.logprobs or req.top_logprobs:
            raise APIError("logprobs is not supported by this server yet", 400, "logprobs")
        if req.tools:
            raise APIError("tools are not supported by this server yet", 400, "tools")
        if not req.messages:
            raise APIError("messages must contain at least one message", 400, "messages")
        messages = [self._message(i, m.role, m.content) for i, m in enumerate(req.messages)]
        try:
            text = self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=req.add_generation_prompt)
        except Exception as e:  # jinja raises TemplateError and friends for odd conversations
            raise APIError(f"the chat template rejected these messages: {e}", 400, "messages") from None
        ids = self.tok.encode(text, add_special_tokens=False)
        return self._openai(new_rid("chatcmpl"), ids, req)

    @staticmethod
    def _message(i: int, role: str, content: Any) -> dict[str, str]:
        if content is None or isinstance(content, str):
            return {"role": role, "content": content or ""}
        parts = []
        for part in content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(f"messages[{i}].content: only text parts are supported", 400, f"messages.{i}.content")
            parts.append(part["text"])
        return {"role": role, "content": "".join(parts)}

    def native(self, req: GenerateRequest) -> GenerateReq:
        """Checks and tokenizes a native ``/generate`` request. Raises `APIError`."""
        if (req.text is None) == (req.input_ids is None):
            raise APIError("give exactly one of text and input_ids", 400, "text")
        if req.input_ids is not None:
            ids = list(req.input_ids)
            self._check_ids(ids, "input_ids")
        else:
            ids = self.tok.encode(req.text, add_special_tokens=False) if req.text else []
        if not ids:
            raise APIError("the prompt is empty (it has no tokens)", 400, "text")
        p = req.sampling_params
        max_new = self._max_new_tokens(p.max_new_tokens if p.max_new_tokens is not None else 128, len(ids), "max_new_tokens")
        return self._build(req.rid or new_rid("gen"), ids, max_new, p, {})
