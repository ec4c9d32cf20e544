"""What a chat request's ``tools``, ``tool_choice`` and ``parallel_tool_calls`` ask for
(`ToolPlan`): the tools the template shows, the parser that reads calls out of the output,
the grammar that forces a call, and how many calls may be reported.

``none``: the tools are neither shown nor parsed (no call can come back); ``auto`` (the
default with tools): shown and parsed; ``required`` and a named function: also enforced by
a grammar (`tools.grammar.forced_calls`). Under ``auto``, tools with ``strict: true`` are
enforced too, by a grammar that leaves text free until a call starts
(`tools.grammar.auto_calls`, built by the request builder once the prompt is rendered, when
nothing rules it out: see `ToolPlan.strict`). The parameters of a tool whose arguments a
grammar enforces must be enforceable (`schema_enforce`), else a 400 naming
``tools.N.function.parameters``. ``parallel_tool_calls: false`` allows one call: the
grammar writes one, and under ``auto`` calls after the first are not reported. A stop
string never cuts a tool call (`ToolPlan.stops_outside_calls`).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from protocol.messages import DetokParams, GrammarSpec
from tokenizer_proc.errors import APIError
from tokenizer_proc.structured.check import check_enforced, schema_spec
from tokenizer_proc.structured.schema_enforce import SchemaSize
from tokenizer_proc.tools.grammar import forced_calls
from tokenizer_proc.tools.models import NamedToolChoice, ToolChoice, ToolDef
from tokenizer_proc.tools.parsers import ToolParser


@dataclass(frozen=True)
class ToolPlan:
    """parser: reads calls from the output (None: no parsing); tools: OpenAI tool dicts for
    the chat template (None: none shown; ``strict`` left out, so it does not change the
    prompt); grammar: forces the calls (None: free text);
    max_calls: calls reported at most (None: any); strict: under ``auto`` with at least one
    strict tool, per tool whether it is strict (None: no strict tool, or a forced call),
    for `tools.grammar.auto_calls`."""

    parser: type[ToolParser] | None = None
    tools: list[dict] | None = None
    grammar: GrammarSpec | None = None
    max_calls: int | None = None
    strict: tuple[bool, ...] | None = None

    def stops_outside_calls(self, detok: DetokParams) -> DetokParams:
        """`detok` (the request's) so that a stop string never cuts a tool call: a stop
        string ends the output in text outside calls only. Under a forced call (``required``
        or a named function) the output is the call from its first token, so no stop string
        applies; under ``auto`` (strict tools or not) they apply until a call begins (the
        family's markers, `detokenizer_proc.stop_strings.StopMatcher`). Without calls
        parsed, or without stop strings, `detok` as it is.

        vLLM and SGLang match stop strings in the whole output, calls included, so one that
        occurs in a call's arguments ends the request with half a call (arguments that are
        not JSON, finish_reason ``stop``), which no client can run; a strict or forced call
        would break the schema it promises. Refusing stop with tools instead would fail the
        clients that send the same stop strings with every request (such as end-of-turn
        text), which those servers serve. ``stop_token_ids`` are matched by the scheduler on
        every token: a grammar never allows a special token (`structured.tokenizer_info`), so the
        end-of-turn ids sent there cannot end a forced or strict call early; a text token's
        id can."""
        if self.parser is None or not detok.stop:
            return detok
        if self.grammar is not None:
            return msgspec.structs.replace(detok, stop=[])
        return msgspec.structs.replace(
            detok, call_markers=list(self.parser.OPEN), call_at_start=self.parser.OPEN_AT_START
        )


NO_TOOLS = ToolPlan()


def plan_tools(
    tools: list[ToolDef] | None, choice: ToolChoice | None, parallel: bool | None, parser: type[ToolParser] | None
) -> ToolPlan:
    """The `ToolPlan` of a request. parser: the server's ``--tool-call-parser`` family
    (None: off). Raises `APIError` 400 naming the field: tool_choice without tools, a
    named function not in tools, duplicate names, a parameters schema that is invalid, not
    of an object, or (for a forced call) uses keywords the grammar cannot enforce, tools
    while the parser is off; under ``auto``, a strict tool's parameters the grammar cannot
    enforce; the parameters one grammar holds over the size limits together (``tools``)."""
    if not tools:
        if choice not in (None, "none", "auto"):
            raise APIError("tool_choice needs tools", 400, "tool_choice")
        return NO_TOOLS
    if choice == "none":
        return NO_TOOLS
    if parser is None:
        raise APIError("tools need a tool-call parser; start the server with --tool-call-parser", 400, "tools")
    names = [t.function.name for t in tools]
    for i, tool in enumerate(tools):
        if names.index(tool.function.name) != i:
            raise APIError(f"tools: the function name {tool.function.name!r} is given twice", 400, f"tools.{i}")
        if tool.function.parameters is not None:
            field = f"tools.{i}.function.parameters"
            schema_spec(tool.function.parameters, field, field, enforced=False)
            if tool.function.parameters.get("type", "object") != "object":
                raise APIError(
                    f'{field} must describe a JSON object (type "object"): a call\'s arguments are an object',
                    400,
                    field,
                )
    # strict is the server's to enforce, not the model's to read: the prompt is the same either way
    dicts = [t.model_dump(exclude_none=True, exclude={"function": {"strict"}}) for t in tools]
    single = 1 if parallel is False else None
    if choice in (None, "auto"):
        strict = tuple(bool(t.function.strict) for t in tools)
        _check_forced(tools, [i for i, s in enumerate(strict) if s])
        return ToolPlan(parser, dicts, None, single, strict if any(strict) else None)
    if isinstance(choice, NamedToolChoice):
        if choice.function.name not in names:
            raise APIError(f"tool_choice names {choice.function.name!r}, which is not in tools", 400, "tool_choice")
        at = names.index(choice.function.name)
        _check_forced(tools, [at])
        return ToolPlan(parser, dicts, forced_calls(parser, [dicts[at]], parallel=False), 1)
    _check_forced(tools, range(len(tools)))
    return ToolPlan(parser, dicts, forced_calls(parser, dicts, parallel=single is None), single)


def _check_forced(tools: list[ToolDef], indices) -> None:
    """The parameters of the tools a forced call or a strict tool may use must be
    enforceable: their schema becomes the call's grammar (of a non-strict tool under
    ``auto`` it is only shown to the model). One grammar holds them all, so together they
    must keep the size limits each keeps alone (`SchemaSize`)."""
    schemas = [(i, tools[i].function.parameters) for i in indices if tools[i].function.parameters is not None]
    for i, schema in schemas:
        field = f"tools.{i}.function.parameters"
        check_enforced(schema, field, field)
    excess = sum((SchemaSize.of(schema) for _, schema in schemas), SchemaSize()).excess()
    if excess is not None:
        raise APIError(
            f"tools: the parameters of the tools a call may use ({', '.join(str(i) for i, _ in schemas)}), "
            f"which one grammar enforces, have {excess}",
            400,
            "tools",
        )
