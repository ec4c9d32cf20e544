"""Anthropic requests as chat completions requests, and the chat path's outcome as Anthropic
stop reasons.

A messages request becomes a `ChatCompletionRequest` (system first, then the turns, text
blocks joined), which `RequestBuilder.chat` checks, renders and tokenizes like any chat
request; its errors are renamed to the Anthropic field (`FIELD_NAMES`). Tools, tool_use /
tool_result blocks and enabled ``thinking`` are a 400 until this server parses tool calls
and reasoning.
"""

from __future__ import annotations

from typing import Any

from protocol.enums import FinishReason
from tokenizer_proc.anthropic.models import CountTokensRequest, MessagesRequest, TextBlock
from tokenizer_proc.api_models import ChatCompletionRequest
from tokenizer_proc.chat_translate import build_chat, chat_request
from tokenizer_proc.errors import APIError
from tokenizer_proc.request_builder import Built, RequestBuilder

FIELD_NAMES = {"stop": "stop_sequences", "response_format": "output_config.format",
               "max_completion_tokens": "max_tokens", "prompt": "messages"}
"""Chat request field -> the Anthropic field it came from (for error messages)."""

NO_TOOLS = "tool use is not supported by this server yet (it does not parse tool calls)"
NO_THINKING = "extended thinking is not supported: this server has no reasoning parser"


def _text(blocks: str | list[TextBlock]) -> str:
    return blocks if isinstance(blocks, str) else "".join(b.text for b in blocks)


def _check_features(req: CountTokensRequest) -> None:
    """Raise a 400 naming the field for tools, tool blocks or thinking, which are not served."""
    if req.tools:
        raise APIError(f"tools: {NO_TOOLS}", 400, "tools")
    if req.tool_choice is not None and req.tool_choice.type not in ("auto", "none"):
        raise APIError(f"tool_choice {req.tool_choice.type!r} needs tools: {NO_TOOLS}", 400, "tool_choice")
    if req.thinking is not None and req.thinking.type != "disabled":
        raise APIError(f"thinking: {NO_THINKING}; send {{\"type\": \"disabled\"}} or leave it out", 400, "thinking")
    for i, m in enumerate(req.messages):
        for j, block in enumerate([] if isinstance(m.content, str) else m.content):
            if block.type != "text":
                raise APIError(f"messages.{i}.content.{j}: {block.type} blocks need tools: {NO_TOOLS}", 400,
                               f"messages.{i}.content.{j}")


def to_chat(req: CountTokensRequest) -> ChatCompletionRequest:
    """The chat completions request that `req` asks for. Raises `APIError` 400."""
    _check_features(req)
    messages = [{"role": "system", "content": _text(req.system)}] if req.system else []
    messages += [{"role": m.role, "content": _text(m.content)} for m in req.messages]
    body: dict[str, Any] = {"model": req.model, "messages": messages}
    if req.output_config is not None and req.output_config.format is not None:
        schema = req.output_config.format.schema_
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    if isinstance(req, MessagesRequest):
        body.update(max_tokens=req.max_tokens, stop=req.stop_sequences, temperature=req.temperature,
                    top_p=req.top_p, top_k=req.top_k)
    return chat_request(body, FIELD_NAMES)


def build(builder: RequestBuilder, req: CountTokensRequest) -> Built:
    """`req` checked, rendered and tokenized by the chat path; errors name Anthropic's fields."""
    return build_chat(builder, to_chat(req), FIELD_NAMES)


def stop_reason(reason: FinishReason, matched: str | int | None) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished request: max_tokens when cut by the token
    budget, stop_sequence with the matched string, else end_turn (the model's end token).
    Raises `APIError` 500 for an aborted request (the server ended it)."""
    if reason == FinishReason.LENGTH:
        return "max_tokens", None
    if reason == FinishReason.STOP:
        return ("stop_sequence", matched) if isinstance(matched, str) else ("end_turn", None)
    raise APIError("the request was aborted by the server", 500)
