"""Llama 3.x JSON tool calls: ``{"name": ..., "parameters": {...}}`` at the start of the
output (optionally after ``<|python_tag|>``), several separated by ``;``."""

from __future__ import annotations

import json

from tokenizer_proc.tools.parsers.base import ToolParser


class Llama3JsonParser(ToolParser):
    """Calls only where the output (or a ``<|python_tag|>``) starts with a JSON object;
    any other output is content."""

    OPEN = ("<|python_tag|>",)
    OPEN_AT_START = True
    NEXT = r"\s*;\s*"
    SPECIAL_MARKERS = ("<|python_tag|>",)
    ARGUMENTS_KEY = "parameters"
    GRAMMAR = ("", "; ", "")

    @staticmethod
    def describe(tools: list[dict]) -> str:
        """System-prompt text for a template without tool support (see `HermesParser.describe`)."""
        listed = "\n\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        return (
            "You have access to the following functions. To call a function, answer with a JSON object "
            '{"name": <function-name>, "parameters": <arguments-as-a-json-object>} and nothing else.\n\n' + listed
        )
