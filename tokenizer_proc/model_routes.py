"""``GET /v1/models`` and ``GET /v1/models/{id}``: the served model's card, readable by both
OpenAI's and Anthropic's clients.

The card holds OpenAI's fields (``id``, ``object``, ``created``, ``owned_by``; plus vLLM's
``max_model_len``) and Anthropic's (``type``, ``display_name``, ``created_at`` as RFC 3339,
``lifecycle``, ``max_input_tokens``, ``max_tokens``), so ``client.models.list()`` /
``retrieve()`` of either SDK parses it; the list carries Anthropic's paging fields
(``has_more``, ``first_id``, ``last_id``) as well. ``created`` is the server's start time.
A name the server does not serve is a 404 (`RequestBuilder.check_model`).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from tokenizer_proc.request_builder import RequestBuilder


def model_card(name: str, context_length: int, created: int) -> dict:
    """The card of model `name` (context_length: tokens; created: Unix seconds)."""
    return {"id": name, "object": "model", "created": created, "owned_by": "lazyserve",
            "max_model_len": context_length, "type": "model", "display_name": name,
            "created_at": datetime.fromtimestamp(created, timezone.utc).isoformat().replace("+00:00", "Z"),
            "lifecycle": "active", "max_input_tokens": context_length, "max_tokens": context_length}


def add_routes(app: FastAPI, builder: RequestBuilder, served_name: str) -> None:
    """Install ``GET /v1/models`` and ``GET /v1/models/{id}`` (ids may hold ``/``) on `app`."""
    card = model_card(served_name, builder.facts.context_length, int(time.time()))

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        """The served model, as a one-entry list."""
        return JSONResponse({"object": "list", "data": [card], "has_more": False,
                             "first_id": served_name, "last_id": served_name})

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> JSONResponse:
        """The served model's card under any name it is served as, else a 404."""
        builder.check_model(model_id)
        return JSONResponse(card)
