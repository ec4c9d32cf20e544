"""Server information routes that vLLM's and SGLang's users reach for: ``GET /version``
(vLLM: ``{"version"}``), ``GET /get_model_info`` and ``GET /get_server_info`` (SGLang's
native routes: the model's path and kind; the server's settings with its version).

``/get_server_info`` gives the settings as launch resolved them (`protocol.config.ServerArgs`),
with those left to the worker (KV pool size, context length, compiled batch sizes) as it
resolved them once it has reported (`protocol.messages.ResolvedSettings`), except secrets:
``api_key`` reads ``"set"`` or ``""``, never the key. ``/ping`` (vLLM's and SageMaker's
health route) is installed beside ``/health`` by `server.create_app`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from protocol.config import ServerArgs
from tokenizer_proc.request.builder import RequestBuilder


def public_settings(args: ServerArgs) -> dict[str, Any]:
    """`args` as a JSON-ready dict, the API key replaced by ``"set"`` (or ``""`` when none)."""
    out = msgspec.to_builtins(args)
    out["api_key"] = "set" if args.api_key else ""
    return out


def add_routes(
    app: FastAPI,
    builder: RequestBuilder,
    version: str,
    args: ServerArgs | None,
    resolved: Callable[[], dict[str, int]] = dict,
) -> None:
    """Install ``GET /version``, ``GET /get_model_info`` and ``GET /get_server_info`` on `app`.
    args: the server's settings (None in tests that build the app without a server: then
    ``model_path`` is null and ``/get_server_info`` gives the version alone); resolved: the
    settings the worker resolved so far, by `ServerArgs` name (they replace those of `args`)."""
    path = args.model.path if args is not None else None
    model_info = {
        "model_path": path,
        "tokenizer_path": path,
        "served_model_name": builder.served_names[0],
        "is_generation": True,
        "max_model_len": builder.facts.context_length,
    }
    server_info = {**(public_settings(args) if args is not None else {}), "version": version}

    @app.get("/version")
    async def get_version() -> JSONResponse:
        """The server's version."""
        return JSONResponse({"version": version})

    @app.get("/get_model_info")
    async def get_model_info() -> JSONResponse:
        """The served model: its path (the tokenizer's too), served name, kind (generation) and
        context length (tokens)."""
        return JSONResponse(model_info)

    @app.get("/get_server_info")
    async def get_server_info() -> JSONResponse:
        """The server's settings (the API key redacted; those the worker resolved as it did) and
        version."""
        return JSONResponse({**server_info, **(resolved() if args is not None else {})})
