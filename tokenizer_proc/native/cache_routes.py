"""``POST /flush_cache`` (SGLang's route, GET too): drop the prefixes the radix cache holds.

Benchmarks call it between runs so that one run's prompts are not served from the cache
the previous run filled. Prefixes that requests in flight use are kept (they would be
computed again at once); the answer says how many tokens were freed and how many are still
held. While the server drains it is a 503, like every new request.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from tokenizer_proc.errors import APIError
from tokenizer_proc.web.route_methods import add_routes_per_method

FLUSH_PATH = "/flush_cache"
"""Its path; a GET there changes the server, so it takes no HEAD (`route_methods.add_head_routes`)."""
FLUSH_WAIT_S = 30.0
"""The longest ``/flush_cache`` waits for the scheduler's answer: it reads its inbox between
steps, and a long prefill is one step."""


def add_routes(app: FastAPI, manager) -> None:
    """Install ``/flush_cache`` (GET and POST) on `app`; manager: the `TokenizerManager`."""

    async def flush_cache() -> JSONResponse:
        """Drop the cached prefixes no request in flight uses; 200 with ``freed_tokens`` and
        ``held_tokens``; 503 while shutting down or when the scheduler does not answer."""
        if manager.stopping:
            raise APIError("server is shutting down", 503)
        try:
            done = await manager.flush_cache(FLUSH_WAIT_S)
        except TimeoutError:
            raise APIError(f"the scheduler did not answer within {FLUSH_WAIT_S:g} s; try again", 503) from None
        return JSONResponse(
            {"message": "Cache flushed.", "freed_tokens": done.freed_tokens, "held_tokens": done.held_tokens}
        )

    add_routes_per_method(app, FLUSH_PATH, flush_cache, ("GET", "POST"))
