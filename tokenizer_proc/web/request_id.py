"""Request-id response headers: every HTTP response carries an id, as ``x-request-id``
(OpenAI's name, read by the ``openai`` SDK into ``_request_id`` and its errors) and
``request-id`` (Anthropic's, read by the ``anthropic`` SDK alike): the request's own
``X-Request-Id`` when it sent one (a proxy's or client's trace id, echoed as vLLM does; at most
`MAX_CLIENT_ID` visible ASCII characters, else ignored), otherwise a fresh ``req_`` and 32 hex
digits. Errors answered before a route runs (401, 413, 404) carry it too, and so does
the 500 of an exception no route handled, which Starlette's error middleware answers from
outside every added middleware: the id wraps the whole stack (`add_request_ids`).
"""

from __future__ import annotations

import uuid

from fastapi import FastAPI
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADERS = ("x-request-id", "request-id")
"""The response headers that carry the id."""
MAX_CLIENT_ID = 128
"""The longest client ``X-Request-Id`` echoed (characters)."""


def client_id(scope: Scope) -> str | None:
    """The request's ``X-Request-Id`` when it is 1 to `MAX_CLIENT_ID` visible ASCII characters
    (0x21-0x7e), else None."""
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            if 0 < len(value) <= MAX_CLIENT_ID and all(0x21 <= b <= 0x7E for b in value):
                return value.decode("ascii")
            return None
    return None


class RequestIdHeaders:
    """ASGI middleware adding `HEADERS` (the client's id or a fresh one) to every HTTP response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; add the headers to its response's start."""
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = client_id(scope) or f"req_{uuid.uuid4().hex}"

        async def with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name in HEADERS:
                    headers[name] = rid
            await send(message)

        await self.app(scope, receive, with_id)


def add_request_ids(app: FastAPI) -> None:
    """Make every response of `app` carry a request id (see the module docstring): the
    middleware wraps the whole stack `app` builds, Starlette's outermost error middleware
    included (`add_middleware` would place it inside that one)."""
    build = app.build_middleware_stack
    app.build_middleware_stack = lambda: RequestIdHeaders(build())
