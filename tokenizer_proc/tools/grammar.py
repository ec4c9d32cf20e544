"""The grammars of tool calls: ``tool_choice: "required"`` or a named function
(`forced_calls`), and ``strict`` tools under ``tool_choice: "auto"`` (`auto_calls`).

Forced calls:

The output must be one call (or, with ``parallel_tool_calls`` and ``required``, one or more)
in the parser family's markup (`ToolParser.GRAMMAR`: the text before the calls, between
two, after them), each call the JSON object ``{"name": <a tool's name>, "arguments": <an
object valid against that tool's parameters>}`` (Llama says ``"parameters"``). The calls'
JSON schema goes through xgrammar with the options of every JSON schema (`protocol.grammar`),
its strings' patterns and lengths through ours (`string_grammar.json_schema_ebnf`); the
markup is EBNF around it. The result is one EBNF text whose start rule is ``root``, sent
as an EBNF `GrammarSpec`, so the scheduler compiles it as any other grammar (and caches it
by its text). Once the grammar ends, the request ends (finish_reason ``stop``, reported as
``tool_calls``); one cut by ``max_tokens`` stays ``length``.

Strict tools under ``auto`` (as SGLang, whose parsers return an xgrammar structural tag
when a tool is strict, and as OpenAI, for which strict arguments always match the schema):
an xgrammar structural tag whose text is free until the family's call marker
(``ToolParser.TRIGGER``); from the marker on, the markup and one call (one or more when
parallel calls are allowed) of a declared tool must follow, then the text is free again
(with ``parallel_tool_calls: false`` the output ends after the first call). A strict tool's
arguments must match its parameters, a non-strict one's are any JSON object
(`ANY_ARGUMENTS`). Llama 3 JSON has no marker (a call is an output that starts with ``{``):
its grammar is "a call list, or text whose first non-blank character is not ``{``". With
a reasoning parser, a think block before the calls is free text (`Think`). The structural
tag is printed as EBNF (xgrammar's ``TagDispatch`` rules parse back) and sent as an EBNF
`GrammarSpec`, like a forced call. Free text is not constrained, so an answer without calls
is the one the model writes without the grammar; EOS is allowed wherever the text is free.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import xgrammar
from xgrammar import structural_tag as st

from protocol.enums import GrammarKind
from protocol.grammar import canonical_json, xgrammar_message
from protocol.messages import GrammarSpec
from tokenizer_proc.errors import APIError
from tokenizer_proc.structured.schema_normalize import for_grammar
from tokenizer_proc.structured.string_grammar import PatternError, json_schema_ebnf
from tokenizer_proc.tools.parsers import ToolParser

EMPTY_PARAMETERS = {"type": "object", "properties": {}}
"""A function without ``parameters`` takes none: its arguments are ``{}``."""

ANY_ARGUMENTS = {"type": "object", "additionalProperties": True}
"""The arguments of a non-strict tool in a strict ``auto`` grammar: any JSON object (with
``additionalProperties`` spelled out: the strict mode of `JSON_SCHEMA_OPTIONS` would read
``{"type": "object"}`` as ``{}``)."""


def call_schema(tools: list[dict], arguments_key: str, enforced: list[bool] | None = None) -> dict:
    """The JSON schema of one call of any of `tools` (OpenAI function tools, already checked).
    Each tool's parameters become a subschema, so their local references (``#/$defs/X``,
    ``#``: relative to the parameters) are rebased to where they now sit (`rebase_refs`).
    enforced: per tool, whether its arguments must match its parameters (None: all); one
    that is not takes `ANY_ARGUMENTS`. Parameters are rewritten as `schema_normalize.for_grammar`
    does (the same arguments validate)."""
    options = []
    for i, tool in enumerate(tools):
        fn = tool["function"]
        at = f"#/properties/{arguments_key}" if len(tools) == 1 else f"#/anyOf/{i}/properties/{arguments_key}"
        params = (
            for_grammar(fn.get("parameters") or EMPTY_PARAMETERS) if enforced is None or enforced[i] else ANY_ARGUMENTS
        )
        options.append(
            {
                "type": "object",
                "properties": {"name": {"const": fn["name"]}, arguments_key: rebase_refs(params, at)},
                "required": ["name", arguments_key],
            }
        )
    return options[0] if len(options) == 1 else {"anyOf": options}


def rebase_refs(schema, base: str):
    """A copy of `schema` (JSON values) whose local ``$ref`` strings (``#`` and ``#/...``, JSON
    pointers into `schema`) point into `schema` placed at `base` (a ``#/...`` pointer) in a
    larger document; other references and values are left as they are."""
    if isinstance(schema, dict):
        return {
            k: base + v[1:] if k == "$ref" and isinstance(v, str) and v.startswith("#") else rebase_refs(v, base)
            for k, v in schema.items()
        }
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
        call = json_schema_ebnf(call_schema(tools, parser.ARGUMENTS_KEY))
        more = f"({_literal(between)} root)*" if parallel else ""
        calls = f"tool_calls ::= {_literal(before)} root {more} {_literal(after)}\n".replace('"" ', "")
        text = str(xgrammar.Grammar.from_ebnf(f"{call}\n{calls}", root_rule_name="tool_calls"))
        xgrammar.Grammar.from_ebnf(text)  # the scheduler parses it so, with its start rule printed as root
    except (RuntimeError, UnicodeDecodeError) as e:
        raise APIError(
            f"tools: cannot build the grammar of a forced call: {xgrammar_message(e)}", 400, "tools"
        ) from None
    except PatternError as e:
        raise APIError(f"tools: cannot build the grammar of a forced call: {e}", 400, "tools") from None
    return GrammarSpec(GrammarKind.EBNF, text)


_BLANK = r"[ \t\r\n]"
"""Whitespace, as a regex class."""


@dataclass(frozen=True)
class Think:
    """The think block a reasoning parser reads: its tags, and whether the output starts
    inside it (the prompt opened it)."""

    open: str
    close: str
    inside: bool = False


def _calls_ebnf(parser: type[ToolParser], tools: list[dict], enforced: list[bool], parallel: bool) -> str:
    """EBNF (start rule ``root``) of the calls inside one section of `parser`'s markup: one
    call, or, when `parallel`, one or more separated by the family's in-between markup."""
    between = parser.GRAMMAR[1]
    call = json_schema_ebnf(call_schema(tools, parser.ARGUMENTS_KEY, enforced))
    calls = f"calls ::= root ({_literal(between)} root)*" if parallel else "calls ::= root"
    return str(xgrammar.Grammar.from_ebnf(f"{call}\n{calls}\n", root_rule_name="calls"))


def _body(parser: type[ToolParser], calls: st.GrammarFormat, parallel: bool):
    """The structural-tag format of the output after any think block (see the module docstring)."""
    before, _, after = parser.GRAMMAR
    if parser.TRIGGER is not None:
        return st.TriggeredTagsFormat(
            triggers=[parser.TRIGGER],
            tags=[st.TagFormat(begin=before, content=calls, end=after)],
            stop_after_first=not parallel,
        )
    # a call only where the output starts with one (Llama 3 JSON): calls, or text that starts otherwise
    return st.OrFormat(
        elements=[
            st.SequenceFormat(
                elements=[st.RegexFormat(pattern=f"{_BLANK}*"), st.TagFormat(begin=before, content=calls, end=after)]
            ),
            st.SequenceFormat(elements=[st.RegexFormat(pattern=rf"{_BLANK}*[^{{ \t\r\n]"), st.AnyTextFormat()]),
            st.RegexFormat(pattern=f"{_BLANK}*"),
        ]
    )


def auto_calls(
    parser: type[ToolParser], tools: list[dict], enforced: list[bool], parallel: bool, think: Think | None = None
) -> GrammarSpec:
    """An EBNF `GrammarSpec` for ``tool_choice: "auto"`` with strict tools (see the module
    docstring). tools: OpenAI tool dicts (already checked); enforced: per tool, whether it is
    strict; parallel: several calls allowed (else the output ends after the first); think:
    the reasoning parser's block, free text before the calls (None: no reasoning parser).
    Built once per tool set and options (`_auto_calls_text`, cached: an agent sends the same
    tools with every turn). Raises `APIError` 400 (param ``tools``) when xgrammar cannot build it."""
    text = _auto_calls_text(parser, canonical_json(tools), tuple(enforced), parallel, think)
    return GrammarSpec(GrammarKind.EBNF, text)


@functools.lru_cache(maxsize=256)
def _auto_calls_text(
    parser: type[ToolParser], tools_json: str, enforced: tuple[bool, ...], parallel: bool, think: Think | None
) -> str:
    """The EBNF text of `auto_calls` for the tools `tools_json` (canonical JSON)."""
    tools = json.loads(tools_json)
    try:
        body = _body(parser, st.GrammarFormat(grammar=_calls_ebnf(parser, tools, enforced, parallel)), parallel)
        if think is not None and think.inside:  # the block is open: it ends (then the body), or the output does
            body = st.OrFormat(
                elements=[
                    st.AnyTextFormat(excludes=[think.close]),
                    st.SequenceFormat(
                        elements=[st.TagFormat(begin="", content=st.AnyTextFormat(), end=think.close), body]
                    ),
                ]
            )
        elif think is not None:  # a block may come first; text without one is the body's
            body = st.OrFormat(
                elements=[
                    st.SequenceFormat(
                        elements=[
                            st.RegexFormat(pattern=f"{_BLANK}*"),
                            st.TagFormat(begin=think.open, content=st.AnyTextFormat(), end=think.close),
                            body,
                        ]
                    ),
                    body,
                ]
            )
        text = str(xgrammar.Grammar.from_structural_tag(st.StructuralTag(format=body)))
        xgrammar.Grammar.from_ebnf(text)  # the scheduler parses it so
    except (RuntimeError, UnicodeDecodeError, ValueError) as e:
        raise APIError(
            f"tools: cannot build the grammar of strict tools: {xgrammar_message(e)}", 400, "tools"
        ) from None
    return text
