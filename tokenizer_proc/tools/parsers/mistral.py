"""Mistral tool calls: ``[TOOL_CALLS]`` followed by a JSON list of ``{"name", "arguments"}``
objects (tokenizers v2-v7; an ``"id"`` after the arguments is skipped), or, from v11
(Mistral Small 3.2, Magistral, Devstral), ``[TOOL_CALLS]name[ARGS]{...}`` once per call."""

from __future__ import annotations

import json

from tokenizer_proc.tools.parsers.base import JSON_HEADER, ToolParser


class MistralParser(ToolParser):
    """Text before ``[TOOL_CALLS]`` is content; the list after it holds the calls, or each
    ``[TOOL_CALLS]`` one call in the v11 form (a new section per call)."""

    OPEN = ("[TOOL_CALLS]",)
    FIRST = r"\s*(?:\[\s*)?"
    HEADER = rf"(?:{JSON_HEADER}|\s*(?P<name>[\w.\-]+)\[ARGS\]\s*\{{)"
    NEXT = r"\s*,\s*"
    CLOSE = r"\s*\]"
    SPECIAL_MARKERS = ("[TOOL_CALLS]", "[ARGS]")
    ARGUMENTS_KEY = "arguments"
    TRIGGER = "[TOOL_CALLS]"
    GRAMMAR = ("[TOOL_CALLS][", ", ", "]")

    @staticmethod
    def describe(tools: list[dict]) -> str:
        """System-prompt text for a template without tool support (see `HermesParser.describe`)."""
        listed = json.dumps(tools, ensure_ascii=False)
        return (
            f"[AVAILABLE_TOOLS]{listed}[/AVAILABLE_TOOLS]\nTo call functions, write [TOOL_CALLS] and then a "
            'JSON list of {"name": <function-name>, "arguments": <arguments-as-a-json-object>} objects.'
        )
