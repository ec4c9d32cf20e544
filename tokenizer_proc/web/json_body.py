"""Reading a route's JSON body off the event loop: `JsonBodyRoute`, the route class of every
route of the app, decodes (``json.loads``) and validates (pydantic) a JSON body larger than
`INLINE_BODY_BYTES` in a worker thread.

FastAPI does both on the event loop, which serves every stream of this process: a 16 MiB
body of many short chat messages held it for about 6 s, and a 16 MiB ``input_ids`` list for
about 2 s, while every other stream stood still. Here the validated model is handed to
FastAPI (as Starlette's cached ``Request.json()``), whose own validation then takes it as it
is (pydantic does not revalidate an instance of the model); a body that fails gets the error
FastAPI raises for it (`errors.validation_message` and `errors.unparsable_body` word them),
so every 400 and 413 reads as it did.

`INLINE_BODY_BYTES` is 64 KiB: a smaller body is still read inline, which is cheaper than the
thread hop (about 0.1 ms). Measured here, the costliest bodies per byte (many short messages
or token ids, whose validators run per item) take about 0.15 ms per KiB, so an inline body
holds the loop for 10 ms at most, about one decode step of a small model; a body of long
strings takes about 1 µs per KiB.

What a thread cannot lift: ``json.loads``, pydantic's compiled loops, the garbage collector
and freeing a large body hold the GIL, so the loop still waits for those stretches
(``json.loads`` alone about 10 ms per MiB of dense JSON: the 16 MiB bodies above still hold
it for 0.2 to 0.7 s at a time, on a busy 2-core machine); the validators written in Python,
most of the time of a large body, take turns with it.
"""

from __future__ import annotations

import asyncio
import email.message
import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

INLINE_BODY_BYTES = 64 * 1024
"""JSON bodies up to this size are decoded and validated on the event loop (see the module docstring)."""


def _is_json(content_type: str | None) -> bool:
    """Whether FastAPI decodes a body sent with `content_type` as JSON: ``application/json``
    or ``application/*+json`` (a body without a Content-Type is not decoded)."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


class JsonBodyRoute(APIRoute):
    """A route whose JSON body, when larger than `INLINE_BODY_BYTES`, is decoded and
    validated in a worker thread (see the module docstring). Its body must be one parameter
    (the request model), as FastAPI then validates the body whole."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        params = self.dependant.body_params
        if len(params) > 1 or (params and getattr(params[0].field_info, "embed", False)):
            raise TypeError(f"route {path}: its body must be one parameter, not embedded (see json_body)")

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler, after the body has been decoded and validated off the loop where it is large."""
        handler = super().get_route_handler()
        if self.body_field is None:
            return handler

        async def route(request: Request) -> Response:
            if _is_json(request.headers.get("content-type")):
                await self._validate_large(request)
            return await handler(request)

        return route

    async def _validate_large(self, request: Request) -> None:
        """Read the body of `request`; when larger than `INLINE_BODY_BYTES`, decode and
        validate it in a thread and leave the model as the request's decoded JSON, or raise
        the error FastAPI's handler raises for that body."""
        try:
            body = await request.body()
            if len(body) <= INLINE_BODY_BYTES:
                return
            value = await asyncio.to_thread(json.loads, body)
        except json.JSONDecodeError as e:
            raise RequestValidationError(
                [
                    {
                        "type": "json_invalid",
                        "loc": ("body", e.pos),
                        "msg": "JSON decode error",
                        "input": {},
                        "ctx": {"error": e.msg},
                    }
                ],
                body=e.doc,
            ) from e
        except HTTPException:  # the body limit's 413 (`limits`)
            raise
        except Exception as e:  # not UTF-8, nested too deeply, the client left: its cause says which
            raise HTTPException(400, "There was an error parsing the body") from e
        model, errors = await asyncio.to_thread(self.body_field.validate, value, {}, loc=("body",))
        if errors:
            raise RequestValidationError(errors, body=value)
        request._json = model  # what Starlette's Request.json() returns to FastAPI's handler
