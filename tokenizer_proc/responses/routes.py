"""The ``/v1/responses`` routes: `add_routes` installs them on the app."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from tokenizer_proc.errors import APIError
from tokenizer_proc.link.tokenizer_manager import TokenizerManager
from tokenizer_proc.request.builder import RequestBuilder
from tokenizer_proc.request.unsupported import RESPONSES
from tokenizer_proc.responses.models import ResponsesRequest
from tokenizer_proc.responses.serving import ResponsesServing
from tokenizer_proc.responses.store import ResponseStore
from tokenizer_proc.web.ignored_fields import note_ignored


def add_routes(
    app: FastAPI,
    manager: TokenizerManager,
    builder: RequestBuilder,
    served_name: str,
    keepalive_s: float,
    store: ResponseStore | None = None,
) -> None:
    """Install ``POST /v1/responses``, ``POST /v1/responses/input_tokens`` and ``GET`` /
    ``DELETE /v1/responses/{id}`` on `app` (``GET /v1/responses/{id}/input_items`` is a 400 saying it is
    not served; ``POST /v1/responses/{id}/cancel`` a 400 saying the response is not a background one;
    ``POST /v1/responses/compact`` a 400 saying compaction is not served)
    (keepalive_s: see `web.sse`; store: where ``store: true`` responses are kept)."""
    serving = ResponsesServing(manager, builder, served_name, keepalive_s, store or ResponseStore())
    store = serving.store

    @app.post("/v1/responses")
    async def create(body: ResponsesRequest, request: Request):
        """OpenAI's Responses API, non-streamed or streamed (``stream: true``)."""
        note_ignored(request, body.model_extra, RESPONSES)
        return await serving.create(request, body)

    @app.post("/v1/responses/input_tokens")
    async def input_tokens(body: ResponsesRequest) -> JSONResponse:
        """The prompt tokens a response to `body` would take (instructions, the earlier
        responses of previous_response_id, the input and the tools, rendered as for the model)."""
        built, _ = await serving.built_with_earlier(body)
        return JSONResponse({"object": "response.input_tokens", "input_tokens": len(built.reqs[0].input_ids)})

    @app.post("/v1/responses/compact")
    async def compact() -> JSONResponse:
        """Not served: a 400 saying so (the path was read as a response id, a 405 "it takes GET")."""
        raise APIError(
            "compacting a conversation (POST /v1/responses/compact) is not supported by this server: "
            "send the conversation whole, or continue it with previous_response_id",
            400,
        )

    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str, request: Request) -> JSONResponse:
        """A stored response (404 when not kept, see `store`). Its query: ``include`` (as
        create's) and ``include_obfuscation`` are accepted; ``stream`` true and
        ``starting_after`` (which replay a background response's events) are 400s."""
        serving.check_retrieve_query(request.query_params)
        return JSONResponse(store.get(response_id).body)

    @app.get("/v1/responses/{response_id}/input_items")
    async def input_items(response_id: str) -> JSONResponse:
        """Not served: a 400 saying so for a stored response (404 when not kept)."""
        store.get(response_id)
        raise APIError(
            "listing a response's input items is not supported by this server: it keeps the "
            "conversation for previous_response_id, not the input items",
            400,
        )

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel(response_id: str) -> JSONResponse:
        """Cancel a background response: none runs here (``background`` is refused), so a
        stored response is a 400, as OpenAI's API answers for one created without
        ``background: true`` (404 when not kept)."""
        store.get(response_id)
        raise APIError(
            f"response {response_id!r} cannot be cancelled: only responses created with background "
            "true can be, and this server does not run background responses",
            400,
        )

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str) -> JSONResponse:
        """Forget a stored response (404 when not kept)."""
        store.delete(response_id)
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})
