"""The ``/v1/messages`` routes: `add_routes` installs them on the app.

The ``anthropic-version`` and ``anthropic-beta`` headers are accepted and change nothing;
the API key comes as ``x-api-key`` (see `auth`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse

from tokenizer_proc.anthropic import render
from tokenizer_proc.anthropic.errors import AnthropicRoute, error_body, error_response
from tokenizer_proc.anthropic.models import CountTokensRequest, MessagesRequest
from tokenizer_proc.anthropic.translate import build
from tokenizer_proc.errors import APIError, add_error_shape
from tokenizer_proc.link.tokenizer_manager import TokenizerManager
from tokenizer_proc.output.blocks import ChoiceBlocks
from tokenizer_proc.request.builder import RequestBuilder
from tokenizer_proc.request.choices import check_can_start, merged
from tokenizer_proc.request.route_run import Outcome, run_one
from tokenizer_proc.web.sse import SseResponse


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
        omit = body.thinking is not None and body.thinking.display == "omitted"  # redacted, as Anthropic's API
        if not body.stream:
            outcome = await run_one(request, manager, built)
            return JSONResponse(render.message(built.rid, body.model, outcome, omit_thinking=omit))
        hold = check_can_start(manager, built.reqs)  # a 4xx/503 status, before the stream's 200
        events = render.MessageEvents(built.rid, body.model, omit_thinking=omit)

        async def stream() -> AsyncIterator[str]:
            reader = ChoiceBlocks(built.output)
            started = False
            try:
                async for _, d in merged(manager, built, hold):
                    if not started:  # the first delta knows the prefix cache's share of the prompt
                        started = True
                        yield events.start(len(built.reqs[0].input_ids), d.cached_tokens)
                    if shown := events.steps(reader.step(d)):
                        yield shown
                    if d.finish_reason is not None:
                        yield events.finish(Outcome.of(built, d, reader))
            except APIError as e:
                yield render.event("error", error_body(e))

        return SseResponse(stream(), keepalive_s, hold)

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(body: CountTokensRequest) -> JSONResponse:
        """The prompt's token count as the model would see it (chat template applied)."""
        built = await asyncio.to_thread(build, builder, body)
        return JSONResponse({"input_tokens": len(built.reqs[0].input_ids)})

    app.include_router(router)
