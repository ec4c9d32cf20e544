"""Serving ``POST /v1/responses`` (`ResponsesServing`): a body built on the chat path after the
conversation of its ``previous_response_id``, run to a whole Response or to its stream of
events, and kept in the `ResponseStore` when ``store`` is true."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import get_args

from fastapi import Request
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import QueryParams

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


class ResponsesServing:
    """Runs Responses requests. manager: the link to the other processes; builder: request
    checks; served_name: the model a response names when its request names none;
    keepalive_s: see `web.sse`; store: where ``store: true`` responses are kept."""

    def __init__(
        self,
        manager: TokenizerManager,
        builder: RequestBuilder,
        served_name: str,
        keepalive_s: float,
        store: ResponseStore,
    ) -> None:
        self.manager, self.builder, self.served_name = manager, builder, served_name
        self.keepalive_s, self.store = keepalive_s, store

    async def built_with_earlier(self, body: ResponsesRequest) -> tuple[Built, list[dict]]:
        """`body` built (off the event loop) after the conversation of its
        previous_response_id (a 400 when not kept, an empty id too); returns (built, that
        conversation)."""
        earlier = (
            self.store.get(body.previous_response_id, "previous_response_id").messages
            if body.previous_response_id is not None
            else []
        )
        return await asyncio.to_thread(build, self.builder, body, earlier), earlier

    def _keep(self, view: ResponseView, req: ResponsesRequest, earlier: list[dict], body: dict, o: Outcome) -> None:
        """Store the finished response `body` with its conversation, when `req` asks for it."""
        if req.store:
            self.store.put(view.id, body, earlier + conversation(req, earlier) + [assistant_message(o)])

    async def create(self, request: Request, body: ResponsesRequest) -> Response:
        """The response to `body`: a whole Response, or with ``stream: true`` its events.
        Raises `APIError` when it cannot start, before a stream's 200."""
        built, earlier = await self.built_with_earlier(body)
        view = ResponseView(built.rid, body, body.model or self.served_name)
        if not body.stream:
            outcome = await run_one(request, self.manager, built)
            full = view.final(outcome)
            self._keep(view, body, earlier, full, outcome)
            return JSONResponse(full)
        hold = check_can_start(self.manager, built.reqs)  # a 4xx/503 status, before the stream's 200
        events = ResponseEvents(view)

        async def stream() -> AsyncIterator[str]:
            created, in_progress = events.start()
            if body.store:
                self.store.begin(view.id, in_progress)
            yield created
            reader = ChoiceBlocks(built.output)
            unfinished = "its client left the stream before it completed"
            try:
                async for _, d in merged(self.manager, built, hold):
                    final = "incomplete" if d.finish_reason == FinishReason.LENGTH else "completed"
                    if shown := events.steps(reader.step(d), final):
                        yield shown
                    if d.finish_reason is not None:
                        outcome = Outcome.of(built, d, reader)
                        closing, full = events.finish(outcome)
                        self._keep(view, body, earlier, full, outcome)
                        yield closing
            except APIError as e:
                unfinished = f"it failed ({e.message})"
                yield events.fail(e)
            finally:
                self.store.end(view.id, unfinished)

        return SseResponse(stream(), self.keepalive_s, hold)

    @staticmethod
    def check_retrieve_query(query: QueryParams) -> None:
        """The query of ``GET /v1/responses/{id}``: ``include`` (as create's) and
        ``include_obfuscation`` are accepted; ``stream`` true and ``starting_after`` (which
        replay a background response's events) are 400s, as an include not served is."""
        if query.get("stream", "false") != "false" or "starting_after" in query:
            param = "starting_after" if "starting_after" in query else "stream"
            raise APIError(
                f"{param}: streaming a stored response is not supported by this server: it replays the "
                "events of a background response, and none runs here (background is refused); "
                "retrieve the response without it",
                400,
                param,
            )
        for i, asked in enumerate(query.getlist("include[]") + query.getlist("include")):
            if asked not in get_args(Includable):
                raise APIError(
                    f"include.{i}: {asked!r} is not supported by this server (it takes "
                    f"{', '.join(map(repr, get_args(Includable)))})",
                    400,
                    f"include.{i}",
                )
