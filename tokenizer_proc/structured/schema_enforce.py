"""Which JSON-schema keywords structured output cannot enforce: `unenforced` finds the first.

xgrammar (the grammar backend) turns a schema into a grammar, but it silently treats some
keywords as "any value": its output then fails the schema while the request ends with
finish_reason "stop". Measured on the installed xgrammar with ``strict_mode``, each of these
let an invalid instance through, so a schema that uses one is refused (OpenAI's strict mode
refuses most of them too, e.g. "'oneOf' is not permitted"):

- keywords it ignores: ``not``, ``if`` / ``then`` / ``else``, ``dependentRequired``,
  ``dependentSchemas``, ``dependencies``, ``contains`` / ``minContains`` / ``maxContains``,
  ``uniqueItems: true``, ``$dynamicRef``, ``$recursiveRef``;
- ``$ref`` other than a local JSON pointer (``#`` or ``#/...``): remote, ``$id``-based and
  ``$anchor`` references become "any value";
- ``allOf`` with more than one schema (only the first is kept);
- keywords beside ``$ref``, ``anyOf``, ``oneOf`` or ``allOf`` that assert something (only the
  reference or the branches are kept; annotations such as ``description`` are fine);
- ``enum`` / ``const`` beside other assertions that some listed value fails (the values are
  emitted as listed: ``{"type": "string", "enum": ["a", 1]}`` could give 1);
- ``oneOf`` whose branches may overlap (it is enforced as ``anyOf``); branches of disjoint
  types, objects told apart by a required property with distinct ``const`` / ``enum``
  values (a discriminator), or objects each requiring a property the other does not list
  (strict mode writes only the listed properties, so what one branch writes lacks a property
  the other requires: pydantic's discriminated unions whose tag has a default) are accepted;
- string or number keywords in a schema without ``type``, and object / array keywords
  without ``properties`` / ``additionalProperties`` / ``items`` / ``prefixItems`` (from which
  xgrammar infers the type): such a schema is "any value";
- a ``required`` name missing from ``properties`` (strict mode never writes it);
- string keywords beside a ``format`` xgrammar writes (`FORMATS`: ``pattern``,
  ``minLength`` and ``maxLength`` are dropped), and ``minLength`` / ``maxLength`` beside a
  ``pattern`` (the pattern alone is kept);
- ``multipleOf`` that xgrammar drops: on a ``number`` (it only builds integer multiples),
  a value that is not a whole number from 1 to `MAX_MULTIPLE_OF`, or an integer range
  given on one side only or spanning more than `MAX_MULTIPLE_OF_SPAN` integers;
- a ``number`` range bounded on both sides that holds no number of at most
  `NUMBER_DECIMALS` decimal places (``minimum: 1e-10, maximum: 1e-9``): xgrammar writes
  bounded numbers with at most that many, so its rule for the value is empty and the output
  leaves it out (``{"e": }``, or no text at all for a schema that is only the number).

Schemas whose grammar would take xgrammar more than a few seconds to compile are refused
before it is tried: `SchemaSize` counts what the compile time grows with, `SchemaSize.excess`
says which limit a schema passes.

Pure Python; `jsonschema` checks enum values against their siblings.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

import jsonschema
from jsonschema.validators import validator_for

from protocol.grammar import canonical_json

IGNORED = (
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "contains",
    "minContains",
    "maxContains",
    "$dynamicRef",
    "$recursiveRef",
)
"""Keywords xgrammar ignores anywhere they appear."""

OBJECT_KW = {
    "properties",
    "required",
    "additionalProperties",
    "patternProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "unevaluatedProperties",
}
ARRAY_KW = {"items", "prefixItems", "minItems", "maxItems", "unevaluatedItems"}
SCALAR_KW = {
    "minLength",
    "maxLength",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
}
COMBINATORS = ("$ref", "anyOf", "oneOf", "allOf")
ASSERTIONS = OBJECT_KW | ARRAY_KW | SCALAR_KW | {"type", "enum", "const", "format", *COMBINATORS}
"""Keywords that constrain a value; any other key (title, description, default, ...) annotates."""

FORMATS = frozenset(
    {
        "email",
        "date",
        "time",
        "date-time",
        "duration",
        "uuid",
        "ipv4",
        "ipv6",
        "hostname",
        "uri",
        "uri-reference",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
    }
)
"""String formats xgrammar writes (any other ``format`` is a plain string to it); beside one,
``pattern``, ``minLength`` and ``maxLength`` are dropped (measured on xgrammar 0.2.9)."""
MAX_MULTIPLE_OF = 1024
"""The largest integer ``multipleOf`` xgrammar enforces (1025 let 1024 through)."""
MAX_MULTIPLE_OF_SPAN = 10_000
"""Integers a range beside ``multipleOf`` may hold at most: xgrammar enforces a range and a
multiple together only for a closed range of at most this many (0..10000 let 4 through for
``multipleOf: 3``), and drops the multiple for a range bounded on one side."""

NUMBER_DECIMALS = 6
"""The decimal places xgrammar writes in a ``number`` bounded on both sides (measured on
xgrammar 0.2.9: ``minimum: 0.1234567`` let 0.123457 through, not 0.1234567)."""

SUBSCHEMA_MAPS = ("properties", "patternProperties")
SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
SUBSCHEMAS = ("additionalProperties", "items", "unevaluatedItems", "unevaluatedProperties")
"""Keywords whose value is a map of named subschemas, a list of subschemas, one subschema."""
_REF_DEPTH = 32


MAX_BRANCHES = 4096
"""The most ``anyOf`` / ``oneOf`` branches and ``enum`` values a schema may have in all.
xgrammar's compile time grows with the square of a union's branches (on 2 CPU cores: 1,000
object branches 0.1 s, 3,000 0.8 s, 10,000 about 9 s, 100,000 over 4 minutes), and an enum
is such a union (4,096 strings 1.7 s, 8,000 5 s, 20,000 31 s); the scheduler compiles only
`grammar.backend.COMPILE_WORKERS` grammars at once, so larger schemas would hold every later
structured-output request (a compile cannot be stopped when its client leaves)."""

MAX_PROPERTIES = 1000
"""The most object properties a schema may have in all (the keys of every ``properties``,
nested objects and definitions included). xgrammar's compile time grows with the square of an
object's optional properties times the length of their names and their values' rules (one
object, 2 busy CPU cores: 5,000 optional string properties of 4-character names 4.0 s, of 24
characters 12.5 s, 8,000 of 4 characters 8.2 s; 5,000 required ones 1.9 s and 5.9 s).
OpenAI's limit, 5,000, compiles for seconds even with short names; at this one and
`MAX_STRING_CHARS` (1,000 optional properties of 30-character names) strings compile in 1.0 s,
arrays of strings in 2.7 s, arrays of 1 to 5 integers in 4.0 s (required: 0.4 s and 1.9 s)."""

MAX_STRING_CHARS = 30_000
"""The most characters a schema's property names, definition names, ``enum`` values and
``const`` values may have in all (a value that is not a string counts its JSON text). The
compile time of optional properties grows with the length of their names (`MAX_PROPERTIES`):
at OpenAI's limit, 120,000, 1,000 optional properties of 120-character names took 4.2 s as
strings and 14.3 s as arrays of integers. A quarter of it is still twice OpenAI's limit for one
enum of over 250 values (15,000); enum values compile fast (4,096 of 7 characters: 0.02 s)."""

_SIZE_KEYS = {
    **dict.fromkeys(SUBSCHEMAS, "subschema"),
    "allOf": "subschemas",
    "prefixItems": "subschemas",
    "anyOf": "union",
    "oneOf": "union",
    "enum": "enum",
    "const": "const",
    "$ref": "ref",
    "properties": "names",
    "$defs": "names",
    "definitions": "names",
    "patternProperties": "patterns",
}
"""What `SchemaSize` reads under each key of a schema: a subschema, a list of subschemas, a
union's branches (subschemas, counted), enum values, a const value, a reference, a map of
named subschemas (properties or definitions: names counted) or of pattern properties."""


@dataclass(frozen=True)
class SchemaSize:
    """What xgrammar's compile time of a schema grows with, counted over the whole schema.

    branches: ``anyOf`` / ``oneOf`` branches and ``enum`` values; properties: object
    properties (the keys of each ``properties``); chars: the characters of property names,
    definition names, ``enum`` values and ``const`` values. Sizes add up (``+``): the tools a
    forced call may use compile into one grammar. Not counted: how large each property's
    value is (1,000 optional properties of arrays nested 4 deep, within every limit, took 8 s
    to compile; 500 required ones nested 16 deep 12 s)."""

    branches: int = 0
    properties: int = 0
    chars: int = 0

    @classmethod
    def of(cls, root: dict) -> SchemaSize:
        """The size of schema `root` (a decoded JSON object): each subschema counted once,
        whether reached from the root, a definition (referred to or not) or the target of a
        local ``$ref``. Iterative: any depth; linear in the schema's size."""
        branches = properties = chars = 0
        stack: list[object] = [root]
        seen: set[int] = set()
        while stack:
            node = stack.pop()
            if isinstance(node, list):
                stack.extend(node)
            if not isinstance(node, dict) or id(node) in seen:
                continue
            seen.add(id(node))
            for k, v in node.items():
                kind = _SIZE_KEYS.get(k)
                if kind is None:
                    continue
                if kind == "subschema" or (kind == "subschemas" and isinstance(v, list)):
                    stack.append(v)
                elif kind in ("union", "enum") and isinstance(v, list):
                    branches += len(v)
                    if kind == "enum":
                        chars += sum(map(_value_chars, v))
                    else:
                        stack.append(v)
                elif kind in ("names", "patterns") and isinstance(v, dict):
                    stack.extend(v.values())
                    if kind == "names":
                        chars += sum(map(len, v))
                        properties += len(v) if k == "properties" else 0
                elif kind == "const":
                    chars += _value_chars(v)
                elif kind == "ref" and isinstance(v, str) and v.startswith("#/"):
                    stack.append(_pointer(v, root))
        return cls(branches, properties, chars)

    def __add__(self, other: SchemaSize) -> SchemaSize:
        return SchemaSize(self.branches + other.branches, self.properties + other.properties, self.chars + other.chars)

    def excess(self) -> str | None:
        """The first limit this size passes, as what the schema has and the limit (to follow
        "`field` has "), or None within all of them."""
        if self.branches > MAX_BRANCHES:
            return (
                f"{self.branches} anyOf / oneOf branches and enum values in all; at most {MAX_BRANCHES} are "
                f"supported (the grammar's compile time grows with their square)"
            )
        if self.properties > MAX_PROPERTIES:
            return (
                f"{self.properties} object properties in all (nested objects and definitions included); at "
                f"most {MAX_PROPERTIES} are supported (the grammar's compile time grows with the square of an "
                f"object's optional properties)"
            )
        if self.chars > MAX_STRING_CHARS:
            return (
                f"{self.chars} characters of property names, definition names, enum values and const values in "
                f"all; at most {MAX_STRING_CHARS} are supported (the grammar's compile time grows with the "
                f"length of the names of an object's optional properties)"
            )
        return None


def _value_chars(value: object) -> int:
    """The characters `SchemaSize` counts for an ``enum`` or ``const`` value: a string's
    length, else the length of its JSON text (which `str` gives for a number, true, false or
    null; quicker than JSON for thousands of them)."""
    if isinstance(value, str):
        return len(value)
    return len(canonical_json(value)) if isinstance(value, (dict, list)) else len(str(value))


def unenforced(root: dict) -> tuple[str, str] | None:
    """The first place in `root` (a schema that passed its metaschema check) that xgrammar
    would not enforce, as (JSON path such as ``$.properties.a``, what is wrong), or None.
    Walks the schema tree from the root, and each definition a local ``$ref`` reaches once
    (xgrammar never reads a definition nothing refers to, so neither does this check);
    iterative: any depth."""
    stack: list[tuple[object, str]] = [(root, "$")]
    followed = {"#"}
    while stack:
        node, path = stack.pop()
        if not isinstance(node, dict):
            continue
        problem = _node_problem(node, root)
        if problem is not None:
            return path, problem
        children = [(node[k], f"{path}.{k}") for k in SUBSCHEMAS if k in node]
        for k in SUBSCHEMA_LISTS:
            if isinstance(node.get(k), list):
                children += [(sub, f"{path}.{k}[{i}]") for i, sub in enumerate(node[k])]
        for k in SUBSCHEMA_MAPS:
            if isinstance(node.get(k), dict):
                children += [(sub, f"{path}.{k}.{name}") for name, sub in node[k].items()]
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/") and ref not in followed:
            followed.add(ref)
            children.append((_pointer(ref, root), "$" + "".join(f".{p}" for p in _pointer_parts(ref))))
        stack.extend(reversed(children))
    return None


def _node_problem(node: dict, root: dict) -> str | None:
    """What xgrammar would not enforce in `node` itself (not its subschemas), or None;
    `root` resolves local references."""
    for k in IGNORED:
        if k in node:
            return f"`{k}` cannot be enforced"
    if node.get("uniqueItems") is True:
        return "`uniqueItems` cannot be enforced"
    ref = node.get("$ref")
    if isinstance(ref, str) and not (ref == "#" or ref.startswith("#/")):
        return f"`$ref` {ref!r} is not a local JSON pointer (# or #/...); only those can be enforced"
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
        return "`allOf` with more than one schema cannot be enforced (only one)"
    combinators = [k for k in COMBINATORS if k in node]
    if combinators:
        others = sorted(k for k in node if k in ASSERTIONS and k not in combinators)
        if len(combinators) > 1 or others:
            kept = combinators[0]
            return (
                f"`{kept}` cannot be combined with {', '.join(f'`{k}`' for k in combinators[1:] + others)} "
                f"in one schema (only `{kept}` would be enforced); move them into the referenced schema or "
                f"into each branch"
            )
    if "oneOf" in node:
        return _oneof_problem(node["oneOf"], root)
    if "enum" in node or "const" in node:
        return _values_problem(node, root)
    if "type" not in node:
        keys = set(node)
        if keys & SCALAR_KW:
            return f"`{sorted(keys & SCALAR_KW)[0]}` needs a `type` beside it to be enforced"
        if keys & OBJECT_KW and not keys & {"properties", "additionalProperties"}:
            return f'`{sorted(keys & OBJECT_KW)[0]}` needs `type: "object"` beside it to be enforced'
        if keys & ARRAY_KW and not keys & {"items", "prefixItems"}:
            return f'`{sorted(keys & ARRAY_KW)[0]}` needs `type: "array"` beside it to be enforced'
    scalar = _string_problem(node) or _multiple_problem(node) or _range_problem(node)
    if scalar is not None:
        return scalar
    props = node.get("properties")
    required = node.get("required")
    is_object = isinstance(props, dict) or node.get("type") == "object" or "object" in (node.get("type") or [])
    if isinstance(required, list) and is_object:
        missing = [name for name in required if name not in (props or {})]
        if missing:
            return f"required property {missing[0]!r} is not in `properties`, so it would never be written"
    return None


def _string_problem(node: dict) -> str | None:
    """String keywords of `node` that another one makes xgrammar drop, or None."""
    lengths = [k for k in ("minLength", "maxLength") if k in node]
    if node.get("format") in FORMATS:
        dropped = [k for k in ("pattern", *lengths) if k in node]
        if dropped:
            return (
                f"`format: {node['format']}` cannot be combined with {', '.join(f'`{k}`' for k in dropped)} "
                f"(only the format would be enforced)"
            )
    elif "pattern" in node and lengths:
        return (
            f"`pattern` cannot be combined with {', '.join(f'`{k}`' for k in lengths)} (only the pattern "
            f"would be enforced); write the length into the pattern"
        )
    return None


def _multiple_problem(node: dict) -> str | None:
    """Why xgrammar would drop `node`'s ``multipleOf``, or None (none, or one it enforces)."""
    m = node.get("multipleOf")
    if not isinstance(m, (int, float)) or isinstance(m, bool):
        return None
    types = node.get("type") if isinstance(node.get("type"), list) else [node.get("type")]
    if "number" in types:
        return "`multipleOf` on a `number` cannot be enforced (only on an `integer`)"
    if "integer" not in types or m == 1:
        return None  # not a number here (any type-less use is refused above); every integer is a multiple of 1
    if not float(m).is_integer() or not 1 <= m <= MAX_MULTIPLE_OF:
        return f"`multipleOf: {m}` cannot be enforced on an `integer` (only a whole number from 1 to {MAX_MULTIPLE_OF})"
    bound = {
        k: v
        for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
        if isinstance(v := node.get(k), (int, float)) and not isinstance(v, bool)
    }
    if not bound:
        return None
    lows = [math.ceil(v) if k == "minimum" else math.floor(v) + 1 for k, v in bound.items() if "inimum" in k]
    highs = [math.floor(v) if k == "maximum" else math.ceil(v) - 1 for k, v in bound.items() if "aximum" in k]
    lo, hi = max(lows, default=None), min(highs, default=None)
    if lo is None or hi is None:
        return (
            f"`multipleOf` cannot be combined with {', '.join(f'`{k}`' for k in bound)} alone (the multiple "
            f"would not be enforced); give both a lower and an upper bound"
        )
    if hi - lo + 1 > MAX_MULTIPLE_OF_SPAN:
        return (
            f"`multipleOf` cannot be enforced with a range of {hi - lo + 1} integers (at most {MAX_MULTIPLE_OF_SPAN:,})"
        )
    return None


def _range_problem(node: dict) -> str | None:
    """Why xgrammar could write no value in `node`'s ``number`` range, or None: a range
    bounded on both sides that holds no number of at most `NUMBER_DECIMALS` decimal places.
    An empty or inverted range is left to xgrammar, which refuses it itself."""
    types = node.get("type") if isinstance(node.get("type"), list) else [node.get("type")]
    if "number" not in types:
        return None
    bounds = {
        k: v
        for k in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum")
        if isinstance(v := node.get(k), (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }
    lows = sorted(
        ((Decimal(str(v)), k == "exclusiveMinimum", v) for k, v in bounds.items() if "inimum" in k), reverse=True
    )
    highs = sorted((Decimal(str(v)), k == "maximum", v) for k, v in bounds.items() if "aximum" in k)
    if not lows or not highs:
        return None
    (lo, lo_open, low), (hi, hi_closed, high) = lows[0], highs[0]
    if lo > hi or (lo == hi and (lo_open or not hi_closed)):
        return None
    step = Decimal(1).scaleb(-NUMBER_DECIMALS)
    first = (lo / step).to_integral_value(ROUND_CEILING) * step
    if lo_open and first == lo:
        first += step
    if first < hi or (hi_closed and first == hi):
        return None
    return (
        f"the range from {low} to {high} holds no number of at most {NUMBER_DECIMALS} decimal places, the "
        f"most a bounded `number` is written with, so no value could be written"
    )


def _values_problem(node: dict, root: dict) -> str | None:
    """A listed enum / const value that fails the node's other assertions, or None."""
    rest = {k: v for k, v in node.items() if k in ASSERTIONS and k not in ("enum", "const")}
    if not rest:
        return None
    values = ([node["const"]] if "const" in node else []) + list(node.get("enum") or [])
    validator = validator_for(root, default=jsonschema.Draft202012Validator)(root).evolve(schema=rest)
    for value in values:
        if not validator.is_valid(value):
            return (
                f"the listed value {json.dumps(value)[:80]} fails the schema's other keywords "
                f"({', '.join(sorted(rest))}) and would still be written"
            )
    return None


def _pointer_parts(ref: str) -> list[str]:
    """The unescaped parts of the local JSON pointer `ref` (``#`` or ``#/a/b``; RFC 6901)."""
    return [p.replace("~1", "/").replace("~0", "~") for p in ref[2:].split("/")] if ref != "#" else []


def _pointer(ref: str, root: dict) -> object:
    """What the local JSON pointer `ref` points at in `root` (object keys and list indexes), or
    None when it does not resolve."""
    target: object = root
    for part in _pointer_parts(ref):
        if isinstance(target, dict):
            target = target.get(part)
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            return None
    return target


def _resolve(node: object, root: dict) -> object:
    """`node` with local ``$ref``s followed (at most `_REF_DEPTH`); a pointer that does not
    resolve gives None (xgrammar refuses those itself)."""
    for _ in range(_REF_DEPTH):
        if not (isinstance(node, dict) and isinstance(node.get("$ref"), str)):
            return node
        node = _pointer(node["$ref"], root)
    return None


def _json_types(node: object, root: dict, depth: int = 0) -> set[str] | None:
    """The JSON types `node` allows ("integer" counted as "number"), None when unknown (any)."""
    node = _resolve(node, root)
    if not isinstance(node, dict) or depth > _REF_DEPTH:
        return None
    if "const" in node or "enum" in node:
        values = [node["const"]] if "const" in node else node["enum"]
        return {_type_of(v) for v in values}
    if "type" in node:
        types = node["type"] if isinstance(node["type"], list) else [node["type"]]
        return {"number" if t == "integer" else t for t in types}
    branches = node.get("anyOf") or node.get("oneOf") or node.get("allOf")
    if isinstance(branches, list):
        out: set[str] = set()
        for b in branches:
            t = _json_types(b, root, depth + 1)
            if t is None:
                return None
            out |= t
        return out
    if node.keys() & {"properties", "additionalProperties"}:
        return {"object"}
    if node.keys() & {"items", "prefixItems"}:
        return {"array"}
    return None


def _type_of(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


def _tags(node: object, root: dict, name: str) -> set[str] | None:
    """The canonical JSON of the values property `name` may take in object schema `node`
    when it is required there and pinned by const / enum; else None."""
    node = _resolve(node, root)
    if not (isinstance(node, dict) and name in (node.get("required") or [])):
        return None
    prop = _resolve((node.get("properties") or {}).get(name), root)
    if not isinstance(prop, dict) or not ("const" in prop or "enum" in prop):
        return None
    values = [prop["const"]] if "const" in prop else prop["enum"]
    return {json.dumps(v, sort_keys=True) for v in values}


PAIRWISE_LIMIT = 64
"""``oneOf`` branches up to which each pair may be told apart by its own criterion; above
it, all branches must be told apart by type, or all by one discriminator (linear checks, so
a schema of thousands of branches costs milliseconds)."""


def _oneof_problem(branches: list, root: dict) -> str | None:
    """None when no two branches of a ``oneOf`` can match one value (by type, or by a
    required discriminator property), else why it cannot be enforced."""
    types = [_json_types(b, root) for b in branches]
    if all(t is not None for t in types) and _disjoint(types):
        return None
    resolved = [_resolve(b, root) for b in branches]
    if all(isinstance(r, dict) for r in resolved):
        first = resolved[0]
        pinned = [n for n in first.get("required") or [] if isinstance(n, str) and _tags(first, root, n) is not None]
        for name in pinned[:8]:
            tags = [_tags(r, root, name) for r in resolved]
            if all(t is not None for t in tags) and _disjoint(tags):
                return None
    advice = (
        "`oneOf` is enforced as `anyOf`; use `anyOf`, or tell the branches apart by type or by a required "
        "property with distinct `const` values"
    )
    if len(branches) > PAIRWISE_LIMIT:
        return f"`oneOf` branches may match the same value: {advice}"
    for i in range(len(branches)):
        for j in range(i + 1, len(branches)):
            if types[i] is not None and types[j] is not None and not types[i] & types[j]:
                continue
            a, b = resolved[i], resolved[j]
            names = (
                set((a or {}).get("required") or []) & set((b or {}).get("required") or [])
                if isinstance(a, dict) and isinstance(b, dict)
                else set()
            )
            if any(
                (ta := _tags(a, root, n)) is not None and (tb := _tags(b, root, n)) is not None and not ta & tb
                for n in sorted(n for n in names if isinstance(n, str))
            ):
                continue
            if types[i] == types[j] == {"object"} and _lacks_required(a, b) and _lacks_required(b, a):
                continue
            return f"`oneOf` branches {i} and {j} may both match a value: {advice}"
    return None


def _lacks_required(writer: object, reader: object) -> bool:
    """Whether no object that the grammar writes for schema `writer` can match object schema
    `reader`: `reader` requires a property `writer` does not list, and `writer` admits no
    other property (strict mode writes only the listed ones unless ``additionalProperties``
    or ``patternProperties`` is a schema). Both are resolved nodes; False when unsure."""
    if not (isinstance(writer, dict) and isinstance(reader, dict)):
        return False
    if writer.keys() & {*COMBINATORS, "patternProperties"}:
        return False
    if isinstance(writer.get("additionalProperties"), dict):
        return False
    listed = writer.get("properties") if isinstance(writer.get("properties"), dict) else {}
    return any(name not in listed for name in reader.get("required") or [] if isinstance(name, str))


def _disjoint(sets: list[set[str]]) -> bool:
    """Whether no value lies in two of `sets` (linear: the sizes add up to the union's)."""
    return sum(len(s) for s in sets) == len(set().union(*sets))
