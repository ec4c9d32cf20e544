"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's and SGLang's utility routes).

/tokenize takes ``prompt`` (text, tokenized as completions tokenize it: without added
special tokens unless ``add_special_tokens``) or ``messages`` (rendered by the chat
template as ``/v1/chat/completions`` renders them, with vLLM's chat fields that change the
prompt: ``add_generation_prompt``, ``continue_final_message``, ``chat_template_kwargs``,
``tools``) and
answers ``{"tokens", "count", "max_model_len"}`` (plus ``token_strs`` when
``return_token_strs``). /detokenize takes ``tokens`` and answers the text as ``prompt``
(vLLM's name) and ``text`` (SGLang's). Unknown keys are a 400 naming the key.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import ConfigDict, Field, StrictBool, StrictInt, StrictStr

from tokenizer_proc.errors import APIError
from tokenizer_proc.openai.convert import build_chat
from tokenizer_proc.openai.models import ChatCompletionRequest, ChatMessage
from tokenizer_proc.request.builder import RequestBuilder
from tokenizer_proc.request.fields import Body
from tokenizer_proc.tools.models import ToolDef

CHAT_FIELDS = ("messages", "add_generation_prompt", "continue_final_message", "chat_template_kwargs", "tools")
"""The `TokenizeRequest` fields that the chat request it renders takes, as sent."""


class TokenizeRequest(Body):
    """Exactly one of prompt and messages."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ToolDef] | None = None
    add_special_tokens: StrictBool = False
    return_token_strs: StrictBool = False


class DetokenizeRequest(Body):
    """tokens: ids in the model's vocabulary."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr | None = None
    tokens: list[Annotated[StrictInt, Field(ge=0)]]
    skip_special_tokens: StrictBool = False


def add_routes(app: FastAPI, builder: RequestBuilder) -> None:
    """Install ``POST /tokenize`` and ``POST /detokenize`` on `app`."""
    tok = builder.tok

    def tokenize_answer(req: TokenizeRequest) -> dict:
        builder.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise APIError("give exactly one of prompt and messages", 400, "prompt")
        if req.prompt is not None:
            ids = tok.encode(req.prompt, add_special_tokens=req.add_special_tokens)
        else:
            chat = ChatCompletionRequest(
                **{k: getattr(req, k) for k in CHAT_FIELDS if k in req.model_fields_set}, max_tokens=0
            )
            ids = list(build_chat(builder, chat).reqs[0].input_ids)
        out = {"tokens": ids, "count": len(ids), "max_model_len": builder.facts.context_length}
        if req.return_token_strs:
            out["token_strs"] = tok.convert_ids_to_tokens(ids)
        return out

    def detokenize_text(req: DetokenizeRequest) -> str:
        builder.check_model(req.model)
        bad = [t for t in req.tokens if t >= builder.facts.vocab_size]
        if bad:
            raise APIError(f"tokens: token id {bad[0]} is out of range [0, {builder.facts.vocab_size})", 400, "tokens")
        return tok.decode(req.tokens, skip_special_tokens=req.skip_special_tokens)

    # both run in a thread: tokenizing or decoding a long list must not stall the streams the loop serves
    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> JSONResponse:
        """Token ids of a prompt or of chat messages, their count and the context length."""
        return JSONResponse(await asyncio.to_thread(tokenize_answer, body))

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> JSONResponse:
        """The text of token ids."""
        text = await asyncio.to_thread(detokenize_text, body)
        return JSONResponse({"prompt": text, "text": text})
