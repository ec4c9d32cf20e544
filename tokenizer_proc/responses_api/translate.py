"""Responses requests as chat completions requests.

``instructions`` becomes a system message first, then the stored conversation of
``previous_response_id`` (see `store`), then this request's input items as chat messages
(text parts joined; ``developer`` is the chat path's name too). ``text.format`` becomes
``response_format``. `RequestBuilder.chat` checks, renders and tokenizes the result like any
chat request; its errors are renamed to the Responses field (`FIELD_NAMES`). Function
tools and function_call / function_call_output items are a 400 until this server parses
tool calls.
"""

from __future__ import annotations

from typing import Any

from tokenizer_proc.api_models import ChatCompletionRequest
from tokenizer_proc.chat_translate import build_chat, chat_request
from tokenizer_proc.errors import APIError
from tokenizer_proc.request_builder import Built, RequestBuilder
from tokenizer_proc.responses_api.models import ResponsesRequest, TextFormat

FIELD_NAMES = {"max_tokens": "max_output_tokens", "response_format": "text.format", "messages": "input",
               "prompt": "input"}
"""Chat request field -> the Responses field it came from (for error messages)."""

NO_TOOLS = "function tools are not supported by this server yet (it does not parse tool calls)"


def conversation(req: ResponsesRequest) -> list[dict[str, str]]:
    """This request's input as chat messages (without instructions or earlier responses).
    Raises `APIError` 400 for function_call items and their outputs."""
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}]
    out = []
    for i, item in enumerate(req.input):
        if item.type != "message":
            raise APIError(f"input.{i}: {item.type} items need tools: {NO_TOOLS}", 400, f"input.{i}")
        text = item.content if isinstance(item.content, str) else "".join(p.text for p in item.content)
        out.append({"role": item.role, "content": text})
    return out


def _response_format(fmt: TextFormat | None) -> dict | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema_ is None or fmt.name is None:
        raise APIError("text.format: a json_schema format needs name and schema", 400, "text.format")
    return {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict}}


def _check_tools(req: ResponsesRequest) -> None:
    if req.tools:
        raise APIError(f"tools: {NO_TOOLS}", 400, "tools")
    if req.tool_choice not in (None, "none", "auto"):
        raise APIError(f"tool_choice {req.tool_choice!r} needs tools: {NO_TOOLS}", 400, "tool_choice")


def to_chat(req: ResponsesRequest, earlier: list[dict[str, str]]) -> ChatCompletionRequest:
    """The chat completions request for `req` after the `earlier` conversation (chat
    messages of the previous responses). Raises `APIError` 400."""
    _check_tools(req)
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + earlier
    body: dict[str, Any] = {"model": req.model, "messages": messages + conversation(req),
                            "max_tokens": req.max_output_tokens, "temperature": req.temperature, "top_p": req.top_p,
                            "response_format": _response_format(req.text.format if req.text else None)}
    return chat_request(body, FIELD_NAMES)


def build(builder: RequestBuilder, req: ResponsesRequest, earlier: list[dict[str, str]]) -> Built:
    """`req` checked, rendered and tokenized by the chat path; errors name the Responses fields."""
    return build_chat(builder, to_chat(req, earlier), FIELD_NAMES)
