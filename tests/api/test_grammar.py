"""Structured output's size limits through each API, in-process against the fake manager
(`tests.support.fake_app`): a schema (or a tool's) over the limits is refused naming them.
The building blocks: tests/unit/test_grammar.py."""

from __future__ import annotations

import json

import pytest

from tests.support.schemas import _characters, _properties, schema_format

SCHEMA_BODIES = [  # (path, the body of a request with `schema`, the error's param, its message's field)
    (
        "/v1/chat/completions",
        lambda schema: {
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 8,
            "response_format": schema_format(schema),
        },
        "response_format",
        "response_format.json_schema.schema",
    ),
    (
        "/v1/responses",
        lambda schema: {
            "model": "m",
            "input": "Hi",
            "max_output_tokens": 8,
            "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}},
        },
        "text.format",
        "text.format.schema",
    ),
    (
        "/generate",
        lambda schema: {"text": "Hi", "sampling_params": {"max_new_tokens": 8, "json_schema": json.dumps(schema)}},
        "sampling_params.json_schema",
        "sampling_params.json_schema",
    ),
    (
        "/v1/messages",
        lambda schema: {
            "model": "m",
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "Hi"}],
            "output_config": {"format": {"type": "json_schema", "schema": schema}},
        },
        "output_config.format",
        "output_config.format.schema",
    ),
]


@pytest.mark.parametrize(("path", "body", "param", "field"), SCHEMA_BODIES)
def test_each_api_refuses_a_schema_over_the_size_limits_naming_them(tokenizer, path, body, param, field):
    """Every API that takes a schema for its output answers one just over a size limit with
    a 400 whose body names the field, the count and the limit, and sends nothing to the
    model; one at the limits is served with its grammar. (A tool's parameters are checked
    alike, and together with the other tools of the grammar: see the test below.)"""
    from tests.support.fake_app import AGENT_PARSERS, HELLO, app_client
    from tokenizer_proc.structured.schema_enforce import MAX_PROPERTIES, MAX_STRING_CHARS

    client, manager = app_client(tokenizer, HELLO, AGENT_PARSERS)
    for schema, says in (
        (_properties(MAX_PROPERTIES + 1), f"has {MAX_PROPERTIES + 1} object properties in all"),
        (
            _characters(MAX_STRING_CHARS + 1),
            f"has {MAX_STRING_CHARS + 1} characters of property names, definition names, enum values and const values",
        ),
    ):
        r = client.post(path, json=body(schema))
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and error["message"].startswith(f"{field} {says}"), error
        assert "at most" in error["message"] and manager.sent == []
    for schema in (_properties(MAX_PROPERTIES), _characters(MAX_STRING_CHARS)):
        r = client.post(path, json=body(schema))
        assert r.status_code == 200, r.text
        assert manager.sent[-1].grammar is not None
    assert len(manager.sent) == 2


def test_tool_schemas_over_the_size_limits_are_refused_naming_the_tool(tokenizer):
    """A tool's parameters over a size limit are a 400 naming the tool as the API calls it;
    tools within the limits that a forced call's grammar holds together, naming ``tools``."""
    from tests.support.fake_app import AGENT_PARSERS, HELLO, app_client
    from tokenizer_proc.structured.schema_enforce import MAX_PROPERTIES

    client, manager = app_client(tokenizer, HELLO, AGENT_PARSERS)
    hi = [{"role": "user", "content": "Hi"}]
    r = client.post(
        "/v1/messages",
        json={
            "model": "m",
            "max_tokens": 8,
            "messages": hi,
            "tool_choice": {"type": "any"},
            "tools": [{"name": "f", "input_schema": _properties(MAX_PROPERTIES + 1)}],
        },
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools.0.input_schema", r.text
    assert r.json()["error"]["message"].startswith(f"tools.0.input_schema has {MAX_PROPERTIES + 1} object properties")
    tools = [
        {"type": "function", "function": {"name": f"f{i}", "parameters": _properties(MAX_PROPERTIES // 2 + 1)}}
        for i in range(2)
    ]
    r = client.post(
        "/v1/chat/completions", json={"messages": hi, "max_tokens": 8, "tools": tools, "tool_choice": "required"}
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
    assert f"have {MAX_PROPERTIES + 2} object properties in all" in r.json()["error"]["message"]
    assert manager.sent == []
