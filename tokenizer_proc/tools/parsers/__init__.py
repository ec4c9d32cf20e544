"""Tool-call output parsers by model family, chosen with ``--tool-call-parser``.

Public interface (also used by the Anthropic and Responses front ends):

- `parser_class(name)`: the `ToolParser` subclass for a family name (`PARSERS`);
- `detect(chat_template)`: the family a chat template writes, or None;
- `ToolParser` (per choice: ``feed(text) -> ParsedDelta``, ``finish() -> ParsedDelta``,
  ``calls``, ``complete``), `parse_text`, `ParsedDelta`, `CallDelta`, `ToolCall`;
- each family's ``describe(tools)`` (a system prompt for templates without tools),
  ``GRAMMAR`` (the markup around forced calls, see `tokenizer_proc.tools.grammar`) and
  ``ARGUMENTS_KEY``.
"""

from __future__ import annotations

from tokenizer_proc.tools.parsers.base import (
    CallDelta,
    ParsedDelta,
    ToolCall,
    ToolParser,
    is_call_object,
    new_call_id,
    parse_text,
)
from tokenizer_proc.tools.parsers.hermes import HermesParser
from tokenizer_proc.tools.parsers.llama3_json import Llama3JsonParser
from tokenizer_proc.tools.parsers.mistral import MistralParser

PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesParser,
    "qwen": HermesParser,
    "qwen25": HermesParser,
    "qwen3": HermesParser,
    "llama3_json": Llama3JsonParser,
    "llama4_json": Llama3JsonParser,
    "mistral": MistralParser,
}
"""Family name (vLLM's names, plus aliases) -> parser class."""

AUTO = "auto"
"""``--tool-call-parser auto``: detect from the chat template (`detect`), else `FALLBACK`."""
FALLBACK = "hermes"
"""The family used when the template shows none: its ``describe`` puts the tools in the
system prompt. SmolLM2, the default model, was tuned on ``<tool_call>`` blocks."""

_SIGNS = (
    ("<tool_call>", "hermes"),
    ("[TOOL_CALLS]", "mistral"),
    ("<|python_tag|>", "llama3_json"),
    ('"parameters"', "llama3_json"),
)
"""Markup seen in a chat template's source -> the family that writes it (first hit wins)."""


def detect(chat_template: str | None) -> str | None:
    """The tool-call family a chat template's source shows, or None when it shows none."""
    for sign, name in _SIGNS:
        if chat_template and sign in chat_template:
            return name
    return None


def resolve(name: str, chat_template: str | None) -> type[ToolParser] | None:
    """The parser class of ``--tool-call-parser`` `name`: ``none`` -> None, ``auto`` -> the
    family `detect` finds in `chat_template`, else `FALLBACK`. Raises `KeyError` for an
    unknown name."""
    if name == "none":
        return None
    if name == AUTO:
        return PARSERS[detect(chat_template) or FALLBACK]
    return parser_class(name)


def parser_class(name: str) -> type[ToolParser]:
    """The parser class of family `name`. Raises `KeyError` naming the known families."""
    try:
        return PARSERS[name]
    except KeyError:
        raise KeyError(f"unknown tool-call parser {name!r}; known: {', '.join(sorted(PARSERS))}") from None


__all__ = [
    "AUTO",
    "FALLBACK",
    "PARSERS",
    "CallDelta",
    "ParsedDelta",
    "ToolCall",
    "ToolParser",
    "detect",
    "is_call_object",
    "new_call_id",
    "parse_text",
    "parser_class",
    "resolve",
]
