"""Cross-origin requests (``--allowed-origins``): browser clients on other origins may call the
API, as vLLM and SGLang allow by default (every origin).

Starlette's ``CORSMiddleware`` answers a preflight (``OPTIONS`` with ``Origin`` and
``Access-Control-Request-Method``) before the API-key check, since a browser sends no
credentials with one, and adds ``Access-Control-Allow-Origin`` to the answers of allowed
origins. Any method and request header may be used (``Authorization`` and ``x-api-key``
among them); cookies are never allowed (the API does not use them). The request-id headers
and ``x-ignored-fields`` (`web.ignored_fields`) are exposed to scripts. A refused preflight (an origin, method or header not allowed) is a
400 in the error contract's JSON (`JsonCorsRefusal`). An empty list turns CORS off: a browser
on another origin then cannot read any answer, and its JSON requests fail their preflight
(405).
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.datastructures import Headers
from starlette.responses import Response

from tokenizer_proc.errors import error_response
from tokenizer_proc.web.ignored_fields import HEADER as IGNORED_FIELDS
from tokenizer_proc.web.request_id import HEADERS


class JsonCorsRefusal(CORSMiddleware):
    """Starlette's ``CORSMiddleware`` whose refused preflight is a JSON 400 (Starlette answers
    plain text: "Disallowed CORS origin")."""

    def preflight_response(self, request_headers: Headers) -> Response:
        """Starlette's answer; a refusal becomes `errors.error_response`, headers kept."""
        answer = super().preflight_response(request_headers)
        if answer.status_code != 400:
            return answer
        what = answer.body.decode().removeprefix("Disallowed CORS ")
        refused = error_response(
            f"cross-origin request refused: its {what} is not allowed (--allowed-origins names the origins)", 400
        )
        for name, value in answer.headers.items():
            if name not in ("content-type", "content-length"):
                refused.headers[name] = value
        return refused


def allow_origins(app: FastAPI, origins: list[str]) -> None:
    """Let browsers on `origins` (``*``: any) call `app` (see the module docstring); add it
    after every other middleware, so that it runs first. No-op for an empty list."""
    if origins:
        app.add_middleware(
            JsonCorsRefusal,
            allow_origins=origins,
            allow_methods=["*"],
            allow_headers=["*"],
            expose_headers=[*HEADERS, IGNORED_FIELDS],
            allow_credentials=False,
        )
