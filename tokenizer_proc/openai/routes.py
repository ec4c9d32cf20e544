"""The OpenAI routes: ``POST /v1/chat/completions`` and ``POST /v1/completions`` (served by
`OpenAIServing`), the model cards and the stored chat completions; `add_routes` installs
them on the app."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request

from tokenizer_proc.link.tokenizer_manager import TokenizerManager
from tokenizer_proc.openai import chat_store, model_cards
from tokenizer_proc.openai.convert import build_chat, build_completion
from tokenizer_proc.openai.models import ChatCompletionRequest, CompletionRequest
from tokenizer_proc.openai.serving import OpenAIServing
from tokenizer_proc.request.builder import RequestBuilder
from tokenizer_proc.request.unsupported import CHAT, COMPLETION
from tokenizer_proc.web.ignored_fields import note_ignored


def add_routes(
    app: FastAPI,
    manager: TokenizerManager,
    builder: RequestBuilder,
    served_name: str,
    fingerprint: str,
    keepalive_s: float,
) -> None:
    """Install the OpenAI routes (see the module docstring and `OpenAIServing` for the
    arguments)."""
    serving = OpenAIServing(manager, served_name, fingerprint, keepalive_s)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        note_ignored(request, body.model_extra, CHAT)
        built = await asyncio.to_thread(build_chat, builder, body)  # tokenizing a long prompt must not stall the loop
        return await serving.serve(request, "chat", built, body.stream, body.stream_options)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        note_ignored(request, body.model_extra, COMPLETION)
        built = await asyncio.to_thread(build_completion, builder, body)
        return await serving.serve(request, "completion", built, body.stream, body.stream_options)

    chat_store.add_routes(app)
    model_cards.add_routes(app, builder, served_name)
