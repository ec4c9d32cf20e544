"""Rendering a chat request through the model's chat template (transformers'
``apply_chat_template``), with the edge cases clients send:

- content as a list of parts: text parts are joined; any other part (image_url,
  input_audio, file) is a 400 saying the model takes text only; an assistant's refusal (its
  ``refusal`` field or refusal parts) is text it wrote;
- the ``developer`` role is OpenAI's new name for ``system``; system messages at the start
  are merged into one (templates read the system prompt from the first message only);
- tools: given to the template (``tools=``) when its source uses them; otherwise the
  parser family describes them in the system prompt (`ToolParser.describe`);
- assistant turns with ``tool_calls`` (content may be null): the template gets the calls
  with their arguments decoded to objects (templates write them with ``tojson``); a
  template that knows no tool calls gets them written in the family's markup as content;
  ``tool`` messages keep their ``tool_call_id`` and ``name``, and each answers a call of
  the assistant turn before it, each call being answered before the next turn of another
  role (`tools.pairs`);
- prefill: ``continue_final_message`` continues the last (assistant) message in place,
  ``add_generation_prompt: false`` leaves out the assistant header (vLLM's names);
- ``chat_template_kwargs`` reach the template as variables (e.g. ``enable_thinking``).

Every problem is an `APIError` 400 naming the field.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from tokenizer_proc.errors import APIError
from tokenizer_proc.output.json_prefix import prefix_object
from tokenizer_proc.tools.pairs import CallLedger
from tokenizer_proc.tools.parsers import ToolParser

RESERVED_KWARGS = frozenset({"messages", "conversation"})
"""Keys ``chat_template_kwargs`` may not set, besides apply_chat_template's own parameters
(those are request fields or rendering options: `ChatTemplate.reserved`)."""


def part_key(kind: Any, role: str) -> str | None:
    """The key that holds the text of a content part of type `kind` (``text`` or
    ``refusal``, in chat's names) in a `role` message: a text part's ``text``, and in an
    assistant message a refusal part's ``refusal`` (the words it wrote, as vLLM reads them;
    the Responses API's assistant items take the same rule). None: not a part this model
    reads as text here."""
    return kind if kind == "text" or (kind == "refusal" and role == "assistant") else None


def _text(i: int, role: str, content: Any, refusal: str | None) -> str:
    """A message's content as text, followed by its `refusal` (an assistant's words, as
    OpenAI's answers carry them). A list of parts must hold text parts only, and in an
    assistant message refusal parts (their ``refusal`` is text too, as vLLM reads them)."""
    if refusal is not None and role != "assistant":
        raise APIError(f"messages.{i}.refusal: only assistant messages carry a refusal", 400, f"messages.{i}.refusal")
    if content is None or isinstance(content, str):
        texts = [content or ""]
    else:
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type")
            key = part_key(kind, role)
            if key is None:
                what = f"a part of type {kind!r}" if isinstance(kind, str) else "a part without a text type"
                raise APIError(
                    f"messages.{i}.content.{j} is {what}: this model takes text only (text parts)",
                    400,
                    f"messages.{i}.content.{j}",
                )
            if not isinstance(part.get(key), str):
                param = f"messages.{i}.content.{j}.{key}"
                raise APIError(f"{param}: a {kind} part needs its {key} as a string", 400, param)
            texts.append(part[key])
    if refusal:  # "" (a client that sends every field) adds nothing, not a newline
        texts = [t for t in texts if t] + [refusal]
    return "\n".join(texts)


def decode_arguments(text: str) -> dict:
    """An earlier call's arguments (JSON text of an object) decoded; the beginning of an
    object (a call this server answered cut by the token limit, sent back as it came, or
    ``""``) gives its finished members, as the Anthropic route's ``input`` of such a call.
    Raises ValueError saying why they are neither ("is not valid JSON", ...)."""
    try:
        value = json.loads(text)
    except ValueError:
        value, whole = prefix_object(text)
        if not whole:
            raise ValueError("is not valid JSON") from None
    except RecursionError:
        raise ValueError("nests too deeply to be read") from None
    if not isinstance(value, dict):
        raise ValueError("is not a JSON object (a call's arguments are an object)")
    return value


def _arguments(i: int, j: int, text: str) -> dict:
    """An earlier call's arguments decoded for the template; `APIError` 400 naming them."""
    param = f"messages.{i}.tool_calls.{j}.function.arguments"
    try:
        return decode_arguments(text)
    except ValueError as e:
        raise APIError(f"{param} {e}", 400, param) from None


def written_calls(parser: type[ToolParser], calls: list[dict]) -> str:
    """`calls` (OpenAI tool_calls with decoded arguments) as the family writes them."""
    before, between, after = parser.GRAMMAR
    objs = [
        json.dumps(
            {"name": c["function"]["name"], parser.ARGUMENTS_KEY: c["function"]["arguments"]}, ensure_ascii=False
        )
        for c in calls
    ]
    return before + between.join(objs) + after


class ChatTemplate:
    """The chat template of `tokenizer` (a transformers tokenizer), and what its source
    shows it supports (tools, tool calls)."""

    def __init__(self, tokenizer) -> None:
        self.tok = tokenizer
        source = tokenizer.chat_template
        source = json.dumps(source) if isinstance(source, dict) else source or ""
        self.source = source
        self.takes_tools = "tools" in source
        self.takes_tool_calls = "tool_calls" in source
        params = inspect.signature(tokenizer.apply_chat_template).parameters
        self.reserved = RESERVED_KWARGS | {name for name, p in params.items() if p.kind != p.VAR_KEYWORD}

    def messages(self, messages: list, parser: type[ToolParser] | None, tools: list[dict] | None) -> list[dict]:
        """Request messages (`openai.models.ChatMessage`) as the template's dicts (see the
        module docstring). parser: the server's tool-call family, which writes earlier turns'
        calls (whether or not this request shows tools) and describes `tools` (None: the
        parser is off)."""
        out: list[dict] = []
        ledger = CallLedger("tool message")
        for i, m in enumerate(messages):
            role = "system" if m.role == "developer" else m.role
            if m.content is None and role != "assistant":  # OpenAI: only an assistant turn may omit it
                raise APIError(
                    f"messages.{i}.content: a {m.role} message needs content (text or text parts)",
                    400,
                    f"messages.{i}.content",
                )
            if m.content == []:  # OpenAI: an array of at least one part
                raise APIError(
                    f"messages.{i}.content: an empty list of parts; send at least one part, or a string",
                    400,
                    f"messages.{i}.content",
                )
            msg: dict[str, Any] = {"role": role, "content": _text(i, role, m.content, m.refusal)}
            if m.name is not None:
                msg["name"] = m.name
            if getattr(m, "tool_call_id", None) is not None:
                msg["tool_call_id"] = m.tool_call_id
            elif role == "tool":
                raise APIError(
                    f"messages.{i}: a tool message needs tool_call_id (the id of the call it answers)",
                    400,
                    f"messages.{i}.tool_call_id",
                )
            if role == "tool":
                ledger.result(m.tool_call_id, f"messages.{i}.tool_call_id")
            else:
                ledger.turn(f"messages.{i}", role == "assistant")
            calls = getattr(m, "tool_calls", None)
            if calls:
                if role != "assistant":
                    raise APIError(
                        f"messages.{i}.tool_calls: only assistant messages make tool calls",
                        400,
                        f"messages.{i}.tool_calls",
                    )
                dicts = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": _arguments(i, j, c.function.arguments)},
                    }
                    for j, c in enumerate(calls)
                ]
                for j, c in enumerate(calls):
                    ledger.call(c.id, f"messages.{i}.tool_calls.{j}")
                if self.takes_tool_calls or parser is None:
                    msg["tool_calls"] = dicts
                else:
                    msg["content"] = (msg["content"] + "\n" if msg["content"] else "") + written_calls(parser, dicts)
            if role == "system" and out and all(o["role"] == "system" for o in out):
                out[-1]["content"] += "\n\n" + msg["content"]
                continue
            out.append(msg)
        ledger.end(messages[-1].role == "assistant")
        if tools and not self.takes_tools and parser is not None:
            described = parser.describe(tools)
            if out and out[0]["role"] == "system":
                out[0]["content"] = described + "\n\n" + out[0]["content"]
            else:
                out.insert(0, {"role": "system", "content": described})
        return out

    def render(
        self,
        messages: list,
        *,
        parser: type[ToolParser] | None = None,
        tools: list[dict] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text. parser: the server's tool-call family (`messages`); tools: the
        tools shown to the model (None: none). Raises `APIError` 400 for bad messages or
        kwargs, a prefill that does not end with an assistant message, or a template that
        rejects the conversation."""
        if continue_final_message and messages[-1].role != "assistant":
            raise APIError(
                "continue_final_message needs the last message to be the assistant's", 400, "continue_final_message"
            )
        bad = sorted(self.reserved & set(kwargs or {}))
        if bad:
            raise APIError(
                f"chat_template_kwargs may not set {bad[0]}: it is a request field", 400, "chat_template_kwargs"
            )
        dicts = self.messages(messages, parser, tools)
        try:
            return self.tok.apply_chat_template(
                dicts,
                tools=tools if self.takes_tools else None,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                **(kwargs or {}),
            )
        except RecursionError:  # a value nested hundreds of levels deep, walked recursively by jinja
            raise APIError(
                "the chat template cannot render this request: a value in it is nested too deeply "
                "(chat_template_kwargs, tool parameters or message content)",
                400,
                "chat_template_kwargs" if kwargs else "messages",
            ) from None
        except Exception as e:  # jinja raises TemplateError and friends for odd conversations
            raise APIError(f"the chat template rejected these messages: {e}", 400, "messages") from None
