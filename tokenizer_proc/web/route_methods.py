"""One endpoint served for several HTTP methods (``/ping`` for GET, HEAD and POST, SGLang's
``/flush_cache`` for GET and POST) without breaking the OpenAPI document, and HEAD for every
GET route that only reads."""

from __future__ import annotations

from collections.abc import Callable, Collection

from fastapi import FastAPI
from fastapi.routing import APIRoute


def add_routes_per_method(app: FastAPI, path: str, endpoint: Callable, methods: tuple[str, ...]) -> None:
    """Serve `path` with `endpoint` for each of `methods`, one route per method: FastAPI gives
    every method of a route of several the same OpenAPI operationId, which the OpenAPI
    specification requires to be unique (clients generated from the document break on it)."""
    for method in methods:
        app.add_api_route(path, endpoint, methods=[method])


def add_head_routes(app: FastAPI, unsafe: Collection[str]) -> None:
    """Serve HEAD on every GET route of `app` that has none, with the GET's endpoint: RFC 9110
    §9.3.2 (a HEAD is the GET without the content; uvicorn sends the headers alone), and what
    load balancers' and uptime checkers' HEAD probes of ``/health``, ``/v1/models`` or
    ``/metrics`` expect (FastAPI, unlike Starlette's plain routes, answered them 405). Call it
    once every route is installed. unsafe: paths whose GET changes the server (SGLang's
    ``GET /flush_cache``); a HEAD there stays a 405, since a HEAD must not change anything. The
    HEAD routes stay out of the OpenAPI document (its operationIds must be unique)."""
    routes = [r for r in app.routes if isinstance(r, APIRoute)]
    with_head = {r.path for r in routes if "HEAD" in r.methods}
    for route in routes:
        if "GET" in route.methods and route.path not in with_head and route.path not in unsafe:
            app.add_api_route(route.path, route.endpoint, methods=["HEAD"], include_in_schema=False)
            with_head.add(route.path)
