"""Structured-output requests checked before they start: OpenAI ``response_format`` and
SGLang's native ``json_schema`` / ``regex`` / ``ebnf`` sampling params become a `GrammarSpec`.

Checks are cheap and need no tokenizer: ``xgrammar.Grammar.from_*`` parses and converts
the grammar (well under a millisecond for small schemas, ~16 ms for a 50-property nested
one) and ``jsonschema`` checks a schema against its metaschema (~1 ms). The scheduler
compiles the spec later with the same options (`protocol.grammar`). Every problem is an
`APIError` 400 naming the field.
"""

from __future__ import annotations

import json
import math
import re
import sys

import jsonschema
import xgrammar
from jsonschema.exceptions import best_match
from jsonschema.validators import validator_for

from protocol.enums import GrammarKind
from protocol.grammar import JSON_SCHEMA_OPTIONS, XGRAMMAR_ERRORS, canonical_json, xgrammar_message
from protocol.messages import GrammarSpec
from tokenizer_proc.errors import APIError
from tokenizer_proc.structured.bounds import schema_excess, text_excess, too_large
from tokenizer_proc.structured.ecma_regex import format_checker
from tokenizer_proc.structured.schema_enforce import SchemaSize, unenforced
from tokenizer_proc.structured.schema_normalize import for_grammar
from tokenizer_proc.structured.string_grammar import PatternError, schema_ebnf

RESPONSE_FORMAT = "response_format"
_FORMAT_KEYS = {"text": {"type"}, "json_object": {"type"}, "json_schema": {"type", "json_schema"}}
"""The keys each ``response_format`` type takes (OpenAI's); any other is a 400 naming it."""
_JSON_SCHEMA_KEYS = ("name", "description", "schema", "strict")

_TEXT_GRAMMARS = {
    "regex": (GrammarKind.REGEX, xgrammar.Grammar.from_regex),
    "ebnf": (GrammarKind.EBNF, xgrammar.Grammar.from_ebnf),
}
"""Native field -> (spec kind, the xgrammar parser that checks its text)."""
NATIVE_FIELDS = "sampling_params."
"""Where the native grammar fields sit in a ``/generate`` body, for the error's param."""


def from_response_format(rf: dict | None) -> GrammarSpec | None:
    """The spec of an OpenAI ``response_format``, or None for free text.

    ``None`` or ``{"type": "text"}`` -> None; ``{"type": "json_object"}`` -> JSON_OBJECT;
    ``{"type": "json_schema", "json_schema": {"name", "schema": {...}, "strict"}}`` ->
    JSON_SCHEMA with the schema as canonical JSON text. ``strict`` must be a bool if given
    and changes nothing: the schema is always enforced (`protocol.grammar`). Raises
    `APIError` 400 (param ``response_format``) for any other shape or a schema that is
    invalid or that xgrammar cannot compile.
    """
    if rf is None:
        return None
    if not isinstance(rf, dict):
        raise APIError("response_format must be an object with a `type`", 400, RESPONSE_FORMAT)
    kind = rf.get("type")
    _no_unknown_keys(rf, _FORMAT_KEYS.get(kind, rf.keys()), "response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarSpec(GrammarKind.JSON_OBJECT, "")
    if kind != "json_schema":
        raise APIError(
            f"response_format.type must be one of text, json_object, json_schema; got {kind!r}", 400, RESPONSE_FORMAT
        )
    body = rf.get("json_schema")
    if not isinstance(body, dict):
        raise APIError("response_format.json_schema must be an object with a `schema`", 400, RESPONSE_FORMAT)
    _no_unknown_keys(body, _JSON_SCHEMA_KEYS, "response_format.json_schema")
    if body.get("strict") is not None and not isinstance(body["strict"], bool):
        raise APIError("response_format.json_schema.strict must be a boolean", 400, RESPONSE_FORMAT)
    if "schema" not in body:
        raise APIError("response_format.json_schema.schema is missing", 400, RESPONSE_FORMAT)
    return schema_spec(body["schema"], "response_format.json_schema.schema", RESPONSE_FORMAT)


def _no_unknown_keys(obj: dict, known, where: str) -> None:
    """Raise a 400 `APIError` naming the first key of `obj` not in `known`; a key whose value
    is null counts as absent (``{"type": "json_object", "json_schema": null}``, as clients that
    serialize every field send it), as for the other optional fields of the OpenAI bodies."""
    unknown = [k for k, v in obj.items() if k not in known and v is not None]
    if unknown:
        raise APIError(
            f"{where}.{unknown[0]} is not a known field here (known: {', '.join(sorted(known))})", 400, RESPONSE_FORMAT
        )


def from_native(json_schema: str | None, regex: str | None, ebnf: str | None) -> GrammarSpec | None:
    """The spec of a native request's sampling params, or None when none is given.

    json_schema: a JSON schema as JSON text (an object); regex: a regular expression the
    whole output must match; ebnf: a GBNF-style grammar whose start rule is ``root``.
    Raises `APIError` 400 naming the field (``sampling_params.regex``) when more than one is
    given or it is invalid.
    """
    given = [(name, v) for name, v in (("json_schema", json_schema), ("regex", regex), ("ebnf", ebnf)) if v is not None]
    if not given:
        return None
    if len(given) > 1:
        names = ", ".join(name for name, _ in given)
        raise APIError(
            f"give at most one of json_schema, regex and ebnf; got {names}", 400, NATIVE_FIELDS + given[1][0]
        )
    name, text = given[0]
    field = NATIVE_FIELDS + name
    if name == "json_schema":
        try:
            schema = json.loads(text)
        except RecursionError:
            raise APIError(f"{field} nests too deeply", 400, field) from None
        except ValueError as e:
            raise APIError(f"{field} is not valid JSON: {e}", 400, field) from None
        return schema_spec(schema, field, field)
    kind, build = _TEXT_GRAMMARS[name]
    if (count := text_excess(text)) is not None:
        raise APIError(f"{field} is not supported: {too_large(count, field)}", 400, field)
    try:
        build(text)
    except XGRAMMAR_ERRORS as e:
        raise APIError(
            f"{field} is invalid: {xgrammar_message(e, own_ebnf=kind == GrammarKind.EBNF)}", 400, field
        ) from None
    return GrammarSpec(kind, text)


def check_schema(schema: dict) -> None:
    """Check `schema` against its dialect's metaschema (2020-12 when it names none), as
    ``check_schema`` does, but with ``pattern``s read as ECMA-262 (`ecma_regex`). Raises
    `jsonschema.SchemaError` for the most relevant error."""
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    error = best_match(cls(cls.META_SCHEMA, format_checker=format_checker(cls)).iter_errors(schema))
    if error is not None:
        raise jsonschema.SchemaError.create_from(error)


def schema_spec(schema: object, field: str, param: str, enforced: bool = True) -> GrammarSpec:
    """A JSON_SCHEMA spec for `schema` (a decoded JSON value) after the checks: within the
    size limits (`schema_enforce.SchemaSize`: union branches and enum values, object
    properties, characters of names and values), the metaschema, xgrammar's conversion and,
    when `enforced` (the output will be held to it), that xgrammar enforces every keyword
    (`check_enforced`). The spec holds the schema as `schema_normalize.for_grammar` rewrites
    it (the same instances validate). When `enforced` and the schema has strings whose grammar is ours
    (`string_grammar`: patterns, lengths, some formats), the spec is the EBNF of the whole
    schema instead, and a pattern it cannot enforce is a 400. `field` names it in messages,
    `param` is the error's param."""
    if not isinstance(schema, dict):
        raise APIError(f"{field} must be a JSON object, got {type(schema).__name__}", 400, param)
    if (bad := unreadable_number(schema)) is not None:  # xgrammar's JSON reader fails on it, without a reason
        where, problem = bad
        raise APIError(f"{field} cannot be used for structured output: {problem} (at {where})", 400, param)
    if (excess := SchemaSize.of(schema).excess()) is not None:  # first: the checks below would take seconds
        raise APIError(f"{field} has {excess}", 400, param)
    try:
        check_schema(schema)
    except jsonschema.SchemaError as e:
        where = e.json_path if e.absolute_path else "the schema"
        if isinstance(e.cause, re.error):  # a pattern (or patternProperties key) the check cannot read
            raise APIError(
                f"{field}: the pattern {e.instance!r} (at {where}) cannot be used: {e.cause}; patterns are "
                "read as ECMA-262, in the part of it that Python's re reads alike",
                400,
                param,
            ) from None
        raise APIError(f"{field} is not a valid JSON schema: {e.message} (at {where})", 400, param) from None
    except RecursionError:  # the metaschema check recurses once per nesting level
        raise APIError(f"{field} nests too deeply", 400, param) from None
    if (excess := schema_excess(schema)) is not None:  # after the check, which bounds the nesting
        where, count = excess
        raise APIError(f"{field} is not supported for structured output: {too_large(count, where)}", 400, param)
    schema = for_grammar(schema)
    text = canonical_json(schema)
    try:
        ebnf = schema_ebnf(schema) if enforced else None
        if ebnf is None:
            xgrammar.Grammar.from_json_schema(text, **JSON_SCHEMA_OPTIONS)
        else:
            xgrammar.Grammar.from_ebnf(ebnf)
    except XGRAMMAR_ERRORS as e:
        raise APIError(f"{field} is not supported for structured output: {xgrammar_message(e)}", 400, param) from None
    except PatternError as e:
        raise APIError(f"{field} is not supported for structured output: {e}", 400, param) from None
    if enforced:
        check_enforced(schema, field, param)
    return GrammarSpec(GrammarKind.JSON_SCHEMA, text) if ebnf is None else GrammarSpec(GrammarKind.EBNF, ebnf)


def unreadable_number(value: object) -> tuple[str, str] | None:
    """The first number in `value` (a decoded JSON value) that is not a finite 64-bit float,
    as (JSON path such as ``$.properties.a.maximum``, what is wrong), or None. Python's JSON
    reader turns a number beyond that range written as a float (``1e400``) into infinity,
    takes ``NaN`` and ``Infinity``, and keeps an integer of any length (``10**400`` written
    out); xgrammar's reader refuses each of them. Iterative: any depth."""
    stack: list[tuple[object, str]] = [(value, "$")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            stack.extend(reversed([(v, f"{path}.{k}") for k, v in node.items()]))
        elif isinstance(node, list):
            stack.extend(reversed([(v, f"{path}[{i}]") for i, v in enumerate(node)]))
        elif isinstance(node, float) and math.isnan(node):
            return path, "NaN is not a JSON number"
        elif isinstance(node, (int, float)) and not isinstance(node, bool):
            try:
                if math.isfinite(float(node)):
                    continue
            except OverflowError:  # an int beyond the float range
                pass
            return path, (
                f"the number is beyond the range of a 64-bit float (its magnitude must be at most "
                f"{sys.float_info.max:.4g})"
            )
    return None


def check_enforced(schema: dict, field: str, param: str) -> None:
    """Raises `APIError` 400 when `schema` (valid, compiled by xgrammar) uses a keyword the
    grammar would not enforce, naming where (`schema_enforce.unenforced`)."""
    found = unenforced(schema)
    if found is not None:
        where, problem = found
        raise APIError(f"{field} is not supported for structured output: {problem} (at {where})", 400, param)
