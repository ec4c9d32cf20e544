"""JSON schemas at and over the grammar's size limits, and the response_format that carries one."""

from __future__ import annotations


def schema_format(schema, **extra) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": schema, **extra}}


def _properties(n: int) -> dict:
    """An object schema of `n` object properties in all (`SchemaSize` counts them): two of its
    own, those of the object one holds and those of a definition the other refers to."""
    inner = n - 2 - (n - 2) // 2
    return {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {f"a{i}": {"type": "string"} for i in range(inner)}},
            "b": {"$ref": "#/$defs/B"},
        },
        "$defs": {"B": {"type": "object", "properties": {f"b{i}": {"type": "integer"} for i in range((n - 2) // 2)}}},
    }


def _characters(n: int) -> dict:
    """A schema whose property names, definition name, enum value and const value have `n`
    characters in all (names 300, the const 100)."""
    return {
        "type": "object",
        "properties": {
            "n" * 100: {"$ref": "#/$defs/" + "D" * 100},
            "e" * 100: {"type": "string", "enum": ["v" * (n - 400)]},
        },
        "$defs": {"D" * 100: {"const": "c" * 100}},
    }
