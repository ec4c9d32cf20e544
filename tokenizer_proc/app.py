"""The FastAPI app (`create_app`): the middleware every request passes, then the routers of
each API surface (`openai`, `native`, `anthropic`, `responses`)."""

from __future__ import annotations

from fastapi import FastAPI

from protocol.config import ServerArgs
from tokenizer_proc.anthropic import routes as anthropic_routes
from tokenizer_proc.errors import install_handlers
from tokenizer_proc.link.tokenizer_manager import TokenizerManager
from tokenizer_proc.native import routes as native_routes
from tokenizer_proc.native.cache_routes import FLUSH_PATH
from tokenizer_proc.openai import routes as openai_routes
from tokenizer_proc.openai.render import system_fingerprint
from tokenizer_proc.request.builder import RequestBuilder
from tokenizer_proc.request.fields import bound_token_ids
from tokenizer_proc.responses import routes as responses_routes
from tokenizer_proc.web.auth import require_api_key
from tokenizer_proc.web.cors import allow_origins
from tokenizer_proc.web.ignored_fields import add_ignored_fields_header
from tokenizer_proc.web.json_body import JsonBodyRoute
from tokenizer_proc.web.limits import limit_body_size, refuse_encoded_bodies
from tokenizer_proc.web.request_id import add_request_ids
from tokenizer_proc.web.route_methods import add_head_routes


def create_app(
    manager: TokenizerManager,
    builder: RequestBuilder,
    served_name: str,
    *,
    api_key: str = "",
    max_body_bytes: int | None = None,
    keepalive_s: float = 0.0,
    log_requests: bool = False,
    settings: tuple = (),
    server_args: ServerArgs | None = None,
    allowed_origins: tuple[str, ...] = (),
) -> FastAPI:
    """Build the app. manager: the link to the other processes; builder: request checks;
    api_key: the key every route but /health and /ping requires ("" for none, see `auth`);
    max_body_bytes: larger request bodies are a 413 (see `limits`; None for no limit);
    keepalive_s: seconds without an event after which a stream gets an SSE comment (see
    `web.sse`; 0 for none); log_requests: log messages that may quote a request (see
    `errors.install_handlers`); settings: the server settings that change the answers, which
    with the version, the served name and the model's facts make the ``system_fingerprint``
    of chat and completions responses (see `openai.render.system_fingerprint`); server_args:
    the server's settings, for ``/get_model_info`` and ``/get_server_info`` (`info_routes`);
    allowed_origins: the origins browsers may call from (`cors`; ``*``: any, none: no CORS)."""
    # no 307 from /v1/completions/ to /v1/completions (Starlette's default, with a Location built
    # from the client's Host header): a path no route serves is a 404 that names it
    app = FastAPI(title="lazyserve", version="0.1.0", redirect_slashes=False)
    app.router.route_class = JsonBodyRoute  # every route's large JSON body is read off the event loop
    fingerprint = system_fingerprint(app.version, served_name, builder.facts, *settings)
    schema = app.openapi
    app.openapi = lambda: bound_token_ids(schema(), builder.facts.vocab_size)  # type: ignore[method-assign]
    install_handlers(app, log_requests)
    refuse_encoded_bodies(app)
    if max_body_bytes is not None:
        limit_body_size(app, max_body_bytes)
    if api_key:  # added last, so checked first: a request without the key is not read
        require_api_key(app, api_key)
    allow_origins(app, list(allowed_origins))  # added after the key: a preflight carries none
    add_ignored_fields_header(app)
    add_request_ids(app)  # wraps everything: the early answers above and a 500 carry an id too

    native_routes.add_routes(app, manager, builder, keepalive_s, server_args)
    openai_routes.add_routes(app, manager, builder, served_name, fingerprint, keepalive_s)
    anthropic_routes.add_routes(app, manager, builder, keepalive_s)
    responses_routes.add_routes(app, manager, builder, served_name, keepalive_s)
    add_head_routes(app, unsafe=(FLUSH_PATH,))
    return app
