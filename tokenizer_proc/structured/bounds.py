"""Repetition counts a grammar can hold: xgrammar keeps them in 32-bit integers, and a larger
one wrapped around (``a{4294967297}`` matched one ``a``, ``maxLength`` 4294967296 allowed the
empty string only, 2147483648 became a range ending at -2147483648), so such a count is
refused with a 400 naming where it is, before anything is compiled.

Counts come from regex quantifiers (``{n}``, ``{n,}``, ``{n,m}``: a native ``regex``, an
``ebnf`` grammar, a schema's ``pattern`` and ``patternProperties`` keys) and from a schema's
count keywords (`COUNT_KEYWORDS`).
"""

from __future__ import annotations

import re

MAX_REPEAT = 2**31 - 1
"""The largest repetition count xgrammar 0.2.9 holds (a signed 32-bit integer)."""

COUNT_KEYWORDS = (
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
)
"""JSON-schema keywords whose value is a count the grammar repeats by."""

_QUANTIFIER = re.compile(r"\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


def text_excess(text: str) -> int | None:
    """The first repetition count above `MAX_REPEAT` in `text` (a regex or an EBNF grammar;
    a quoted ``{n}`` inside an EBNF literal counts too, a harmless over-reach for counts that
    large), or None."""
    for m in _QUANTIFIER.finditer(text):
        for count in m.groups():
            if count and int(count) > MAX_REPEAT:
                return int(count)
    return None


def schema_excess(schema: object, where: str = "$") -> tuple[str, int] | None:
    """(JSON path, count) of the first count above `MAX_REPEAT` in `schema` (a decoded JSON
    value): a `COUNT_KEYWORDS` value, or a quantifier in a ``pattern`` or a
    ``patternProperties`` key; None when there is none. Recursion follows the nesting, which
    the callers bound first (`schema_enforce.SchemaSize`)."""
    if isinstance(schema, list):
        for i, item in enumerate(schema):
            if (found := schema_excess(item, f"{where}[{i}]")) is not None:
                return found
        return None
    if not isinstance(schema, dict):
        return None
    for key, value in schema.items():
        here = f"{where}.{key}"
        if key in COUNT_KEYWORDS and isinstance(value, int) and not isinstance(value, bool) and value > MAX_REPEAT:
            return here, value
        if key == "pattern" and isinstance(value, str) and (count := text_excess(value)) is not None:
            return here, count
        if key == "patternProperties" and isinstance(value, dict):
            for name in value:
                if (count := text_excess(name)) is not None:
                    return f"{here}[{name!r}]", count
        if (found := schema_excess(value, here)) is not None:
            return found
    return None


def too_large(count: int, where: str) -> str:
    """The 400's message for `count` at `where`."""
    return f"the repetition count {count} at {where} is above {MAX_REPEAT}, the largest the grammar engine holds"
