"""Anthropic's error shape for the ``/v1/messages`` routes:
``{"type": "error", "error": {"type", "message", "param", "code"}}`` (and ``details``, the
error's machine-readable facts, where it has them: `APIError.details`).

``error.type`` is Anthropic's name for the status (`ERROR_TYPES`); a server that cannot take
the request now (503 elsewhere: shutting down, no live detokenizer replica, timed out in the
queue) answers Anthropic's 529 ``overloaded_error`` (`STATUSES`), in a body and in a stream's
``error`` event alike. ``param`` and ``code`` (the HTTP status) are this server's error
contract, kept inside ``error`` so one body satisfies both (Anthropic's clients ignore the
extra keys). Errors raised before a route runs (a missing API key, an over-long body, an
unknown method) get this shape too: the routes register it for their paths
(`errors.add_error_shape`).
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from tokenizer_proc.errors import APIError, shown_message, validation_message
from tokenizer_proc.web.json_body import JsonBodyRoute

STATUSES = {503: 529}
"""This server's HTTP status -> the one Anthropic's API answers the same fault with (others as
they are): 529 is its "overloaded", which its SDK raises as ``OverloadedError`` (and retries)."""

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}
"""Anthropic HTTP status -> ``error.type``; other 4xx are invalid_request_error, other 5xx api_error."""


def status(e: APIError) -> int:
    """The HTTP status Anthropic's API would answer `e` with (`STATUSES`)."""
    return STATUSES.get(e.status, e.status)


def error_body(e: APIError) -> dict:
    """The Anthropic error body of `e` (also the data of a stream's ``error`` event); its
    ``code`` is `status`."""
    code = status(e)
    kind = ERROR_TYPES.get(code, "invalid_request_error" if code < 500 else "api_error")
    message = shown_message(e.message)
    error = {"type": kind, "message": message, "param": e.param, "code": code}
    if e.details is not None:
        error["details"] = e.details
    return {"type": "error", "error": error}


def error_response(e: APIError) -> JSONResponse:
    """`e` as an Anthropic error response, with `status` and `e`'s headers (e.g. ``Retry-After``)."""
    return JSONResponse(error_body(e), status_code=status(e), headers=e.headers)


class AnthropicRoute(JsonBodyRoute):
    """A route whose validation errors and `APIError`s are answered in Anthropic's shape (its
    large body read off the event loop, `json_body`)."""

    def get_route_handler(self) -> Callable:
        """The default handler, with those errors caught and rendered by `error_response`."""
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                message, param = validation_message(exc, request.headers.get("content-type", ""))
                return error_response(APIError(message, 400, param))
            except APIError as e:
                return error_response(e)

        return route
