"""One endpoint served for several HTTP methods (``/health`` for GET and HEAD, SGLang's
``/flush_cache`` for GET and POST) without breaking the OpenAPI document."""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI


def add_routes_per_method(app: FastAPI, path: str, endpoint: Callable, methods: tuple[str, ...]) -> None:
    """Serve `path` with `endpoint` for each of `methods`, one route per method: FastAPI gives
    every method of a route of several the same OpenAPI operationId, which the OpenAPI
    specification requires to be unique (clients generated from the document break on it)."""
    for method in methods:
        app.add_api_route(path, endpoint, methods=[method])
