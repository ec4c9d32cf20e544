"""The grammar that enforces ``tool_choice: "required"`` or a named function.

The output must be one call (or, with ``parallel_tool_calls`` and ``required``, one or more)
in the parser family's markup (`ToolParser.GRAMMAR`: the text before the calls, between
two, after them), each call the JSON object ``{"name": <a tool's name>, "arguments": <an
object valid against that tool's parameters>}`` (Llama says ``"parameters"``). The calls'
JSON schema goes through xgrammar with the options of every JSON schema (`protocol.grammar`);
the markup is EBNF around it. The result is one EBNF text whose start rule is ``root``, sent
as an EBNF `GrammarSpec`, so the scheduler compiles it as any other grammar (and caches it
by its text). Once the grammar ends, the request ends (finish_reason ``stop``, reported as
``tool_calls``); one cut by ``max_tokens`` stays ``length``.
"""

from __future__ import annotations

import json

import xgrammar

from protocol.enums import GrammarKind
from protocol.grammar import JSON_SCHEMA_OPTIONS, canonical_json, xgrammar_message
from protocol.messages import GrammarSpec
from tokenizer_proc.errors import APIError
from tokenizer_proc.tool_parsers import ToolParser

EMPTY_PARAMETERS = {"type": "object", "properties": {}}
"""A function without ``parameters`` takes none: its arguments are ``{}``."""


def call_schema(tools: list[dict], arguments_key: str) -> dict:
    """The JSON schema of one call of any of `tools` (OpenAI function tools, already checked).
    Each tool's parameters become a subschema, so their local references (``#/$defs/X``,
    ``#``: relative to the parameters) are rebased to where they now sit (`rebase_refs`)."""
    options = []
    for i, tool in enumerate(tools):
        fn = tool["function"]
        at = f"#/properties/{arguments_key}" if len(tools) == 1 else f"#/anyOf/{i}/properties/{arguments_key}"
        options.append({"type": "object",
                        "properties": {"name": {"const": fn["name"]},
                                       arguments_key: rebase_refs(fn.get("parameters") or EMPTY_PARAMETERS, at)},
                        "required": ["name", arguments_key]})
    return options[0] if len(options) == 1 else {"anyOf": options}


def rebase_refs(schema, base: str):
    """A copy of `schema` (JSON values) whose local ``$ref`` strings (``#`` and ``#/...``, JSON
    pointers into `schema`) point into `schema` placed at `base` (a ``#/...`` pointer) in a
    larger document; other references and values are left as they are."""
    if isinstance(schema, dict):
        return {k: base + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#") else rebase_refs(v, base)
                for k, v in schema.items()}
    if isinstance(schema, list):
        return [rebase_refs(v, base) for v in schema]
    return schema


def _literal(text: str) -> str:
    """`text` as an EBNF string literal (JSON escapes are EBNF's)."""
    return json.dumps(text, ensure_ascii=False)


def forced_calls(parser: type[ToolParser], tools: list[dict], parallel: bool) -> GrammarSpec:
    """An EBNF `GrammarSpec` for calls of `tools` in `parser`'s markup: exactly one call, or
    one or more when `parallel`. Raises `APIError` 400 (param ``tools``) when xgrammar
    cannot build it."""
    before, between, after = parser.GRAMMAR
    try:
        call = xgrammar.Grammar.from_json_schema(canonical_json(call_schema(tools, parser.ARGUMENTS_KEY)),
                                                 **JSON_SCHEMA_OPTIONS)
        more = f"({_literal(between)} root)*" if parallel else ""
        calls = f'tool_calls ::= {_literal(before)} root {more} {_literal(after)}\n'.replace('"" ', "")
        text = str(xgrammar.Grammar.from_ebnf(f"{call}\n{calls}", root_rule_name="tool_calls"))
        xgrammar.Grammar.from_ebnf(text)  # the scheduler parses it so, with its start rule printed as root
    except (RuntimeError, UnicodeDecodeError) as e:
        raise APIError(f"tools: cannot build the grammar of a forced call: {xgrammar_message(e)}", 400,
                       "tools") from None
    return GrammarSpec(GrammarKind.EBNF, text)
