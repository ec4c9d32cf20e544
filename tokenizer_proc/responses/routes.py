"""The ``/v1/responses`` routes: `add_routes` installs them on the app."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import get_args

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from protocol.enums import FinishReason
from tokenizer_proc.errors import APIError
from tokenizer_proc.link.tokenizer_manager import TokenizerManager
from tokenizer_proc.output.blocks import ChoiceBlocks
from tokenizer_proc.request.builder import Built, RequestBuilder
from tokenizer_proc.request.choices import check_can_start, merged
from tokenizer_proc.request.route_run import Outcome, run_one
from tokenizer_proc.responses.models import Includable, ResponsesRequest
from tokenizer_proc.responses.render import ResponseEvents, ResponseView
from tokenizer_proc.responses.store import ResponseStore
from tokenizer_proc.responses.translate import assistant_message, build, conversation
from tokenizer_proc.web.sse import SseResponse


def add_routes(app: FastAPI, manager: TokenizerManager, builder: RequestBuilder, served_name: str,
               keepalive_s: float, store: ResponseStore | None = None) -> None:
    """Install ``POST /v1/responses``, ``POST /v1/responses/input_tokens`` and ``GET`` /
    ``DELETE /v1/responses/{id}`` on `app` (``GET /v1/responses/{id}/input_items`` is a 400 saying it is
    not served; ``POST /v1/responses/{id}/cancel`` a 400 saying the response is not a background one;
    ``POST /v1/responses/compact`` a 400 saying compaction is not served)
    (keepalive_s: see `web.sse`; store: where ``store: true`` responses are kept)."""
    store = store or ResponseStore()

    async def built_with_earlier(body: ResponsesRequest) -> tuple[Built, list[dict]]:
        """`body` built (off the event loop) after the conversation of its
        previous_response_id (404 when not kept); returns (built, that conversation)."""
        earlier = store.get(body.previous_response_id, "previous_response_id").messages \
            if body.previous_response_id else []
        return await asyncio.to_thread(build, builder, body, earlier), earlier

    def keep(view: ResponseView, req: ResponsesRequest, earlier: list[dict], body: dict, o: Outcome) -> None:
        if req.store:
            store.put(view.id, body, earlier + conversation(req, earlier) + [assistant_message(o)])

    @app.post("/v1/responses")
    async def create(body: ResponsesRequest, request: Request):
        """OpenAI's Responses API, non-streamed or streamed (``stream: true``)."""
        built, earlier = await built_with_earlier(body)
        view = ResponseView(built.rid, body, body.model or served_name)
        if not body.stream:
            outcome = await run_one(request, manager, built)
            full = view.final(outcome)
            keep(view, body, earlier, full, outcome)
            return JSONResponse(full)
        hold = check_can_start(manager, built.reqs)  # a 4xx/503 status, before the stream's 200
        events = ResponseEvents(view)

        async def stream() -> AsyncIterator[str]:
            created, in_progress = events.start()
            if body.store:
                store.begin(view.id, in_progress)
            yield created
            reader = ChoiceBlocks(built.output)
            unfinished = "its client left the stream before it completed"
            try:
                async for _, d in merged(manager, built, hold):
                    final = "incomplete" if d.finish_reason == FinishReason.LENGTH else "completed"
                    if shown := events.steps(reader.step(d), final):
                        yield shown
                    if d.finish_reason is not None:
                        outcome = Outcome.of(built, d, reader)
                        closing, full = events.finish(outcome)
                        keep(view, body, earlier, full, outcome)
                        yield closing
            except APIError as e:
                unfinished = f"it failed ({e.message})"
                yield events.fail(e)
            finally:
                store.end(view.id, unfinished)

        return SseResponse(stream(), keepalive_s, hold)

    @app.post("/v1/responses/input_tokens")
    async def input_tokens(body: ResponsesRequest) -> JSONResponse:
        """The prompt tokens a response to `body` would take (instructions, the earlier
        responses of previous_response_id, the input and the tools, rendered as for the model)."""
        built, _ = await built_with_earlier(body)
        return JSONResponse({"object": "response.input_tokens", "input_tokens": len(built.reqs[0].input_ids)})

    @app.post("/v1/responses/compact")
    async def compact() -> JSONResponse:
        """Not served: a 400 saying so (the path was read as a response id, a 405 "it takes GET")."""
        raise APIError("compacting a conversation (POST /v1/responses/compact) is not supported by this server: "
                       "send the conversation whole, or continue it with previous_response_id", 400)

    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str, request: Request) -> JSONResponse:
        """A stored response (404 when not kept, see `store`). Its query: ``include`` (as
        create's) and ``include_obfuscation`` are accepted; ``stream`` true and
        ``starting_after`` (which replay a background response's events) are 400s."""
        query = request.query_params
        if query.get("stream", "false") != "false" or "starting_after" in query:
            param = "starting_after" if "starting_after" in query else "stream"
            raise APIError(f"{param}: streaming a stored response is not supported by this server: it replays the "
                           "events of a background response, and none runs here (background is refused); "
                           "retrieve the response without it", 400, param)
        for i, asked in enumerate(query.getlist("include[]") + query.getlist("include")):
            if asked not in get_args(Includable):
                raise APIError(f"include.{i}: {asked!r} is not supported by this server (it takes "
                               f"{', '.join(map(repr, get_args(Includable)))})", 400, f"include.{i}")
        return JSONResponse(store.get(response_id).body)

    @app.get("/v1/responses/{response_id}/input_items")
    async def input_items(response_id: str) -> JSONResponse:
        """Not served: a 400 saying so for a stored response (404 when not kept)."""
        store.get(response_id)
        raise APIError("listing a response's input items is not supported by this server: it keeps the "
                       "conversation for previous_response_id, not the input items", 400)

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel(response_id: str) -> JSONResponse:
        """Cancel a background response: none runs here (``background`` is refused), so a
        stored response is a 400, as OpenAI's API answers for one created without
        ``background: true`` (404 when not kept)."""
        store.get(response_id)
        raise APIError(f"response {response_id!r} cannot be cancelled: only responses created with background "
                       "true can be, and this server does not run background responses",
                       400)

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str) -> JSONResponse:
        """Forget a stored response (404 when not kept)."""
        store.delete(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})
