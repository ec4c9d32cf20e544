"""The native and server routes: ``POST /generate``, health and ``/ping``, ``/metrics``, the
detokenizer replicas, server information, cache flush, tokenize and detokenize;
`add_routes` installs them on the app."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from protocol.config import ServerArgs
from tokenizer_proc.link.tokenizer_manager import TokenizerManager
from tokenizer_proc.native import cache_routes, health, info_routes, utility_routes
from tokenizer_proc.native.convert import REFUSED, build_native
from tokenizer_proc.native.models import GenerateRequest
from tokenizer_proc.native.serving import serve_generate
from tokenizer_proc.request.builder import RequestBuilder
from tokenizer_proc.web.ignored_fields import note_ignored
from tokenizer_proc.web.route_methods import add_routes_per_method


def add_routes(
    app: FastAPI, manager: TokenizerManager, builder: RequestBuilder, keepalive_s: float, server_args: ServerArgs | None
) -> None:
    """Install the native routes; keepalive_s: see `web.sse`; server_args: the server's
    settings, for ``/get_model_info`` and ``/get_server_info`` (`info_routes`)."""

    async def health_route() -> JSONResponse:
        return await health.health(manager)

    health_route.__doc__ = health.health.__doc__
    app.get("/health")(health_route)
    add_routes_per_method(app, "/ping", health_route, ("GET", "POST"))
    info_routes.add_routes(app, builder, app.version, server_args, lambda: manager.resolved)
    cache_routes.add_routes(app, manager)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(manager.metrics.text(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/internal/detokenizers")
    async def detokenizers() -> JSONResponse:
        """The detokenizer replicas as the scheduler last reported them (about every 0.5 s)."""
        return health.detokenizer_replicas(manager)

    @app.post("/generate")
    async def generate(body: GenerateRequest, request: Request):
        """SGLang's native route (see `native.serving`)."""
        note_ignored(request, body.model_extra, REFUSED)
        built = await asyncio.to_thread(build_native, builder, body)
        return await serve_generate(request, body, built, manager, builder, keepalive_s)

    utility_routes.add_routes(app, builder)
