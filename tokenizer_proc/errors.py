"""The error contract: every bad request gets a 4xx with ``{"error": {message, type, param, code}}``.

A family of routes with an error shape of its own (Anthropic's ``/v1/messages``) registers
it with `add_error_shape`, for its paths, or for requests carrying its client's header on
paths both families share (Anthropic's SDK sends ``anthropic-version`` to ``/v1/models``);
errors raised before a route runs (a missing API key, an over-long body, an unknown path or
method, an unexpected failure) are then rendered by `error_for` in the shape of the path
they were sent to.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import Scope

from protocol.enums import ReqField

SERVER_ERROR = "server_error"
"""The ``type`` of every 5xx of the OpenAI-style routes (chat, completions, Responses, native,
/health, ...), whichever route or process raised it: a 503 while draining, not ready, stalled
or recovering has the same one as a 500 (OpenAI's own 503, "The server is overloaded or not
ready yet.", carries it too); clients tell them apart by the status. A family with an error
shape of its own (`add_error_shape`) maps statuses to its own types."""


def error_type(status: int, type_: str | None = None) -> str:
    """The OpenAI-style ``type`` of an error with HTTP `status`: `SERVER_ERROR` for any 5xx
    (a `type_` given for one is not used: one value per family), else `type_` or
    ``invalid_request_error``."""
    if status >= 500:
        return SERVER_ERROR
    return type_ or "invalid_request_error"


class APIError(Exception):
    """An error answered as JSON. status: HTTP status; param: the offending field or None;
    type_: the OpenAI-style type of a 4xx (see `error_type`); headers: extra response headers
    (e.g. ``Retry-After``); details: machine-readable facts an API's clients act on
    (Anthropic's ``error.details``), None for none; code: OpenAI's machine-readable
    ``error.code`` where its API has one for this error (``not_found``, ``model_not_found``,
    ``previous_response_not_found``), None for the HTTP status (vLLM's)."""

    def __init__(
        self,
        message: str,
        status: int = 400,
        param: str | None = None,
        type_: str | None = None,
        headers: dict[str, str] | None = None,
        details: dict | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.headers, self.details = message, status, param, headers, details
        self.type = error_type(status, type_)
        self.code = code

    def body(self) -> dict:
        """The OpenAI ``error`` object of this error (see `error_body`)."""
        return error_body(self.message, self.status, self.param, self.type, self.code)

    def response(self) -> JSONResponse:
        """The JSON response for this error."""
        return error_response(self.message, self.status, self.param, self.type, self.headers, self.code)


def not_found(what: str, ident: str, why: str) -> APIError:
    """A 404 for the `what` (e.g. "response") with id `ident`, which is not kept here: its
    message names the id, then `why`; code ``not_found``."""
    return APIError(f"{what} {ident!r} not found: {why}", 404, code="not_found")


class FieldError(APIError):
    """An `APIError` about a request field that its raiser knows only by the shared vocabulary
    (`ReqField`: the scheduler's refusals, `ReqError`); the route names it as its body has it
    (`named`). Until then its param is None."""

    def __init__(self, message: str, status: int, field: ReqField) -> None:
        super().__init__(message, status)
        self.field = field

    def named(self, param: str | None) -> FieldError:
        """This error (changed in place) with `param` as its param and leading its message;
        None (no such field in the route's body) leaves it as it is."""
        if param is not None:
            self.param, self.message = param, f"{param}: {self.message}"
        return self


def add_error_shape(
    app: FastAPI, prefix: str, render: Callable[[APIError], JSONResponse], header: str | None = None
) -> None:
    """Render the errors of the paths under `prefix` (the path itself and ``prefix/...``) with
    `render` wherever `error_for` answers them; with `header` (lower case), only those of
    requests that carry that header."""
    if not hasattr(app.state, "error_shapes"):
        app.state.error_shapes = []
    app.state.error_shapes.append((prefix, header, render))


def error_for(scope: Scope, e: APIError) -> JSONResponse:
    """`e` in the error shape of the path `scope` was sent to (see `add_error_shape`), else
    the server-wide one. Works in middleware too: Starlette sets ``scope["app"]`` first."""
    app = scope.get("app")
    path = scope.get("path", "")
    headers = {k.decode("latin-1").lower() for k, _ in scope.get("headers", [])}
    for prefix, header, render in getattr(getattr(app, "state", None), "error_shapes", []):
        if (path == prefix or path.startswith(prefix + "/")) and (header is None or header in headers):
            return render(e)
    return e.response()


def error_body(
    message: str, status: int, param: str | None = None, type_: str | None = None, code: str | None = None
) -> dict:
    """The OpenAI ``error`` object: message, type (`error_type`), param, and code (the HTTP
    `status` when not given, as vLLM answers)."""
    return {
        "message": shown_message(message),
        "type": error_type(status, type_),
        "param": param,
        "code": status if code is None else code,
    }


def error_response(
    message: str,
    status: int,
    param: str | None = None,
    type_: str | None = None,
    headers: dict[str, str] | None = None,
    code: str | None = None,
) -> JSONResponse:
    """OpenAI-style error body (`error_body`) with HTTP `status` (and extra `headers`)."""
    return JSONResponse({"error": error_body(message, status, param, type_, code)}, status_code=status, headers=headers)


MAX_MESSAGE_CHARS = 2000
"""Characters of an error message shown at most: messages quote what the request sent (a path,
a model name, a number), and a 100 kB path came back as a 100 kB 404."""


def shown_message(text: str) -> str:
    """`text` as an error body shows it: anything that is not valid Unicode escaped (so the
    body encodes), and cut to `MAX_MESSAGE_CHARS` with a note of its full length."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) <= MAX_MESSAGE_CHARS:
        return text
    return f"{text[:MAX_MESSAGE_CHARS]}... (message cut: {len(text)} characters in all)"


def client_path(e: dict, body: object) -> list[str]:
    """The path of pydantic error `e` (an item of ``errors()``) in `body` (the decoded JSON it
    validated) as the client wrote it: its ``loc`` less FastAPI's leading ``body`` and the
    labels pydantic puts in for the member of a union it tried, whatever their kind (a smart
    union's ``str``, ``list[str]`` or ``function-after[...]``, a tagged union's tag such as
    ``tool_result``, a callable discriminator's ``dict``). Found by walking `body` along the
    loc: a key or index that is there is part of the path, any other string is a label. A
    label that is also a key there (a content part's tag ``text`` and its field ``text``) is
    told apart by the error's ``input``, the value the walk must end at (for a missing field,
    the object that lacks it). Without any walk through `body`, the loc as it is."""
    loc = tuple(e.get("loc", ()))
    loc = loc[1:] if loc[:1] == ("body",) else loc
    first = None
    for path, end in _walks(body, loc, e.get("type") == "missing"):
        if "input" not in e or _same(end, e["input"]):
            return path
        first = path if first is None else first
    return first if first is not None else [str(x) for x in loc]


def _walks(node: object, loc: tuple, missing: bool):
    """Each way (path, the value it ends at) that `loc` walks through `node`, keys and indexes
    taken before labels are skipped; missing: the last segment may be a key `node` lacks."""
    if not loc:
        yield [], node
        return
    seg, rest = loc[0], loc[1:]
    if isinstance(node, dict) and isinstance(seg, str) and seg in node:
        for path, end in _walks(node[seg], rest, missing):
            yield [seg, *path], end
    elif isinstance(node, list) and type(seg) is int and 0 <= seg < len(node):
        for path, end in _walks(node[seg], rest, missing):
            yield [str(seg), *path], end
    elif missing and not rest and isinstance(node, dict) and isinstance(seg, str):
        yield [seg], node
    if isinstance(seg, str):  # a union member's label
        yield from _walks(node, rest, missing)


def _same(a: object, b: object) -> bool:
    """Whether `a` is the value `b` (the same object, or an equal one of the same type)."""
    return a is b or (type(a) is type(b) and a == b)


class FieldValueError(ValueError):
    """A model-level check's error naming the field at fault: param, a dotted path such as
    ``messages.0.content`` (pydantic gives such errors no location of their own)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


def validation_message(exc: RequestValidationError, content_type: str) -> tuple[str, str | None]:
    """(message, param) of a body that failed validation: the first error, its field path
    (`client_path`) as param."""
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    e = errors[0]
    loc = client_path(e, exc.body)
    if not loc and "json" not in content_type.lower():  # e.g. curl -d without a header: a form body
        return (
            f"the request body must be a JSON object sent with Content-Type: application/json "
            f"(got Content-Type: {content_type or 'none'})"
        ), None
    if e.get("type") == "json_invalid":
        where = e["loc"][-1] if len(e.get("loc", ())) > 1 else None
        why = (e.get("ctx") or {}).get("error") or e.get("msg")
        at = f" at character {where}" if isinstance(where, int) else ""
        return f"request body is not valid JSON: {why}{at}", None
    if not loc and e.get("type") == "missing":
        return "the request body is empty: send a JSON object", None
    return field_error(e, exc.body)


_MEDIA = ("image", "audio", "document", "file", "video")
"""Words in a content type that mark it as not text (an image block, an input_file part)."""


NATIVE_SAMPLING_HINTS = {
    "max_tokens": "SGLang's name here is max_new_tokens",
    "max_completion_tokens": "SGLang's name here is max_new_tokens",
    "min_tokens": "SGLang's name here is min_new_tokens",
    "stop_sequences": "SGLang's name here is stop",
    "response_format": "structured output here is json_schema (the schema as a JSON string), regex or ebnf",
}
"""What to write instead of an OpenAI or Anthropic name sent inside native ``sampling_params``
(its keys are SGLang's; a batch's list of them too), added to the unknown-key 400."""


def field_error(e: dict, body: object) -> tuple[str, str | None]:
    """(message, param) of one pydantic error (an item of ``errors()``) about a field of
    `body` (the decoded JSON validated): its path as the client wrote it (`client_path`) as
    param, the message led by it."""
    loc = client_path(e, body)
    param = ".".join(loc) or None
    error = (e.get("ctx") or {}).get("error")
    if e.get("type") == "value_error" and error is not None:  # our checks' text, without pydantic's "Value error, "
        if isinstance(error, FieldValueError):
            return str(error), error.param
        return (f"{param}: {error}" if param else str(error)), param
    if e.get("type") == "extra_forbidden":
        where = ".".join(loc[:-1]) or "the body"
        in_sampling = loc[:1] == ["sampling_params"] and (len(loc) == 2 or len(loc) == 3 and loc[1].isdigit())
        hint = NATIVE_SAMPLING_HINTS.get(loc[-1]) if in_sampling else None  # one object, or a batch's list
        lead = f"{param}: " if param else ""  # an empty key's path is empty
        return f"{lead}unknown key {loc[-1]!r} in {where}" + (f"; {hint}" if hint else ""), param
    if e.get("type") == "none_required":  # a field declared only to be refused unless null
        return f"{param}: not supported by this server (send null or leave it out)", param
    if e.get("type") == "union_tag_invalid":  # a block / part / item / tool type not served (an image, web search)
        ctx = e.get("ctx") or {}
        tag = str(ctx.get("tag"))
        media = any(k in tag for k in _MEDIA)
        return (
            f"{param}: type {tag!r} is not supported by this server{': this model takes text only' * media} "
            f"(supported types: {ctx.get('expected_tags')})"
        ), param
    if e.get("type") == "literal_error" and loc and loc[-1] == "type" and isinstance(e.get("input"), str):
        # a block / part type not served where only one is (an image inside a tool_result)
        tag = e["input"]
        media = any(k in tag for k in _MEDIA)
        return (
            f"{param}: type {tag!r} is not supported by this server{': this model takes text only' * media} "
            f"(supported types: {(e.get('ctx') or {}).get('expected')})"
        ), param
    msg = e.get("msg", "invalid value")
    return (f"{param}: {msg}" if param else msg), param


def unparsable_body(cause: BaseException) -> str:
    """Why a body the JSON decoder raised `cause` for cannot be read (FastAPI's own message
    says only "There was an error parsing the body")."""
    if isinstance(cause, UnicodeDecodeError):
        return f"request body is not valid JSON: it is not UTF-8 ({cause.reason} at byte {cause.start})"
    if isinstance(cause, RecursionError):
        return "request body is not valid JSON: it nests too deeply to be read"
    if isinstance(cause, ValueError) and "integer string conversion" in str(cause):  # Python's own limit
        return f"request body cannot be read: it has an integer of more than {sys.get_int_max_str_digits()} digits"
    return f"request body is not valid JSON: {type(cause).__name__}"


HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
"""The methods an ``Allow`` header can name, in the order it names them."""


def allowed_methods(request: Request) -> str:
    """The methods some route of `request`'s app takes at its path, as an ``Allow`` header
    (``"GET, POST"``): each of `HTTP_METHODS` tried against every route. Starlette's 405
    names the first matching route's methods alone, and a path served one route per method
    (`route_methods`) has several."""
    routes = request.app.router.routes
    return ", ".join(
        m
        for m in HTTP_METHODS
        if any(route.matches({**request.scope, "method": m})[0] == Match.FULL for route in routes)
    )


def install_handlers(app: FastAPI, log_text: bool = False) -> None:
    """Map validation errors, `APIError`, HTTP errors and anything unexpected to JSON bodies.

    An unexpected exception is logged by type and the line that raised it; its message, which
    may quote the request (a UnicodeError holds the text), only when `log_text`
    (``--log-requests``)."""

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = validation_message(exc, request.headers.get("content-type", ""))
        return error_response(message, 400, param)

    @app.exception_handler(APIError)
    async def _api(request: Request, exc: APIError) -> JSONResponse:
        return error_for(request.scope, exc)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        at = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}" if tb is not None else None
        structlog.get_logger().error(
            "unhandled error in a request",
            error=type(exc).__name__,
            at=at,
            **({"message": repr(exc)} if log_text else {}),
        )
        return error_for(request.scope, APIError(f"internal error: {type(exc).__name__}", 500))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = str(exc.detail)
        if exc.status_code == 400 and exc.__cause__ is not None:  # FastAPI could not decode the body
            message = unparsable_body(exc.__cause__)
        elif exc.status_code == 404 and message == "Not Found":  # the router's: no route has the path
            message = f"no route serves {request.url.path}: GET /openapi.json lists this server's routes"
        elif exc.status_code == 405 and exc.headers and "Allow" in exc.headers:  # the router's
            allow = allowed_methods(request)
            exc.headers["Allow"] = allow
            message = f"{request.url.path} does not take {request.method}: it takes {allow}"
        return error_for(request.scope, APIError(message, exc.status_code, headers=exc.headers))
