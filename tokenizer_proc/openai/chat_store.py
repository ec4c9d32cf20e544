"""OpenAI's stored chat completions routes: ``GET /v1/chat/completions`` (the list),
``GET`` / ``POST`` / ``DELETE /v1/chat/completions/{id}`` and
``GET /v1/chat/completions/{id}/messages``.

This server keeps no chat completion (``store`` is on the allow-list: accepted, and nothing
is kept; the Responses API keeps responses, see `responses.store`). So every id is one
it does not have: a 404 whose message names the id (code ``not_found``), as OpenAI answers
for an id it does not have, where the bare "Not Found" of a path no route serves said
nothing about it. Listing them is a 400 saying it is not served.
"""

from __future__ import annotations

from fastapi import FastAPI

from tokenizer_proc.errors import APIError, not_found

NOT_KEPT = (
    "this server does not store chat completions (store is accepted, and nothing is kept); the Responses "
    "API (/v1/responses) keeps responses created with store"
)


def add_routes(app: FastAPI) -> None:
    """Install the stored chat completion routes (see the module docstring) on `app`."""

    @app.get("/v1/chat/completions")
    async def list_completions() -> None:
        """Not served: a 400 saying so."""
        raise APIError(f"listing stored chat completions is not supported: {NOT_KEPT}", 400)

    @app.get("/v1/chat/completions/{completion_id}")
    @app.post("/v1/chat/completions/{completion_id}")
    @app.delete("/v1/chat/completions/{completion_id}")
    async def completion(completion_id: str) -> None:
        """Retrieve, update or delete a stored chat completion: none is kept, a 404."""
        raise not_found("chat completion", completion_id, NOT_KEPT)

    @app.get("/v1/chat/completions/{completion_id}/messages")
    async def messages(completion_id: str) -> None:
        """The messages of a stored chat completion: none is kept, a 404."""
        raise not_found("chat completion", completion_id, NOT_KEPT)
