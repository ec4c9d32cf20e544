"""Serving SGLang's native ``POST /generate`` (`serve_generate`): one body, or a list of
bodies, one per choice, when ``sampling_params.n`` > 1 or the request is a batch (a list of
prompts: choice i of prompt p at index p * n + i; see `batch`). Streamed events carry their
choice's index."""

from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from tokenizer_proc.errors import APIError
from tokenizer_proc.link.tokenizer_manager import TokenizerManager
from tokenizer_proc.native.choice import NativeChoice
from tokenizer_proc.native.models import GenerateRequest
from tokenizer_proc.request.builder import Built, RequestBuilder
from tokenizer_proc.request.choices import claim, merged
from tokenizer_proc.request.route_run import collect, until_disconnect
from tokenizer_proc.web.sse import SseResponse, error_event, sse


async def serve_generate(
    request: Request,
    body: GenerateRequest,
    built: Built,
    manager: TokenizerManager,
    builder: RequestBuilder,
    keepalive_s: float,
) -> Response:
    """The response to `built` (from `body`): the choices' bodies (`NativeChoice`), whole or
    as an SSE stream ending in ``[DONE]`` (keepalive_s: see `web.sse`). Raises `APIError`
    when the request cannot start, before a stream's 200."""
    choices = [NativeChoice(req, builder.pieces, built.head(i), built.shown_rid(i)) for i, req in enumerate(built.reqs)]
    if not body.stream:
        for choice, ds in zip(
            choices, await until_disconnect(request, collect(manager, built, request.is_disconnected))
        ):
            for d in ds:
                choice.add(d)
        bodies = [c.body() for c in choices]
        return JSONResponse(bodies if len(bodies) > 1 or body.batch_size is not None else bodies[0])

    hold = await claim(manager, built.reqs, built.client_rids, request.is_disconnected)

    async def events() -> AsyncIterator[str]:
        try:
            async for i, d in merged(manager, built, hold):
                choices[i].add(d)
                yield sse(choices[i].body(i))
        except APIError as e:
            yield error_event(e)
        yield sse("[DONE]")

    return SseResponse(events(), keepalive_s, hold)
