"""Serving ``POST /v1/messages`` (`serve_messages`): a built request (the body translated to
the chat path, `translate.build`) run to Anthropic's whole message or to its stream of events."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from tokenizer_proc.anthropic import render
from tokenizer_proc.anthropic.errors import error_body
from tokenizer_proc.anthropic.models import MessagesRequest
from tokenizer_proc.errors import APIError
from tokenizer_proc.link.tokenizer_manager import TokenizerManager
from tokenizer_proc.output.blocks import ChoiceBlocks
from tokenizer_proc.request.builder import Built
from tokenizer_proc.request.choices import check_can_start, merged
from tokenizer_proc.request.route_run import Outcome, run_one
from tokenizer_proc.web.sse import SseResponse


async def serve_messages(
    request: Request, body: MessagesRequest, built: Built, manager: TokenizerManager, keepalive_s: float
) -> Response:
    """The response to `built` (from `body`): the whole message, or with ``stream: true`` its
    events (keepalive_s: see `web.sse`); thinking shown redacted when ``thinking.display`` is
    "omitted", as Anthropic's API does. Raises `APIError` when the request cannot start,
    before a stream's 200."""
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
