"""``GET /v1/models`` and ``GET /v1/models/{id}``: the served model's card, readable by both
OpenAI's and Anthropic's clients.

The card holds OpenAI's fields (``id``, ``object``, ``created``, ``owned_by``; plus vLLM's
``max_model_len``, ``root`` and ``parent``) and Anthropic's (``type``, ``display_name``, ``created_at`` as RFC 3339,
``lifecycle``, ``max_input_tokens``, ``max_tokens``), so ``client.models.list()`` /
``retrieve()`` of either SDK parses it; the list carries Anthropic's paging fields
(``has_more``, ``first_id``, ``last_id``) as well, and the list takes Anthropic's paging
parameters (``limit`` 1..1000, ``after_id``, ``before_id``: no entry comes after or before
the one there is). ``created`` is the server's start time. A name the server does not serve
is a 404 (`RequestBuilder.check_model`).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse

from tokenizer_proc.errors import APIError
from tokenizer_proc.request.builder import RequestBuilder


def model_card(name: str, root: str, context_length: int, created: int) -> dict:
    """The card of model `name` (root: the model it serves, its path, as vLLM's and SGLang's
    cards give it; context_length: tokens; created: Unix seconds)."""
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "lazyserve",
        "root": root,
        "parent": None,
        "max_model_len": context_length,
        "type": "model",
        "display_name": name,
        "created_at": datetime.fromtimestamp(created, timezone.utc).isoformat().replace("+00:00", "Z"),
        "lifecycle": "active",
        "max_input_tokens": context_length,
        "max_tokens": context_length,
    }


def add_routes(app: FastAPI, builder: RequestBuilder, served_name: str) -> None:
    """Install ``GET /v1/models`` and ``GET /v1/models/{id}`` (ids may hold ``/``) on `app`."""
    card = model_card(served_name, builder.served_names[-1], builder.facts.context_length, int(time.time()))

    @app.get("/v1/models")
    async def models(
        limit: str | None = None, after_id: str | None = None, before_id: str | None = None
    ) -> JSONResponse:
        """The served model, as a one-entry list; after_id / before_id (which must name it, a
        400 otherwise) give the empty page after or before it. The parameters are checked here
        (not by FastAPI, whose errors read as a body's), so a 400 names the parameter."""
        if limit is not None and not (limit.isdigit() and 1 <= int(limit) <= 1000):
            raise APIError(f"limit: {limit!r} is not an integer from 1 to 1000", 400, "limit")
        for param, cursor in (("after_id", after_id), ("before_id", before_id)):
            if cursor is not None and cursor not in builder.served_names:
                raise APIError(
                    f"{param}: {cursor!r} is not a model this server lists (it lists {served_name!r})", 400, param
                )
        data = [] if after_id is not None or before_id is not None else [card]
        first = data[0]["id"] if data else None
        return JSONResponse({"object": "list", "data": data, "has_more": False, "first_id": first, "last_id": first})

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> JSONResponse:
        """The served model's card under any name it is served as, else a 404 (a path ending
        in ``/``, ``/v1/models/`` included, is the router's 404, as on every other route)."""
        if not model_id or model_id.endswith("/"):
            raise HTTPException(404)  # "Not Found": the handler names the path (`errors.install_handlers`)
        builder.check_model(model_id)
        return JSONResponse(card)
