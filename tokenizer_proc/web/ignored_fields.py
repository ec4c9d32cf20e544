"""Unknown top-level fields, ignored but made visible (vLLM's rule): OpenAI clients send
vendor fields of their own, so a field that is neither declared by the route's body nor in its
refusal table (`request.unsupported`) is ignored, and `note_ignored` says so: one warning log
line naming the fields, and the `HEADER` response header listing them, so that a client can
tell a field it meant to take effect (a typo, another engine's extra) from one that did.

The header's value is a JSON array of the names (ASCII, escaped as JSON escapes them, so a
name with a comma, a quote or a line break cannot break the header), at most `MAX_LISTED`
of them and at most `MAX_HEADER_BYTES` in all (an escaped emoji takes 12 bytes: 32 names of
64 of them made a 24 KB header, past Node's 16 KB limit and nginx's default buffers); the log
line gives the count beside them. `IgnoredFieldsHeader` adds it to the
response, streamed or not, from ``scope["state"]``, where the route's `note_ignored` left it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import structlog
from fastapi import FastAPI, Request
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "x-ignored-fields"
"""The response header that lists a request's ignored top-level fields."""
MAX_LISTED = 32
"""Names listed at most (header and log line); the log line counts the rest."""
MAX_NAME = 64
"""Characters of a name shown at most (a longer one ends in "...")."""
MAX_HEADER_BYTES = 2048
"""The header value's size at most (bytes); names past it are left out of the header."""
_STATE_KEY = "ignored_fields"


def ignored(extra: Mapping[str, Any] | None, known: Mapping[str, Any]) -> list[str]:
    """The names of `extra` (a body's undeclared top-level fields, pydantic's ``model_extra``)
    that `known` (the route's refusal table) does not name, in the body's order."""
    return [name for name in (extra or {}) if name not in known]


def note_ignored(request: Request, extra: Mapping[str, Any] | None, known: Mapping[str, Any]) -> None:
    """Log one warning naming the fields of `extra` that the route ignores (`ignored`) and
    have the response carry `HEADER` listing them; nothing when there are none."""
    names = ignored(extra, known)
    if not names:
        return
    shown = [n if len(n) <= MAX_NAME else n[:MAX_NAME] + "..." for n in names[:MAX_LISTED]]
    request.state.ignored_fields = header_value(shown)
    structlog.get_logger().warning(
        "request fields ignored (not read by this route)",
        path=request.url.path,
        fields=shown,
        count=len(names),
    )


def header_value(names: list[str]) -> str:
    """The JSON array of the first of `names` that fit in `MAX_HEADER_BYTES` (ASCII)."""
    kept: list[str] = []
    size = 2  # the brackets
    for name in names:
        size += len(json.dumps(name)) + (2 if kept else 0)  # ", " between names
        if size > MAX_HEADER_BYTES:
            break
        kept.append(name)
    return json.dumps(kept)


class IgnoredFieldsHeader:
    """ASGI middleware: a response whose route noted ignored fields (`note_ignored`) carries
    `HEADER`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; add the header to its response's start when the route noted
        fields."""
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_header(message: Message) -> None:
            if message["type"] == "http.response.start":
                value = scope.get("state", {}).get(_STATE_KEY)
                if value:
                    MutableHeaders(scope=message)[HEADER] = value
            await send(message)

        await self.app(scope, receive, with_header)


def add_ignored_fields_header(app: FastAPI) -> None:
    """Make `app`'s responses carry `HEADER` where a route noted ignored fields."""
    app.add_middleware(IgnoredFieldsHeader)
