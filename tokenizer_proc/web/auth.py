"""API-key authentication (``--api-key``): every route but ``/health`` and ``/ping`` needs the key.

Clients send it as ``Authorization: Bearer KEY`` (OpenAI's clients) or ``x-api-key: KEY``
(Anthropic's). Starlette's `AuthenticationMiddleware` checks it before a route runs or reads
the body; a missing or wrong key is a 401 in the error shape of the path (`errors.error_for`)
with ``WWW-Authenticate: Bearer``. Keys are compared as bytes with `hmac.compare_digest`, whose
time does not depend on how much of a wrong key matches.
"""

from __future__ import annotations

import hmac

from fastapi import FastAPI
from fastapi.security.utils import get_authorization_scheme_param
from starlette.authentication import AuthCredentials, AuthenticationBackend, AuthenticationError, SimpleUser
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import HTTPConnection
from starlette.responses import Response

from tokenizer_proc.errors import APIError, error_for

INVALID_KEY = (
    "invalid API key: send the key the server was started with (--api-key or $LAZYSERVE_API_KEY) "
    "as Authorization: Bearer KEY or x-api-key: KEY"
)
"""The 401's message for a key that is offered but wrong."""

OPEN_PATHS = frozenset({"/health", "/ping"})
"""Paths served without a key (load balancers probe them)."""


class ApiKeyBackend(AuthenticationBackend):
    """Accepts a connection that offers `key` in either header; raises `AuthenticationError`
    naming what is wrong otherwise (paths in `OPEN_PATHS` pass without a key)."""

    def __init__(self, key: str) -> None:
        self.key = key.encode("utf-8")

    async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, SimpleUser] | None:
        """(credentials, user) for a valid key, None for an open path."""
        if conn.scope["path"] in OPEN_PATHS:
            return None
        scheme, bearer = get_authorization_scheme_param(conn.headers.get("authorization"))
        offered = [bearer] if scheme.lower() == "bearer" and bearer else []
        offered += [conn.headers["x-api-key"]] if "x-api-key" in conn.headers else []
        if not offered:
            raise AuthenticationError("missing API key: send the header Authorization: Bearer KEY or x-api-key: KEY")
        # header values arrive decoded as latin-1; encoding them back gives the bytes sent
        if not any(hmac.compare_digest(self.key, value.encode("latin-1")) for value in offered):
            raise AuthenticationError(INVALID_KEY)
        return AuthCredentials(["authenticated"]), SimpleUser("api-key")


def _unauthorized(conn: HTTPConnection, exc: AuthenticationError) -> Response:
    return error_for(
        conn.scope, APIError(str(exc), 401, type_="authentication_error", headers={"WWW-Authenticate": "Bearer"})
    )


def require_api_key(app: FastAPI, key: str) -> None:
    """Make every route of `app` but `OPEN_PATHS` answer 401 unless the request carries `key`."""
    app.add_middleware(AuthenticationMiddleware, backend=ApiKeyBackend(key), on_error=_unauthorized)
