"""The ``/v1/messages`` routes: `add_routes` installs them on the app.

The ``anthropic-version`` and ``anthropic-beta`` headers are accepted and change nothing;
the API key comes as ``x-api-key`` (see `auth`).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from tokenizer_proc.anthropic.errors import AnthropicRoute, error_response
from tokenizer_proc.anthropic.models import CountTokensRequest, MessagesRequest
from tokenizer_proc.anthropic.serving import serve_messages
from tokenizer_proc.anthropic.translate import build
from tokenizer_proc.errors import add_error_shape
from tokenizer_proc.link.tokenizer_manager import TokenizerManager
from tokenizer_proc.request.builder import RequestBuilder


def add_routes(app: FastAPI, manager: TokenizerManager, builder: RequestBuilder, keepalive_s: float) -> None:
    """Install ``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` on `app`
    (keepalive_s: see `web.sse`); errors under ``/v1/messages``, and those of Anthropic's
    clients (``anthropic-version``) under ``/v1/models``, come in Anthropic's shape."""
    router = APIRouter(route_class=AnthropicRoute)
    add_error_shape(app, "/v1/messages", error_response)
    add_error_shape(app, "/v1/models", error_response, header="anthropic-version")

    @router.post("/v1/messages")
    async def messages(body: MessagesRequest, request: Request):
        """Anthropic's Messages API, non-streamed or streamed (``stream: true``)."""
        built = await asyncio.to_thread(build, builder, body)
        return await serve_messages(request, body, built, manager, keepalive_s)

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(body: CountTokensRequest) -> JSONResponse:
        """The prompt's token count as the model would see it (chat template applied)."""
        built = await asyncio.to_thread(build, builder, body)
        return JSONResponse({"input_tokens": len(built.reqs[0].input_ids)})

    app.include_router(router)
