"""The FastAPI app: OpenAI-compatible routes, native ``/generate``, health and models."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from protocol.config import ServerArgs
from protocol.enums import FinishReason, ReplicaState
from tokenizer_proc.anthropic.routes import add_routes as add_anthropic_routes
from tokenizer_proc.api_models import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
    StreamOptions,
    bound_token_ids,
)
from tokenizer_proc.auth import require_api_key
from tokenizer_proc.cors import allow_origins
from tokenizer_proc.chat_output import ChatOutput
from tokenizer_proc.cache_routes import FLUSH_PATH
from tokenizer_proc.cache_routes import add_routes as add_cache_routes
from tokenizer_proc.chat_store import add_routes as add_chat_store_routes
from tokenizer_proc.choices import Totals, check_can_start, claim, merged
from tokenizer_proc.errors import APIError, error_response, install_handlers
from tokenizer_proc.json_body import JsonBodyRoute
from tokenizer_proc.keepalive import SseResponse
from tokenizer_proc.limits import limit_body_size, refuse_encoded_bodies
from tokenizer_proc.request_id import add_request_ids
from tokenizer_proc.info_routes import add_routes as add_info_routes
from tokenizer_proc.model_routes import add_routes as add_model_routes
from tokenizer_proc.native_response import NativeChoice
from tokenizer_proc.request_builder import Built, RequestBuilder
from tokenizer_proc.responses import ChoiceView, Piece, ResponseShape, sse, system_fingerprint, usage
from tokenizer_proc.responses_api.routes import add_routes as add_responses_routes
from tokenizer_proc.route_methods import add_head_routes, add_routes_per_method
from tokenizer_proc.route_run import collect, until_disconnect
from tokenizer_proc.tokenizer_manager import TokenizerManager
from tokenizer_proc.utility_routes import add_routes as add_utility_routes


def _error_event(e: APIError) -> str:
    return sse({"error": e.body()})


def create_app(manager: TokenizerManager, builder: RequestBuilder, served_name: str, *, api_key: str = "",
               max_body_bytes: int | None = None, keepalive_s: float = 0.0, log_requests: bool = False,
               settings: tuple = (), server_args: ServerArgs | None = None,
               allowed_origins: tuple[str, ...] = ()) -> FastAPI:
    """Build the app. manager: the link to the other processes; builder: request checks;
    api_key: the key every route but /health and /ping requires ("" for none, see `auth`);
    max_body_bytes: larger request bodies are a 413 (see `limits`; None for no limit);
    keepalive_s: seconds without an event after which a stream gets an SSE comment (see
    `keepalive`; 0 for none); log_requests: log messages that may quote a request (see
    `errors.install_handlers`); settings: the server settings that change the answers, which
    with the version, the served name and the model's facts make the ``system_fingerprint``
    of chat and completions responses (see `responses.system_fingerprint`); server_args: the
    server's settings, for ``/get_model_info`` and ``/get_server_info`` (`info_routes`);
    allowed_origins: the origins browsers may call from (`cors`; ``*``: any, none: no CORS)."""
    # no 307 from /v1/completions/ to /v1/completions (Starlette's default, with a Location built
    # from the client's Host header): a path no route serves is a 404 that names it
    app = FastAPI(title="lazyserve", version="0.1.0", redirect_slashes=False)
    app.router.route_class = JsonBodyRoute  # every route's large JSON body is read off the event loop
    fingerprint = system_fingerprint(app.version, served_name, builder.facts, *settings)
    schema = app.openapi
    app.openapi = lambda: bound_token_ids(schema(), builder.facts.vocab_size)  # type: ignore[method-assign]
    install_handlers(app, log_requests)
    refuse_encoded_bodies(app)
    if max_body_bytes is not None:
        limit_body_size(app, max_body_bytes)
    if api_key:  # added last, so checked first: a request without the key is not read
        require_api_key(app, api_key)
    allow_origins(app, list(allowed_origins))  # added after the key: a preflight carries none
    add_request_ids(app)  # wraps everything: the early answers above and a 500 carry an id too

    async def health() -> JSONResponse:
        """200 when every process serves; else a 503 saying why: shutting down, not ready yet,
        the scheduler's loop not answering its health probe (`SchedulerProbe`; this waits for
        the answer, up to --stall-timeout), the worker restarting or silent, no detokenizer
        replica live."""
        if manager.stopping:
            return error_response("server is shutting down", 503)
        if not manager.ready:
            return error_response("server is not ready", 503)
        stalled = await manager.probe.stalled()
        if stalled:
            return error_response(stalled, 503)
        if manager.worker_down:
            return error_response(f"recovering: {manager.worker_down}; requests wait until it is back", 503)
        st = manager.detok_status
        if st is not None and ReplicaState.LIVE not in st.states:
            return error_response("no detokenizer replica is live: requests wait, then fail; attach one with "
                                  "python -m detokenizer_proc --attach RUN_DIR", 503)
        return JSONResponse({"status": "ok"})

    app.get("/health")(health)
    add_routes_per_method(app, "/ping", health, ("GET", "POST"))  # vLLM's (and SageMaker's) name for /health
    add_info_routes(app, builder, app.version, server_args, lambda: manager.resolved)
    add_cache_routes(app, manager)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(manager.metrics.text(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/internal/detokenizers")
    async def detokenizers() -> JSONResponse:
        """The detokenizer replicas as the scheduler last reported them (about every 0.5 s)."""
        st = manager.detok_status
        if st is None:
            return error_response("the scheduler has not reported its detokenizer replicas yet", 503)
        replicas = [{"index": i, "pid": pid, "state": state.api_str, "attached": att, "load": load, "routed": routed,
                     "reseeded": reseeded}
                    for i, pid, state, att, load, routed, reseeded
                    in zip(st.indexes, st.pids, st.states, st.attached, st.loads, st.routed, st.reseeded)]
        return JSONResponse({"replicas": replicas, "waiting": st.waiting, "failed": st.failed, "lost": st.lost})

    async def openai_route(request: Request, kind: str, built: Built, stream: bool, options: StreamOptions | None):
        include_usage = bool(options and options.include_usage)
        continuous = include_usage and options.continuous_usage_stats
        shape = ResponseShape(kind, built.rid, served_name, fingerprint)
        wants = built.reqs[0].sampling.wants_logprobs
        views = [ChoiceView(kind, wants, built.echo(i), built.head(i)) for i in range(len(built.reqs))]
        outs = [ChatOutput(built.output) for _ in built.reqs] if built.output is not None else None
        totals = Totals(built.prompt_tokens, frozenset(built.leaders))
        if not stream:
            deltas = await until_disconnect(request, collect(manager, built))
            choices = []
            for i, (view, ds) in enumerate(zip(views, deltas)):
                pieces: list[Piece] = [view.step(d) for d in ds]
                totals.add(i, ds[-1])
                reason, message = ds[-1].finish_reason, None
                if outs is not None:  # chat: the same reader as the stream's, fed the same text
                    for d in ds:
                        outs[i].step(d.text, d.finish_reason is not None, d.finish_reason == FinishReason.LENGTH)
                    reason, message = outs[i].finish_reason(reason), outs[i].message()
                choices.append(shape.choice(i, "".join(p.text for p in pieces), reason,
                                            ds[-1].matched_stop, view.join(pieces), message))
            return JSONResponse(shape.full(choices, totals.prompt_tokens, totals.completion_tokens,
                                           totals.cached_tokens))

        hold = check_can_start(manager, built.reqs)  # a 4xx/503 status, before the stream's 200

        def event(body: dict, i: int, role: bool = False) -> str:
            """`body`, a chunk of choice `i`, as an SSE event; when continuous usage is asked
            for, with that choice's usage so far, as vLLM counts it: its prompt's tokens (and
            cached tokens) and its own completion tokens (0 in its `role` chunk; the final
            usage chunk sums them);
            else, with include_usage, with a null usage, as OpenAI sends every chunk but the
            usage chunk."""
            if continuous:
                body["usage"] = usage(len(built.reqs[i].input_ids), 0 if role else totals.completion.get(i, 0),
                                      totals.cached.get(built.leader(i), 0))
            elif include_usage:
                body["usage"] = None
            return sse(body)

        async def events() -> AsyncIterator[str]:
            try:
                # each choice's role chunk; with continuous usage, just before its first delta, whose
                # cached tokens its usage reports (it read 0, and the chunks after it the hit)
                unsent_roles = set(range(len(built.reqs))) if kind == "chat" else set()
                if not continuous:
                    for i in sorted(unsent_roles):
                        yield event(shape.chunk(i, "", role=True), i, role=True)
                    unsent_roles.clear()
                async for i, d in merged(manager, built, hold):
                    totals.add(i, d)
                    if i in unsent_roles:
                        unsent_roles.discard(i)
                        yield event(shape.chunk(i, "", role=True), i, role=True)
                    piece, reason = views[i].step(d), d.finish_reason
                    if outs is not None:
                        shown = outs[i].step(d.text, reason is not None, reason == FinishReason.LENGTH)
                        if shown or piece.entries:
                            yield event(shape.chunk(i, None, logprobs=piece.logprobs,
                                                    delta=shown.delta() or {"content": ""}), i)
                        reason = outs[i].finish_reason(reason)
                    elif piece.text or piece.entries:
                        yield event(shape.chunk(i, piece.text, logprobs=piece.logprobs), i)
                    if reason is not None:
                        yield event(shape.chunk(i, None if kind == "chat" else "", reason, d.matched_stop), i)
                if include_usage:
                    yield sse(shape.usage_chunk(totals.prompt_tokens, totals.completion_tokens, totals.cached_tokens))
            except APIError as e:
                yield _error_event(e)
            yield sse("[DONE]")

        return SseResponse(events(), keepalive_s, hold)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        built = await asyncio.to_thread(builder.chat, body)  # tokenizing a long prompt must not stall the loop
        return await openai_route(request, "chat", built, body.stream, body.stream_options)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        built = await asyncio.to_thread(builder.completion, body)
        return await openai_route(request, "completion", built, body.stream, body.stream_options)

    @app.post("/generate")
    async def generate(body: GenerateRequest, request: Request):
        """SGLang's native route: one body, or a list of bodies, one per choice, when
        sampling_params.n > 1 or the request is a batch (a list of prompts: choice i of prompt
        p at index p * n + i; see `native_batch`). Streamed events carry their choice's index."""
        built = await asyncio.to_thread(builder.native, body)
        choices = [NativeChoice(req, builder.pieces, built.head(i), built.shown_rid(i))
                   for i, req in enumerate(built.reqs)]
        if not body.stream:
            for choice, ds in zip(choices, await until_disconnect(request, collect(manager, built, request.is_disconnected))):
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
                yield _error_event(e)
            yield sse("[DONE]")

        return SseResponse(events(), keepalive_s, hold)

    add_chat_store_routes(app)
    add_anthropic_routes(app, manager, builder, keepalive_s)
    add_responses_routes(app, manager, builder, served_name, keepalive_s)
    add_utility_routes(app, builder)
    add_model_routes(app, builder, served_name)
    add_head_routes(app, unsafe=(FLUSH_PATH,))
    return app
