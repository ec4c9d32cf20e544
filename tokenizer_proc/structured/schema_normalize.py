"""A JSON schema rewritten so that xgrammar accepts it under `protocol.grammar.JSON_SCHEMA_OPTIONS`
while the same instances validate against it (`for_grammar`).

xgrammar 0.2.9 refuses two kinds of valid, satisfiable schemas:

- an ``integer`` bound that is not a whole number (``"minimum": 0.5``: "Integer constraint
  must be a whole number"). For integers, ``minimum: 0.5`` and ``exclusiveMinimum: 0.5`` both
  mean ``minimum: 1`` (and ``maximum: 2.5`` / ``exclusiveMaximum: 2.5`` mean ``maximum: 2``);
- a count its strict mode cannot reach: strict mode writes no array item beyond
  ``prefixItems`` when ``items`` is absent, and no property beyond ``properties`` when
  ``additionalProperties`` is absent, so ``{"type": "array", "minItems": 2}`` or
  ``{"type": "object", "minProperties": 1}`` match nothing ("minItems is greater than the number
  of prefixItems, but additional items are not allowed"). JSON Schema reads an absent
  ``items`` / ``additionalProperties`` as ``{}`` (anything), so such a node gets that ``{}``
  spelled out, and strict mode then writes the items or properties the count asks for.
"""

from __future__ import annotations

import math

from tokenizer_proc.structured.schema_enforce import SUBSCHEMA_LISTS, SUBSCHEMA_MAPS, SUBSCHEMAS

_DEFINITIONS = ("$defs", "definitions")


def for_grammar(schema: object) -> object:
    """A copy of `schema` (a decoded JSON value, already checked against its metaschema) with
    the rewrites of the module docstring applied at every subschema (nested schemas,
    union branches, definitions); the input is not changed. Recursion follows the nesting,
    which the callers bound first (`schema_enforce.SchemaSize`)."""
    if not isinstance(schema, dict):
        return schema
    node = dict(schema)
    for key in SUBSCHEMAS:
        if key in node:
            node[key] = for_grammar(node[key])
    for key in SUBSCHEMA_LISTS:
        if isinstance(node.get(key), list):
            node[key] = [for_grammar(sub) for sub in node[key]]
    for key in (*SUBSCHEMA_MAPS, *_DEFINITIONS):
        if isinstance(node.get(key), dict):
            node[key] = {name: for_grammar(sub) for name, sub in node[key].items()}
    _whole_integer_bounds(node)
    _open_for_counts(node)
    return node


def _types(node: dict) -> set:
    kind = node.get("type")
    return set(kind) if isinstance(kind, list) else {kind}


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole_integer_bounds(node: dict) -> None:
    """Bounds of an integer-only node as the whole numbers they stand for (in place)."""
    if _types(node) & {"number"} or "integer" not in _types(node):
        return
    for exclusive, inclusive, whole, tighter in (
        ("exclusiveMinimum", "minimum", math.floor, max),
        ("exclusiveMaximum", "maximum", math.ceil, min),
    ):
        bound = node.get(inclusive)
        if _number(bound) and bound != int(bound):
            node[inclusive] = math.ceil(bound) if inclusive == "minimum" else math.floor(bound)
        bound = node.get(exclusive)
        if _number(bound) and bound != int(bound):  # integer > 0.5 <=> integer >= 1
            del node[exclusive]
            value = whole(bound) + (1 if inclusive == "minimum" else -1)
            node[inclusive] = tighter(node[inclusive], value) if _number(node.get(inclusive)) else value


def _open_for_counts(node: dict) -> None:
    """Spell out ``items: {}`` / ``additionalProperties: {}`` where a count needs more items
    or properties than strict mode would write (in place)."""
    if "items" not in node and "unevaluatedItems" not in node:
        listed = len(node["prefixItems"]) if isinstance(node.get("prefixItems"), list) else 0
        if _number(node.get("minItems")) and node["minItems"] > listed:
            node["items"] = {}
    if "additionalProperties" not in node and "unevaluatedProperties" not in node and "patternProperties" not in node:
        listed = len(node["properties"]) if isinstance(node.get("properties"), dict) else 0
        if _number(node.get("minProperties")) and node["minProperties"] > listed:
            node["additionalProperties"] = {}
