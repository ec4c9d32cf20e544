"""The request body limit (``--max-request-body-bytes``): a larger body is a 413 in the error
shape of its path (`errors.error_for`), decided before the body is read.

A ``Content-Length`` over the limit is answered at once, without reading anything; a body
sent without one (chunked) is counted as it arrives and refused as soon as it passes the
limit. (FastAPI's own ``max_body_size`` answers an over-long ``Content-Length`` with a
plain-text 413, outside the error contract, hence this middleware.)

A body sent in a ``Content-Encoding`` other than ``identity`` (gzip, br, ...) is a 415 naming
the encoding (`EncodedBodyRefusal`): bodies are not decoded here, and read as they came a gzip
body was a 400 saying it is "not UTF-8", and a declared encoding over a plain body was ignored.
"""

from __future__ import annotations

from fastapi import FastAPI, HTTPException
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tokenizer_proc.errors import APIError, error_for


def _message(max_bytes: int) -> str:
    return f"the request body is larger than {max_bytes} bytes, this server's limit (--max-request-body-bytes)"


class BodySizeLimit:
    """ASGI middleware refusing request bodies larger than `max_bytes` with a 413."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer 413 for a declared length over the limit; else count what the app receives."""
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            return await error_for(scope, APIError(_message(self.max_bytes), 413))(scope, receive, send)
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:  # FastAPI passes an HTTPException raised here to the error handlers
                raise HTTPException(413, _message(self.max_bytes))
            return message

        await self.app(scope, counted, send)


class EncodedBodyRefusal:
    """ASGI middleware answering a request whose ``Content-Encoding`` is not ``identity`` with a
    415 naming it (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer 415 for an encoded body; pass everything else on."""
        if scope["type"] == "http":
            encoding = Headers(scope=scope).get("content-encoding", "identity").strip()
            if encoding.lower() not in ("", "identity"):
                e = APIError(
                    f"the request body is sent with Content-Encoding: {encoding}, which this server does "
                    f"not decode: send it uncompressed",
                    415,
                )
                return await error_for(scope, e)(scope, receive, send)
        await self.app(scope, receive, send)


def refuse_encoded_bodies(app: FastAPI) -> None:
    """Refuse request bodies of `app` sent in a Content-Encoding (see the module docstring)."""
    app.add_middleware(EncodedBodyRefusal)


def limit_body_size(app: FastAPI, max_bytes: int) -> None:
    """Refuse request bodies of `app` larger than `max_bytes` (see the module docstring)."""
    app.add_middleware(BodySizeLimit, max_bytes=max_bytes)
