"""Anthropic requests as chat completions requests, and the chat path's outcome as Anthropic
stop reasons.

A messages request becomes a `ChatCompletionRequest` (`openai.chat_translate`): ``system`` first,
then the turns (consecutive messages of one role combined into one turn, as Anthropic's API
combines them), text blocks joined. An assistant turn's ``tool_use`` blocks become its
``tool_calls`` (input as JSON arguments), text after them an assistant message of its own
after theirs (the prompt keeps the blocks' order); its thinking blocks are left out. A user
turn's ``tool_result`` blocks become ``tool`` messages (``tool_call_id``, the tool's name,
the result text, "Error: " first when ``is_error``), which must come before the turn's text.
Blocks in a turn of a role that may not hold them (`ROLES`: tool_use and thinking outside
assistant turns, tool_result outside user turns) are a 400. As in Anthropic's API, calls and
results pair up (`check_tool_pairs`): a tool_result answers a tool_use of the assistant turn
right before it, and every tool_use of an assistant turn that the user answers has its
tool_result in that answer. A last turn of the assistant's (without tool_use blocks) is a
prefill: the reply continues its text (``continue_final_message``), as Anthropic's API
continues it. ``tools`` become function tools (input_schema as parameters); ``tool_choice``
auto / any / tool / none becomes auto / required / the named function / none, and
``disable_parallel_tool_use`` ``parallel_tool_calls: false``: the chat path parses the calls
(``--tool-call-parser``) and enforces any / tool with a grammar.
``thinking`` needs a ``--reasoning-parser`` unless disabled (then the template gets
``enable_thinking: false``); an enabled one's ``budget_tokens`` becomes
``thinking_token_budget``, enforced by the scheduler (the block is closed for the model once
it has written that many tokens inside it).
Errors name the Anthropic field (`FIELD_NAMES`).
"""

from __future__ import annotations

import json
from typing import Any

from protocol.enums import FinishReason
from tokenizer_proc.anthropic.models import Block, CountTokensRequest, Message, MessagesRequest, TextBlock
from tokenizer_proc.errors import APIError
from tokenizer_proc.openai.chat_translate import build_as_chat, chat_request
from tokenizer_proc.openai.models import ChatCompletionRequest
from tokenizer_proc.request.builder import Built, RequestBuilder

ID_PREFIX = "msg_"
"""A message's id, and so its request's id (`request.builder.new_rid`), starts with it."""
FIELD_NAMES = {
    "stop": "stop_sequences",
    "response_format": "output_config.format",
    "response_format.json_schema.schema": "output_config.format.schema",
    "continue_final_message": "messages",
    "max_completion_tokens": "max_tokens",
    "prompt": "messages",
    "parallel_tool_calls": "tool_choice",
    "chat_template_kwargs": "thinking",
    "thinking_token_budget": "thinking.budget_tokens",
    "tools.*.function.parameters": "tools.*.input_schema",
    "tools.*.function": "tools.*",
}
"""Chat request field -> the Anthropic field it came from (for error messages)."""

NO_THINKING = "extended thinking needs a reasoning parser: start the server with --reasoning-parser"


def _text(blocks: str | list[TextBlock]) -> str:
    return blocks if isinstance(blocks, str) else "".join(b.text for b in blocks)


Turn = tuple[str, list[tuple[str, Block]]]
"""One turn of the conversation: its role and its blocks, each with its path in the request
(``messages.I.content.J``; ``messages.I.content`` for a string content, as one text block)."""


def turns(messages: list[Message]) -> list[Turn]:
    """The turns of `messages`: consecutive messages of one role combined into one turn (their
    blocks in order), as Anthropic's API combines them."""
    out: list[Turn] = []
    for i, m in enumerate(messages):
        blocks: list[tuple[str, Block]] = (
            [(f"messages.{i}.content", TextBlock(type="text", text=m.content))]
            if isinstance(m.content, str)
            else [(f"messages.{i}.content.{j}", b) for j, b in enumerate(m.content)]
        )
        if out and out[-1][0] == m.role:
            out[-1][1].extend(blocks)
        else:
            out.append((m.role, blocks))
    return out


def _message(path: str) -> str:
    """The message a block's path (``messages.I.content...``) is in: ``messages.I``."""
    return ".".join(path.split(".")[:2])


def check_tool_pairs(ts: list[Turn]) -> None:
    """Raise a 400 `APIError` where tool_use and tool_result blocks do not pair up as
    Anthropic's API requires: tool_use ids are unique in the request; each tool_result of a
    user turn names a tool_use of the assistant turn right before it, once; and each tool_use
    of an assistant turn followed by a user turn has its tool_result there. The message names
    the id and the messages at fault; param: the block's path. (Blocks in a turn of the wrong
    role are `_turn`'s to refuse; a last assistant turn's calls are left unanswered.)"""
    uses: dict[str, str] = {}  # every tool_use id -> its block's path
    pending: dict[str, str] = {}  # the tool_use ids of the assistant turn before -> their paths
    before = None  # that turn's last message (``messages.I``); None before the first one
    for role, blocks in ts:
        if role == "assistant":
            pending = {}
            if blocks:
                before = _message(blocks[-1][0])
            for path, b in blocks:
                if b.type == "tool_use":
                    if b.id in uses:
                        raise APIError(
                            f"{path}: tool_use id {b.id!r} is used twice (first at {uses[b.id]}); tool_use "
                            "ids must be unique",
                            400,
                            path,
                        )
                    uses[b.id] = pending[b.id] = path
            continue
        answered: dict[str, str] = {}
        for path, b in blocks:
            if b.type != "tool_result":
                continue
            used = b.tool_use_id
            if used in answered:
                raise APIError(
                    f"{path}: tool_use id {used!r} already has a tool_result block (at {answered[used]})", 400, path
                )
            if used not in pending:
                raise APIError(
                    f"{path}: tool_result block for tool_use id {used!r}, which is not a tool_use block of "
                    f"the assistant message right before it ({before or 'there is none'})",
                    400,
                    path,
                )
            answered[used] = path
        for used, path in pending.items():
            if used not in answered:
                raise APIError(
                    f"{path}: tool_use id {used!r} has no tool_result block in the user message after it "
                    f"({_message(blocks[0][0])}): each tool_use block needs a tool_result block, before "
                    "any text, in the next user message",
                    400,
                    path,
                )
        pending = {}


ROLES = {"tool_use": "assistant", "thinking": "assistant", "redacted_thinking": "assistant", "tool_result": "user"}
"""Block type -> the role whose messages alone may hold it (Anthropic's API refuses it elsewhere)."""


def _turn(turn: Turn, names: dict[str, str]) -> list[dict[str, Any]]:
    """Chat messages of one turn (see the module docstring), its blocks in order: text after
    an assistant's tool_use blocks is a message of its own after theirs (a chat message's
    content comes before its tool_calls). `names` maps the tool_use ids seen so far to their
    tool names. Raises `APIError` 400 naming the block for a block in a turn of a role that
    may not hold it (`ROLES`), a tool_result block after text (Anthropic's API requires tool
    results first; they would be reordered here)."""
    role, blocks = turn
    out: list[dict[str, Any]] = []
    text, calls = "", []
    for path, b in blocks:
        if ROLES.get(b.type, role) != role:
            raise APIError(f"{path}: {b.type} blocks can only be in {ROLES[b.type]} messages", 400, path)
        if b.type == "text":
            if calls:
                out.append({"role": "assistant", "content": text or None, "tool_calls": calls})
                text, calls = "", []
            text += b.text
        elif b.type == "tool_use":
            names[b.id] = b.name
            calls.append(
                {
                    "id": b.id,
                    "type": "function",
                    "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)},
                }
            )
        elif b.type == "tool_result":
            if text:
                raise APIError(f"{path}: tool_result blocks must come first in a user turn, before any text", 400, path)
            result = _text(b.content)
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": b.tool_use_id,
                    "name": names.get(b.tool_use_id),
                    "content": f"Error: {result}" if b.is_error else result,
                }
            )
    if calls:
        out.append({"role": "assistant", "content": text or None, "tool_calls": calls})
    elif text or not out:
        out.append({"role": role, "content": text})
    return out


def _tools(req: CountTokensRequest, body: dict[str, Any]) -> None:
    """Put `req`'s tools and tool_choice into the chat `body`; a tool's ``strict: true`` has
    its input enforced under ``auto`` too (`tools.grammar.auto_calls`)."""
    if req.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.input_schema,
                    "strict": t.strict,
                },
            }
            for t in req.tools
        ]
    choice = req.tool_choice
    if choice is None:
        return
    if choice.type == "tool":
        if not choice.name:
            raise APIError("tool_choice of type tool needs the tool's name", 400, "tool_choice")
        body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    else:
        body["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    if choice.disable_parallel_tool_use:
        body["parallel_tool_calls"] = False


NO_THREADS = {"error_code": "thread_unsupported_request", "unsupported": ["thread"]}
"""``error.details`` of a refused ``thread``: what the SDK's thread state reads to go on
without one (its tool runner then sends every turn whole)."""


def _empty_text(text: str) -> str | None:
    """Why Anthropic's API refuses `text` as a text block's text (empty, or whitespace only), or None."""
    if not text:
        return "text content blocks must be non-empty"
    return None if text.strip() else "text content blocks must contain non-whitespace text"


def check_nonempty(req: CountTokensRequest) -> None:
    """Raise a 400 `APIError` for a message with empty content (but the last, when it is the
    assistant's: an empty prefill, whose whitespace `to_chat` refuses), a message whose text
    is whitespace only, or a text block that is empty or whitespace only (in a message, a
    tool_result or ``system``), as Anthropic's API refuses them."""
    for j, b in enumerate(req.system if isinstance(req.system, list) else ()):
        if why := _empty_text(b.text):
            raise APIError(f"system.{j}: {why}", 400, f"system.{j}")
    messages = req.messages
    for i, m in enumerate(messages):
        prefill = i == len(messages) - 1 and m.role == "assistant"
        if not m.content and not prefill:
            raise APIError(
                f"messages.{i}: all messages must have non-empty content except for the optional "
                "final assistant message",
                400,
                f"messages.{i}",
            )
        if isinstance(m.content, str) and not prefill and (why := _empty_text(m.content)):
            raise APIError(f"messages.{i}.content: {why}", 400, f"messages.{i}.content")
        for j, b in enumerate(m.content if isinstance(m.content, list) else ()):
            inner = b.content if b.type == "tool_result" and isinstance(b.content, list) else [b]
            if why := next((w for t in inner if t.type == "text" and (w := _empty_text(t.text))), None):
                raise APIError(f"messages.{i}.content.{j}: {why}", 400, f"messages.{i}.content.{j}")


def refuse_thread(req: CountTokensRequest) -> None:
    """Raise a 400 `APIError` for a request asking for server-held conversation state
    (``thread``, beta), which this server does not keep, with `NO_THREADS` as its details."""
    if isinstance(req, MessagesRequest) and req.thread is not None:
        raise APIError(
            "thread: this server holds no conversation state; send the whole conversation in messages",
            400,
            "thread",
            details=NO_THREADS,
        )


def to_chat(req: CountTokensRequest, reasoning: bool) -> ChatCompletionRequest:
    """The chat completions request that `req` asks for; reasoning: the server splits out
    reasoning (``--reasoning-parser``). Raises `APIError` 400."""
    refuse_thread(req)
    check_nonempty(req)
    if req.thinking is not None and req.thinking.type != "disabled" and not reasoning:
        raise APIError(f'thinking: {NO_THINKING}; send {{"type": "disabled"}} or leave it out', 400, "thinking")
    if req.thinking is not None and req.thinking.type == "enabled" and req.thinking.budget_tokens is None:
        raise APIError("thinking of type enabled needs budget_tokens", 400, "thinking.budget_tokens")
    if (
        isinstance(req, MessagesRequest)
        and req.thinking is not None
        and req.thinking.type == "enabled"
        and req.thinking.budget_tokens >= req.max_tokens
    ):
        raise APIError(
            f"thinking.budget_tokens ({req.thinking.budget_tokens}) must be less than max_tokens ({req.max_tokens})",
            400,
            "thinking.budget_tokens",
        )
    messages = [{"role": "system", "content": _text(req.system)}] if req.system else []
    ts = turns(req.messages)
    check_tool_pairs(ts)
    names: dict[str, str] = {}
    for turn in ts:
        messages += _turn(turn, names)
    body: dict[str, Any] = {"model": req.model, "messages": messages}
    role, blocks = ts[-1]
    if role == "assistant" and not any(b.type == "tool_use" for _, b in blocks):
        prefill = messages[-1]["content"] or ""
        if prefill != prefill.rstrip():  # as Anthropic's API: the reply would start mid-whitespace
            raise APIError(
                "messages: final assistant content cannot end with trailing whitespace",
                400,
                f"messages.{len(req.messages) - 1}.content",
            )
        body["continue_final_message"] = True  # a prefill: the reply continues the assistant's text
    _tools(req, body)
    if req.thinking is not None and req.thinking.type == "disabled" and reasoning:
        body["chat_template_kwargs"] = {"enable_thinking": False}
    if req.thinking is not None and req.thinking.type == "enabled":
        body["thinking_token_budget"] = req.thinking.budget_tokens
    if req.output_config is not None and req.output_config.format is not None:
        schema = req.output_config.format.schema_
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
    if body.get("continue_final_message") and (
        body.get("response_format") or body.get("tool_choice") not in (None, "auto", "none")
    ):
        raise APIError(
            "messages: a final assistant message (a prefill) cannot be combined with output_config.format "
            "or a tool_choice of type any or tool: their grammar holds from the first generated token, so "
            "the reply would start over after the prefilled text instead of continuing it",
            400,
            f"messages.{len(req.messages) - 1}",
        )
    if isinstance(req, MessagesRequest):
        body.update(
            max_tokens=req.max_tokens,
            stop=req.stop_sequences,
            temperature=req.temperature,
            top_p=req.top_p,
            top_k=req.top_k,
            cache_salt=req.cache_salt,
        )
    return chat_request(body, FIELD_NAMES)


def build(builder: RequestBuilder, req: CountTokensRequest) -> Built:
    """`req` checked, rendered and tokenized by the chat path; errors name Anthropic's fields."""
    return build_as_chat(builder, to_chat(req, builder.reasoning_parser is not None), FIELD_NAMES, ID_PREFIX)


def stop_reason(reason: FinishReason, matched: str | int | None, tool_calls: bool = False) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a finished request: tool_use when it ended with
    complete tool calls, max_tokens when cut by the token budget, stop_sequence with the
    matched string, else end_turn (the model's end token). Raises `APIError` 500 for an
    aborted request (the server ended it)."""
    if reason == FinishReason.LENGTH:
        return "max_tokens", None
    if reason == FinishReason.STOP:
        if tool_calls:
            return "tool_use", None
        return ("stop_sequence", matched) if isinstance(matched, str) else ("end_turn", None)
    raise APIError("the request was aborted by the server", 500)
