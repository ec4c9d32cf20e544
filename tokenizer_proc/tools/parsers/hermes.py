"""The ``<tool_call>{json}</tool_call>`` family: Hermes-style templates, Qwen 2.5 / 3, and
SmolLM2's JSON list inside one ``<tool_call>`` block (``<tool_call>[{...}, {...}]</tool_call>``)."""

from __future__ import annotations

import json

from tokenizer_proc.tools.parsers.base import ToolParser


class HermesParser(ToolParser):
    """One ``<tool_call>`` block per call (or a JSON list of calls in one block); text
    around the blocks is content."""

    OPEN = ("<tool_call>",)
    FIRST = r"\s*\[?\s*"
    NEXT = r"\s*(?:,|\]?\s*</tool_call>\s*<tool_call>\s*\[?)\s*"
    CLOSE = r"\s*\]?\s*</tool_call>"
    ARGUMENTS_KEY = "arguments"
    TRIGGER = "<tool_call>"
    GRAMMAR = ("<tool_call>\n", "\n</tool_call>\n<tool_call>\n", "\n</tool_call>")

    @staticmethod
    def describe(tools: list[dict]) -> str:
        """System-prompt text that shows a template without tool support the tools and
        this family's call format."""
        listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        return (
            "# Tools\n\nYou may call one or more functions to answer the user. The functions you can call "
            f"are listed, one JSON signature per line, inside <tools></tools>:\n<tools>\n{listed}\n</tools>\n\n"
            "To call a function, write a JSON object with its name and arguments inside "
            "<tool_call></tool_call> tags, one block per call:\n<tool_call>\n"
            '{"name": <function-name>, "arguments": <arguments-as-a-json-object>}\n</tool_call>'
        )
