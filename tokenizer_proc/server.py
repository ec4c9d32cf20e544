"""The FastAPI app: OpenAI-compatible routes, native ``/generate``, health and models."""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Awaitable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from protocol.enums import ReplicaState
from protocol.messages import GenerateReq
from tokenizer_proc.api_models import (
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
)
from tokenizer_proc.errors import APIError, error_response, install_handlers
from tokenizer_proc.metrics import metrics_text
from tokenizer_proc.request_builder import RequestBuilder
from tokenizer_proc.responses import ResponseShape, sse
from tokenizer_proc.tokenizer_manager import Delta, TokenizerManager

DISCONNECT_POLL_S = 0.5


async def _until_disconnect(request: Request, work: Awaitable) -> object:
    """Await `work`; cancel it (which aborts the request) if the client goes away first."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                raise APIError("client disconnected", 499)
    finally:
        if not task.done():
            task.cancel()


async def _collect(manager: TokenizerManager, req: GenerateReq) -> tuple[str, Delta]:
    parts, last = [], None
    async for d in manager.generate(req):
        parts.append(d.text)
        last = d
    return "".join(parts), last


def create_app(manager: TokenizerManager, builder: RequestBuilder, served_name: str) -> FastAPI:
    """Build the app. manager: the link to the other processes; builder: request checks."""
    app = FastAPI(title="lazyserve", version="0.1.0")
    install_handlers(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        if not manager.ready or manager.stopping:
            return error_response("server is not ready", 503, type_="unavailable")
        st = manager.detok_status
        if st is not None and ReplicaState.LIVE not in st.states:
            return error_response("no detokenizer replica is live: requests wait, then fail; attach one with "
                                  "python -m detokenizer_proc --attach RUN_DIR", 503, type_="unavailable")
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(metrics_text(lambda: manager.stats), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/internal/detokenizers")
    async def detokenizers() -> JSONResponse:
        """The detokenizer replicas as the scheduler last reported them (about every 0.5 s)."""
        st = manager.detok_status
        if st is None:
            return error_response("the scheduler has not reported its detokenizer replicas yet", 503, type_="unavailable")
        replicas = [{"index": i, "pid": pid, "state": state.api_str, "attached": att, "load": load, "routed": routed,
                     "reseeded": reseeded}
                    for i, pid, state, att, load, routed, reseeded
                    in zip(st.indexes, st.pids, st.states, st.attached, st.loads, st.routed, st.reseeded)]
        return JSONResponse({"replicas": replicas, "waiting": st.waiting, "failed": st.failed, "lost": st.lost})

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        card = {"id": served_name, "object": "model", "created": int(time.time()), "owned_by": "lazyserve",
                "max_model_len": builder.facts.context_length}
        return JSONResponse({"object": "list", "data": [card]})

    async def openai_route(request: Request, kind: str, gen: GenerateReq, stream: bool, include_usage: bool):
        shape = ResponseShape(kind, gen.rid, served_name)
        prompt_tokens = len(gen.input_ids)
        if not stream:
            text, last = await _until_disconnect(request, _collect(manager, gen))
            return JSONResponse(shape.full(text, last.finish_reason, last.matched_stop, prompt_tokens,
                                           last.completion_tokens, last.cached_tokens))

        manager.check_can_start(gen.rid)  # a 4xx/503 status, before the stream's 200

        async def events() -> AsyncIterator[str]:
            completion_tokens = cached_tokens = 0
            try:
                if kind == "chat":
                    yield sse(shape.chunk("", role=True))
                async for d in manager.generate(gen):
                    completion_tokens, cached_tokens = d.completion_tokens, d.cached_tokens
                    if d.text:
                        yield sse(shape.chunk(d.text))
                    if d.finish_reason is not None:
                        yield sse(shape.chunk(None if kind == "chat" else "", d.finish_reason, d.matched_stop))
                if include_usage:
                    yield sse(shape.usage_chunk(prompt_tokens, completion_tokens, cached_tokens))
            except APIError as e:
                yield sse({"error": {"message": e.message, "type": e.type, "param": e.param, "code": e.status}})
            yield sse("[DONE]")

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        gen = await asyncio.to_thread(builder.chat, body)  # tokenizing a long prompt must not stall the loop
        include = bool(body.stream_options and body.stream_options.include_usage)
        return await openai_route(request, "chat", gen, body.stream, include)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        gen = await asyncio.to_thread(builder.completion, body)
        include = bool(body.stream_options and body.stream_options.include_usage)
        return await openai_route(request, "completion", gen, body.stream, include)

    @app.post("/generate")
    async def generate(body: GenerateRequest, request: Request):
        gen = await asyncio.to_thread(builder.native, body)

        def meta(d: Delta) -> dict:
            reason = None if d.finish_reason is None else {"type": d.finish_reason.api_str, "matched": d.matched_stop}
            return {"id": gen.rid, "finish_reason": reason, "prompt_tokens": len(gen.input_ids),
                    "completion_tokens": d.completion_tokens, "cached_tokens": d.cached_tokens}

        if not body.stream:
            text, last = await _until_disconnect(request, _collect(manager, gen))
            return JSONResponse({"text": text, "meta_info": meta(last)})

        manager.check_can_start(gen.rid)

        async def events() -> AsyncIterator[str]:
            text = ""
            try:
                async for d in manager.generate(gen):
                    text += d.text
                    yield sse({"text": text, "meta_info": meta(d)})
            except APIError as e:
                yield sse({"error": {"message": e.message, "type": e.type, "param": e.param, "code": e.status}})
            yield sse("[DONE]")

        return StreamingResponse(events(), media_type="text/event-stream")

    return app
