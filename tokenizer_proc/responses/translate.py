"""Responses requests as chat completions requests.

``instructions`` becomes a system message first, then the stored conversation of
``previous_response_id`` (see `store`), then this request's input items as chat messages
(`openai.chat_translate`): message items with their text parts joined (an assistant's refusal
parts are its words, as chat reads them; ``developer`` is the chat path's name too),
``function_call`` items as the ``tool_calls`` of an assistant message (consecutive calls in
one), ``function_call_output`` items as ``tool`` messages; reasoning items are left out.
Function ``tools`` and ``tool_choice`` pass to the chat path, which parses calls
(``--tool-call-parser``) and enforces ``required`` / a named function with a grammar;
``text.format`` becomes ``response_format``. Errors name the Responses field
(`FIELD_NAMES`). The request runs under the response's id (`ID_PREFIX`).
"""

from __future__ import annotations

import json
from typing import Any

from tokenizer_proc.errors import APIError
from tokenizer_proc.openai.chat_translate import build_as_chat, chat_request
from tokenizer_proc.openai.models import ChatCompletionRequest
from tokenizer_proc.request.builder import Built, RequestBuilder
from tokenizer_proc.request.chat_template import part_key
from tokenizer_proc.request.route_run import Outcome
from tokenizer_proc.request.unsupported import RESPONSES, refuse_unsupported
from tokenizer_proc.responses.models import MessageItem, ResponsesRequest, TextFormat
from tokenizer_proc.tools.pairs import CallLedger

ID_PREFIX = "resp_"
"""A response's id, and so its request's id (`request.builder.new_rid`), starts with it."""
FIELD_NAMES = {
    "max_tokens": "max_output_tokens",
    "response_format": "text.format",
    "messages": "input",
    "response_format.json_schema.schema": "text.format.schema",
    "prompt": "input",
    "tools.*.function": "tools.*",
}
"""Chat request field -> the Responses field it came from (for error messages)."""


def conversation(req: ResponsesRequest, earlier: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """This request's input as chat messages (without instructions or the `earlier`
    conversation, whose calls name the functions its ``function_call_output`` items answer).
    Raises `APIError` 400 naming the item where calls and outputs do not pair up (`tools.pairs`):
    an output must answer a call made before it (in the input, or the last response of
    `earlier`), and each call needs its output before the next message of a role other than
    the assistant."""
    ledger = CallLedger("function_call_output")
    for c in (earlier[-1].get("tool_calls") or ()) if earlier else ():  # the previous response's calls
        ledger.call(c["id"], "previous_response_id")
    if isinstance(req.input, str):
        ledger.turn("input", False)
        return [{"role": "user", "content": req.input}]
    out: list[dict[str, Any]] = []
    names = {c["id"]: c["function"]["name"] for m in earlier or () for c in m.get("tool_calls") or ()}
    for i, item in enumerate(req.input):
        if item.type == "message":
            ledger.turn(f"input.{i}", item.role == "assistant")
            out.append({"role": item.role, "content": _message_text(i, item)})
        elif item.type == "function_call":
            ledger.call(item.call_id, f"input.{i}")
            names[item.call_id] = item.name
            call = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": item.arguments},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            elif last is not None and last["role"] == "assistant":
                last["tool_calls"] = [call]
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif item.type == "function_call_output":
            ledger.result(item.call_id, f"input.{i}.call_id")
            output = item.output if isinstance(item.output, str) else "".join(p.text for p in item.output)
            out.append(
                {"role": "tool", "tool_call_id": item.call_id, "name": names.get(item.call_id), "content": output}
            )
    last = req.input[-1] if req.input else None
    ledger.end(
        getattr(last, "type", None) in ("function_call", "reasoning") or getattr(last, "role", None) == "assistant"
    )
    return out


def _message_text(i: int, item: MessageItem) -> str:
    """The text of message item `i`: its parts' texts joined, an assistant's refusal parts
    being its words (chat's rule, `chat_template.part_key`). Raises `APIError` 400 naming the
    part for a refusal part in a message of another role."""
    if isinstance(item.content, str):
        return item.content
    texts = []
    for j, part in enumerate(item.content):
        key = part_key("refusal" if part.type == "refusal" else "text", item.role)
        if key is None:
            param = f"input.{i}.content.{j}"
            raise APIError(
                f"{param}: a refusal part is what an assistant wrote; it belongs in an assistant "
                f"message, not a {item.role} one",
                400,
                param,
            )
        texts.append(getattr(part, key))
    return "".join(texts)


def assistant_message(o: Outcome) -> dict[str, Any]:
    """A finished response's output as the assistant chat message a later response sees:
    its text and its tool calls (arguments re-encoded; a cut call's finished members, `Block.call_input`); reasoning is left out."""
    calls = [
        {
            "id": b.call_id,
            "type": "function",
            "function": {"name": b.name, "arguments": json.dumps(b.call_input(), ensure_ascii=False)},
        }
        for b in o.blocks
        if b.kind == "call"
    ]
    return {"role": "assistant", "content": o.text or None, **({"tool_calls": calls} if calls else {})}


def _response_format(fmt: TextFormat | None) -> dict | None:
    """``text.format`` as a chat ``response_format``. Raises `APIError` 400 naming the field
    for a json_schema format without name or schema, or a text / json_object format given
    json_schema's fields (a schema there would otherwise be ignored: free JSON)."""
    if fmt is not None and fmt.type != "json_schema":
        extra = sorted(f for f in fmt.model_fields_set - {"type"} if getattr(fmt, f) is not None)
        if extra:
            name = "schema" if extra[0] == "schema_" else extra[0]
            raise APIError(
                f"text.format.{name} is only for a json_schema format, not {fmt.type}", 400, f"text.format.{name}"
            )
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "json_object"}
    if fmt.schema_ is None or fmt.name is None:
        raise APIError("text.format: a json_schema format needs name and schema", 400, "text.format")
    return {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict}}


def _tools(req: ResponsesRequest, body: dict[str, Any]) -> None:
    """Put `req`'s function tools, tool_choice and parallel_tool_calls into the chat `body`.
    A function's ``strict`` defaults to true, as in OpenAI's Responses API (chat completions
    default it to false): its arguments are enforced (`tools.grammar.auto_calls`)."""
    if req.tools:
        body["tools"] = [
            {"type": "function", "function": {"strict": True, **t.model_dump(exclude={"type"}, exclude_none=True)}}
            for t in req.tools
        ]
    choice = req.tool_choice
    if choice is not None:
        body["tool_choice"] = (
            choice if isinstance(choice, str) else {"type": "function", "function": {"name": choice.name}}
        )
    if req.parallel_tool_calls is not None:
        body["parallel_tool_calls"] = req.parallel_tool_calls


def to_chat(req: ResponsesRequest, earlier: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat completions request for `req` after the `earlier` conversation (chat
    messages of the previous responses). Raises `APIError` 400, also for a chat field that
    the Responses API does not have (`unsupported.RESPONSES`)."""
    refuse_unsupported(req.model_extra, RESPONSES)
    messages = ([{"role": "system", "content": req.instructions}] if req.instructions else []) + earlier
    body: dict[str, Any] = {
        "model": req.model,
        "messages": messages + conversation(req, earlier),
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "response_format": _response_format(req.text.format if req.text else None),
        "thinking_token_budget": req.thinking_token_budget,
        "cache_salt": req.cache_salt,
    }
    _tools(req, body)
    return chat_request(body, FIELD_NAMES)


def build(builder: RequestBuilder, req: ResponsesRequest, earlier: list[dict[str, Any]]) -> Built:
    """`req` checked, rendered and tokenized by the chat path, its request id the response's id
    (``resp_...``); errors name the Responses fields."""
    return build_as_chat(builder, to_chat(req, earlier), FIELD_NAMES, ID_PREFIX)
