"""Running another API's request on the chat path: a chat completions body built by the
other API's translation is validated as a `ChatCompletionRequest` and built by
`convert.build_chat`, with every error's field renamed to the field of the API the client
used (``names``: chat field path -> that API's field path, see `_renamed`)."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from tokenizer_proc.errors import APIError, field_error
from tokenizer_proc.openai.convert import build_chat
from tokenizer_proc.openai.models import ChatCompletionRequest
from tokenizer_proc.request.builder import Built, RequestBuilder


def _renamed(param: str, names: dict[str, str]) -> str:
    """`param` with its longest prefix found in `names` replaced; in the keys and values a
    ``*`` stands for an index, which the replacement keeps (``tools.*.function`` ->
    ``tools.*`` renames ``tools.2.function.name`` to ``tools.2.name``)."""
    parts = param.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join("*" if p.isdigit() else p for p in parts[:n])
        if key in names:
            indexes = iter(p for p in parts[:n] if p.isdigit())
            head = [next(indexes) if p == "*" else p for p in names[key].split(".")]
            return ".".join(head + parts[n:])
    return param


def _renamed_error(e: APIError, names: dict[str, str]) -> APIError:
    """`e` with its param, and the start of its message that names it (the param or a path
    below it, renamed on its own: ``response_format.json_schema.schema`` may have a name of
    its own), renamed (in place)."""
    if e.param:
        name = _renamed(e.param, names)
        if e.message.startswith(e.param):
            path = re.match(r"[\w.]*", e.message).group(0).rstrip(".")
            e.message = _renamed(path, names) + e.message[len(path) :]
        e.param = name
    return e


def chat_request(body: dict[str, Any], names: dict[str, str]) -> ChatCompletionRequest:
    """`body` validated as a chat completions request. Raises `APIError` 400 naming the field."""
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        message, param = field_error(e.errors()[0], body)
        raise _renamed_error(APIError(message, 400, param), names) from None


def build_as_chat(
    builder: RequestBuilder, chat: ChatCompletionRequest, names: dict[str, str], rid_prefix: str
) -> Built:
    """`chat` checked, rendered and tokenized by `convert.build_chat` as a request whose id
    starts with `rid_prefix` (the other API's id prefix, so the logs show the id its client
    sees), the names of its fields for the scheduler's errors (`Built.fields`) renamed.
    Raises its `APIError`s with the param (and a message that starts with it) renamed."""
    try:
        built = build_chat(builder, chat, rid_prefix)
    except APIError as e:
        raise _renamed_error(e, names) from None
    return replace(
        built, fields=tuple({field: _renamed(name, names) for field, name in choice.items()} for choice in built.fields)
    )
