"""Unit tests of structured output's building blocks: request checks (`structured.check`),
the tokenizer hand-off, the scheduler's compile backend and per-request matcher, and the
packed token mask. Generation is simulated: a seeded fake sampler picks among the tokens
each mask allows, and the real SmolLM2 tokenizer decodes the result."""

from __future__ import annotations

import ast
import json
import re
import threading
import time

import jsonschema
import numpy as np
import pytest

from protocol.endpoints import GRAMMAR_TOKENIZER_FILE
from protocol.enums import GrammarKind
from protocol.messages import GrammarSpec
from protocol.token_mask import allowed_ids, mask_words
from scheduler_proc.grammar import GrammarBackend, GrammarError, RowGrammar
from tests.support.schemas import _characters, _properties, schema_format
from text.hf_tokenizer import model_facts
from tokenizer_proc.errors import APIError
from tokenizer_proc.structured.check import from_native, from_response_format
from tokenizer_proc.structured.tokenizer_info import write_grammar_tokenizer

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
PERSON_TEXT = (
    '{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},'
    '"required":["name","age"],"additionalProperties":false}'
)
EOS = 2  # SmolLM2's <|im_end|>, the model's only EOS id
VOCAB = 49152


def spec_grammar(spec: GrammarSpec):
    """The ``xgrammar.Grammar`` of a JSON_SCHEMA or EBNF spec, as the scheduler builds it."""
    import xgrammar

    from protocol.grammar import JSON_SCHEMA_OPTIONS

    if spec.kind == GrammarKind.EBNF:
        return xgrammar.Grammar.from_ebnf(spec.text)
    return xgrammar.Grammar.from_json_schema(spec.text, **JSON_SCHEMA_OPTIONS)


# ------------------------------------------------------------------ request checks
@pytest.mark.parametrize(
    ("rf", "expected"),
    [
        (None, None),
        ({"type": "text"}, None),
        ({"type": "json_object"}, GrammarSpec(GrammarKind.JSON_OBJECT, "")),
        (schema_format(PERSON, strict=True), GrammarSpec(GrammarKind.JSON_SCHEMA, PERSON_TEXT)),
        (schema_format(PERSON, strict=False), GrammarSpec(GrammarKind.JSON_SCHEMA, PERSON_TEXT)),
        (
            schema_format({"properties": {"b": {}, "a": {}}}),  # key order kept: it is the output's order
            GrammarSpec(GrammarKind.JSON_SCHEMA, '{"properties":{"b":{},"a":{}}}'),
        ),
    ],
)
def test_response_format_specs(rf, expected):
    assert from_response_format(rf) == expected


@pytest.mark.parametrize(
    ("rf", "problem"),
    [
        ("json", "must be an object with a `type`"),
        ({"type": "xml"}, "got 'xml'"),
        ({"type": "json_schema"}, "json_schema must be an object"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "schema is missing"),
        (schema_format([PERSON]), "must be a JSON object, got list"),
        (schema_format(PERSON, strict="yes"), "strict must be a boolean"),
        (schema_format({"type": "nonsense"}), "not a valid JSON schema: 'nonsense' is not valid under any"),
        (schema_format({"type": "object", "properties": []}), "not a valid JSON schema: [] is not of type 'object'"),
        (
            schema_format({"properties": {"a": {"$ref": "#/defs/x"}}}),
            "not supported for structured output: Cannot find field 'defs'",
        ),
        (schema_format({"type": "integer", "minimum": 5, "maximum": 2}), "minimum greater than maximum"),
    ],
)
def test_response_format_errors(rf, problem):
    with pytest.raises(APIError) as e:
        from_response_format(rf)
    assert (e.value.status, e.value.param) == (400, "response_format")
    assert problem in e.value.message
    assert "/project/cpp" not in e.value.message  # xgrammar's log prefix is stripped


def _prop(sub: dict) -> dict:
    return {"type": "object", "properties": {"e": sub}, "required": ["e"]}


# Each schema below is valid and compiles, but xgrammar would treat a keyword as "any value":
# the instance beside it passes that grammar (checked) and fails the schema, so a request
# would end "stop" with output that does not validate. Each is a 400 naming the place.
UNENFORCED = [
    (_prop({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}), '{"e": [1, 1]}', "uniqueItems"),
    (_prop({"type": "array", "items": {"type": "integer"}, "contains": {"const": 3}}), '{"e": [1]}', "contains"),
    (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "dependentRequired": {"a": ["b"]},
        },
        '{"a": 1}',
        "dependentRequired",
    ),
    (_prop({"type": "integer", "not": {"const": 3}}), '{"e": 3}', "`not`"),
    (
        {
            "type": "object",
            "properties": {"e": {"type": "integer"}},
            "if": {"properties": {"e": {"const": 1}}},
            "then": {"required": ["e"]},
        },
        "{}",
        "`if`",
    ),
    ({"type": "object", "properties": {}, "required": ["a"]}, "{}", "required property 'a' is not in `properties`"),
    (_prop({"allOf": [{"type": "integer"}, {"minimum": 5}]}), '{"e": 1}', "`allOf` with more than one"),
    (
        _prop({"type": "integer", "minimum": 0, "anyOf": [{"maximum": 3}, {"minimum": 10}]}),
        '{"e": -5}',
        "`anyOf` cannot be combined with `minimum`, `type`",
    ),
    (
        {
            "$defs": {"n": {"type": "object", "properties": {"a": {"type": "integer"}}}},
            "type": "object",
            "properties": {"e": {"$ref": "#/$defs/n", "required": ["a"]}},
            "required": ["e"],
        },
        '{"e": {}}',
        "`$ref` cannot be combined with `required`",
    ),
    (
        {"$defs": {"n": {"$anchor": "num", "type": "integer"}}, **_prop({"$ref": "#num"})},
        '{"e": "s"}',
        "not a local JSON pointer",
    ),
    (_prop({"oneOf": [{"type": "integer"}, {"type": "number"}]}), '{"e": 1}', "`oneOf` branches 0 and 1 may both"),
    (_prop({"type": "string", "enum": ["a", 1]}), '{"e": 1}', "the listed value 1 fails"),
    (_prop({"minimum": 5}), '{"e": 1}', "`minimum` needs a `type`"),
    (_prop({"required": ["a"]}), '{"e": {}}', '`required` needs `type: "object"`'),
    (
        _prop({"$ref": "#/$defs/U"})
        | {"$defs": {"U": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}}},
        '{"e": [1, 1]}',
        "`uniqueItems` cannot be enforced (at $.$defs.U)",
    ),  # a definition a $ref reaches
    # keywords xgrammar drops beside others (each request ended "stop" with a value the schema refuses)
    (_prop({"type": "number", "multipleOf": 0.5}), '{"e": 1.3}', "`multipleOf` on a `number`"),
    (_prop({"type": ["integer", "number"], "multipleOf": 3}), '{"e": 4}', "`multipleOf` on a `number`"),
    (_prop({"type": "integer", "multipleOf": 1.5}), '{"e": 4}', "`multipleOf: 1.5` cannot be enforced"),
    (_prop({"type": "integer", "multipleOf": 1025}), '{"e": 1024}', "`multipleOf: 1025` cannot be enforced"),
    (_prop({"type": "integer", "multipleOf": 3, "minimum": 0}), '{"e": 4}', "give both a lower and an upper"),
    (
        _prop({"type": "integer", "multipleOf": 3, "minimum": 0, "maximum": 10000}),
        '{"e": 4}',
        "a range of 10001 integers",
    ),
    (
        _prop({"type": "string", "pattern": "^a+$", "maxLength": 2}),
        '{"e": "aaaa"}',
        "`pattern` cannot be combined with `maxLength`",
    ),
    (
        _prop({"type": "string", "format": "email", "minLength": 10}),
        '{"e": "a@b.co"}',
        "`format: email` cannot be combined with `minLength`",
    ),
    (
        _prop({"type": "string", "format": "date", "pattern": "^2"}),
        '{"e": "1999-01-01"}',
        "`format: date` cannot be combined with `pattern`",
    ),
]


@pytest.mark.parametrize(("schema", "leak", "problem"), UNENFORCED)
def test_schema_keywords_the_grammar_cannot_enforce_are_refused(schema, leak, problem):
    import xgrammar
    from xgrammar.testing import _is_grammar_accept_string

    from protocol.grammar import JSON_SCHEMA_OPTIONS

    grammar = xgrammar.Grammar.from_json_schema(json.dumps(schema), **JSON_SCHEMA_OPTIONS)
    assert _is_grammar_accept_string(grammar, leak)  # the fault this check stands in front of
    assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads(leak))
    with pytest.raises(APIError) as e:
        from_response_format(schema_format(schema))
    assert (e.value.status, e.value.param) == (400, "response_format")
    assert "not supported for structured output" in e.value.message and problem in e.value.message
    with pytest.raises(APIError) as e:
        from_native(json.dumps(schema), None, None)
    assert e.value.param == "sampling_params.json_schema" and problem in e.value.message


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        (_prop({"type": "number", "minimum": 1e-10, "maximum": 1e-9}), "the range from 1e-10 to 1e-09 holds no number"),
        (
            _prop({"type": ["number", "null"], "exclusiveMinimum": 0.9999995, "exclusiveMaximum": 1}),
            "the range from 0.9999995 to 1 holds no number of at most 6 decimal places",
        ),
        (_prop({"type": "number", "minimum": 123456789.1234567, "maximum": 123456789.1234568}), "holds no number"),
    ],
)
def test_number_ranges_the_grammar_writes_no_value_in_are_refused(schema, problem):
    """xgrammar writes a bounded number with at most 6 decimal places: for a range that holds
    none its rule is empty, and the output left the value out (a 200 with '{"e": }', finish
    "stop"). Such a schema is a 400 naming the place."""
    import xgrammar
    from xgrammar.testing import _is_grammar_accept_string

    from protocol.grammar import JSON_SCHEMA_OPTIONS

    grammar = xgrammar.Grammar.from_json_schema(json.dumps(schema), **JSON_SCHEMA_OPTIONS)
    assert _is_grammar_accept_string(grammar, '{"e": }')  # the fault: not JSON
    with pytest.raises(APIError) as e:
        from_response_format(schema_format(schema))
    assert (e.value.status, e.value.param) == (400, "response_format")
    assert "(at $.properties.e)" in e.value.message and problem in e.value.message


@pytest.mark.parametrize(
    "schema",
    [
        _prop({"type": "string", "enum": ["a", "b"]}),  # siblings every listed value meets
        _prop({"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None, "title": "E"}),  # annotations
        _prop({"oneOf": [{"type": "integer"}, {"type": "string"}]}),  # disjoint by type
        {
            "$defs": {
                "Cat": {"type": "object", "properties": {"kind": {"const": "cat"}}, "required": ["kind"]},
                "Dog": {"type": "object", "properties": {"kind": {"const": "dog"}}, "required": ["kind"]},
            },
            **_prop(
                {"oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}], "discriminator": {"propertyName": "kind"}}
            ),
        },
        _prop({"allOf": [{"$ref": "#/$defs/n"}], "description": "x"}) | {"$defs": {"n": {"type": "integer"}}},
        {
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                    "required": ["kids"],
                }
            },
            "$ref": "#/$defs/node",
        },
        # a definition nothing refers to is never read by xgrammar (it was refused for its uniqueItems)
        _prop({"type": "integer"}) | {"$defs": {"Unused": {"type": "array", "uniqueItems": True}}},
        # a pointer through a list index resolves (the oneOf was refused as "may both match")
        _prop({"oneOf": [{"$ref": "#/$defs/U/anyOf/0"}, {"type": "string"}]})
        | {"$defs": {"U": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}},
    ],
)
def test_schemas_the_grammar_enforces_are_accepted(schema):
    assert from_response_format(schema_format(schema)).kind == GrammarKind.JSON_SCHEMA


@pytest.mark.parametrize(
    ("schema", "instance"),
    [
        (_prop({"type": "integer", "multipleOf": 3}), '{"e": 4}'),
        (_prop({"type": ["integer", "null"], "multipleOf": 3.0}), '{"e": 4}'),
        (_prop({"type": "integer", "multipleOf": 1024}), '{"e": 1023}'),
        (_prop({"type": "integer", "multipleOf": 3, "minimum": 1, "maximum": 10000}), '{"e": 4}'),
        (_prop({"type": "integer", "multipleOf": 3, "exclusiveMinimum": 0, "exclusiveMaximum": 100}), '{"e": 4}'),
        (_prop({"type": "number", "exclusiveMinimum": 0.9999995, "maximum": 1}), '{"e": 0.9}'),  # 1 lies in the range
        (_prop({"type": "number", "minimum": 1e-7, "maximum": 1e-6}), '{"e": 0.00001}'),  # 0.000001 lies in it
        (_prop({"type": "string", "pattern": "^a$"}), '{"e": "b"}'),
        (_prop({"type": "string", "minLength": 2, "maxLength": 3}), '{"e": "abcd"}'),
        (
            _prop({"type": "string", "format": "regex", "maxLength": 2}),
            '{"e": "abc"}',
        ),  # a format xgrammar leaves as text
    ],
)
def test_numeric_and_string_keywords_the_grammar_enforces_are_accepted(schema, instance):
    """The keyword combinations next to the refused ones above that the grammar does enforce
    (xgrammar's, or ours for strings): accepted, and the grammar refuses the invalid instance."""
    from xgrammar.testing import _is_grammar_accept_string

    assert not jsonschema.Draft202012Validator(schema).is_valid(json.loads(instance))
    assert not _is_grammar_accept_string(spec_grammar(from_response_format(schema_format(schema))), instance)


@pytest.mark.parametrize(
    ("rf", "key"),
    [
        ({"type": "json_object", "schema": PERSON}, "response_format.schema"),  # was free JSON, not PERSON
        ({"type": "text", "format": "x"}, "response_format.format"),
        ({**schema_format(PERSON), "strict": True}, "response_format.strict"),
        (
            {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict_mode": True}},
            "response_format.json_schema.strict_mode",
        ),
    ],
)
def test_response_format_unknown_keys_are_refused(rf, key):
    with pytest.raises(APIError) as e:
        from_response_format(rf)
    assert (e.value.status, e.value.param) == (400, "response_format")
    assert e.value.message.startswith(f"{key} is not a known field")


def test_response_format_json_schema_description_is_accepted():
    rf = {"type": "json_schema", "json_schema": {"name": "p", "description": "a person", "schema": PERSON}}
    assert from_response_format(rf) == GrammarSpec(GrammarKind.JSON_SCHEMA, PERSON_TEXT)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((None, None, None), None),
        ((json.dumps(PERSON, indent=2), None, None), GrammarSpec(GrammarKind.JSON_SCHEMA, PERSON_TEXT)),
        ((None, r"[a-z]+-\d{2}", None), GrammarSpec(GrammarKind.REGEX, r"[a-z]+-\d{2}")),
        ((None, None, 'root ::= "yes" | "no"'), GrammarSpec(GrammarKind.EBNF, 'root ::= "yes" | "no"')),
    ],
)
def test_native_specs(args, expected):
    assert from_native(*args) == expected


@pytest.mark.parametrize(
    ("args", "param", "problem"),
    [
        (("{}", "a+", None), "regex", "at most one of json_schema, regex and ebnf; got json_schema, regex"),
        ((None, "a+", 'root ::= "a"'), "ebnf", "got regex, ebnf"),
        (("{not json", None, None), "json_schema", "sampling_params.json_schema is not valid JSON"),
        (("[1, 2]", None, None), "json_schema", "sampling_params.json_schema must be a JSON object, got list"),
        (('{"type": "nonsense"}', None, None), "json_schema", "not a valid JSON schema"),
        (
            (None, "(ab", None),
            "regex",
            "sampling_params.regex is invalid: Regex parsing error at position 4: The parenthesis is not closed.",
        ),
        ((None, "a(?=b)", None), "regex", "Lookahead is not supported"),
        # xgrammar reports these in the EBNF it converted the regex to: no position the client could use
        (
            (None, "a{5,2}", None),
            "regex",
            "sampling_params.regex is invalid: Lower bound is larger than upper bound: 5 > 2",
        ),
        ((None, "[z-a]", None), "regex", "is invalid: Invalid character class: lower bound is larger than upper bound"),
        (
            (None, None, "root ::= foo"),
            "ebnf",
            'sampling_params.ebnf is invalid: EBNF parser error at line 1, column 10: Rule "foo" is not defined',
        ),
        ((None, None, 'start ::= "a"'), "ebnf", 'The root rule with name "root" is not found'),
        ((None, None, 'root ::= "a"{5,2}'), "ebnf", "EBNF parser error at line 1, column 16: Lower bound is larger"),
    ],
)
def test_native_errors(args, param, problem):
    """Each names the field as the body has it (under sampling_params), with xgrammar's reason."""
    with pytest.raises(APIError) as e:
        from_native(*args)
    assert (e.value.status, e.value.param) == (400, f"sampling_params.{param}")
    assert problem in e.value.message


BIG = "1" + "0" * 400
"""An integer beyond the float range, as JSON text (Python reads it as an int of any length)."""


@pytest.mark.parametrize(
    ("text", "where", "problem"),
    [
        ('{"type": "integer", "maximum": 1e400}', "$.maximum", "beyond the range of a 64-bit float"),
        ('{"type": "number", "minimum": -1e309}', "$.minimum", "beyond the range of a 64-bit float"),
        (f'{{"type": "integer", "maximum": {BIG}}}', "$.maximum", "beyond the range of a 64-bit float"),
        (
            f'{{"type": "object", "properties": {{"a": {{"enum": [1, -{BIG}]}}}}}}',
            "$.properties.a.enum[1]",
            "beyond the range",
        ),
        (
            '{"type": "string", "default": Infinity}',
            "$.default",
            "beyond the range",
        ),  # an annotation: xgrammar reads it too
        ('{"type": "number", "maximum": NaN}', "$.maximum", "NaN is not a JSON number"),
    ],
)
def test_numbers_beyond_float_range_are_named(text, where, problem):
    """xgrammar's JSON reader refuses a number that is not a finite 64-bit float with an empty
    RuntimeError (a long integer) or a parse error about "Infinity" (1e400, which Python reads
    as infinity): a 400 that names the field, where in the schema, and why."""
    schema = json.loads(text)
    for build, param, field in (
        (lambda: from_response_format(schema_format(schema)), "response_format", "response_format.json_schema.schema"),
        (lambda: from_native(text, None, None), "sampling_params.json_schema", "sampling_params.json_schema"),
    ):
        with pytest.raises(APIError) as e:
            build()
        assert (e.value.status, e.value.param) == (400, param)
        assert e.value.message.startswith(f"{field} cannot be used for structured output: ")
        assert problem in e.value.message and f"(at {where})" in e.value.message
        assert "RuntimeError" not in e.value.message and "Failed to parse JSON" not in e.value.message


def test_tool_parameters_beyond_float_range_are_named():
    """A tool's parameters are checked alike, strict or not (xgrammar reads them either way)."""
    from tokenizer_proc.tools.models import ToolDef
    from tokenizer_proc.tools.parsers import HermesParser
    from tokenizer_proc.tools.plan import plan_tools

    params = json.loads(f'{{"type": "object", "properties": {{"n": {{"type": "integer", "maximum": {BIG}}}}}}}')
    for strict in (False, True):
        tools = [
            ToolDef.model_validate({"type": "function", "function": {"name": "ok", "parameters": PERSON}}),
            ToolDef.model_validate(
                {"type": "function", "function": {"name": "f", "parameters": params, "strict": strict}}
            ),
        ]
        with pytest.raises(APIError) as e:
            plan_tools(tools, "auto", None, HermesParser)
        assert (e.value.status, e.value.param) == (400, "tools.1.function.parameters")
        assert (
            "beyond the range of a 64-bit float" in e.value.message and "(at $.properties.n.maximum)" in e.value.message
        )


def test_xgrammar_message_is_never_empty():
    from protocol.grammar import xgrammar_message

    assert xgrammar_message(RuntimeError("")) == "xgrammar rejected it without a reason (RuntimeError)"
    assert (
        xgrammar_message(RuntimeError("[20:46:08] /project/cpp/x.cc:5: \n"))
        == "xgrammar rejected it without a reason (RuntimeError)"
    )
    line = (
        '[20:46:08] /project/cpp/grammar_parser.cc:820: EBNF parser error at line 1, column 9: Rule "x" is not defined'
    )
    assert (
        xgrammar_message(RuntimeError(line), own_ebnf=True)
        == 'EBNF parser error at line 1, column 9: Rule "x" is not defined'
    )
    assert xgrammar_message(RuntimeError(line)) == 'Rule "x" is not defined'


# ------------------------------------------------------------------ token mask layout
def test_allowed_ids_layout():
    words = np.zeros(mask_words(40), dtype="<u4")  # the bits of xgrammar's int32 words
    assert words.shape == (2,)
    words[0] = 1 | (1 << 31)  # tokens 0 and 31
    words[1] = 1 << 7  # token 39
    ids = allowed_ids(words.tobytes(), 40)
    assert ids.shape == (40,) and ids.dtype == bool
    assert np.flatnonzero(ids).tolist() == [0, 31, 39]
    with pytest.raises(ValueError, match="has 8 bytes, got 4"):
        allowed_ids(b"\0" * 4, 40)


# ------------------------------------------------------------------ hand-off and backend
@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, default_source, tokenizer):
    path = tmp_path_factory.mktemp("run")
    write_grammar_tokenizer(path, tokenizer, model_facts(default_source, tokenizer))
    return path


@pytest.fixture(scope="module")
def backend(run_dir):
    b = GrammarBackend(run_dir, VOCAB)
    yield b
    b.close()


def test_hand_off_file(run_dir):
    import xgrammar

    assert [p.name for p in run_dir.iterdir()] == [GRAMMAR_TOKENIZER_FILE]  # no temporary left
    info = xgrammar.TokenizerInfo.deserialize_json((run_dir / GRAMMAR_TOKENIZER_FILE).read_text())
    assert info.vocab_size == VOCAB
    assert info.stop_token_ids == [EOS]
    assert info.special_token_ids == [0, 1, *range(3, 17)]  # SmolLM2's special added tokens, never allowed


def test_compile_cache(backend):
    spec = GrammarSpec(GrammarKind.REGEX, r"cache-[0-9]{3}")
    first = backend.submit(spec)
    assert backend.submit(GrammarSpec(GrammarKind.REGEX, r"cache-[0-9]{3}")) is first  # in flight or done
    compiled = first.result(timeout=60)
    again = backend.submit(spec)
    assert again is first and again.done() and again.result() is compiled
    assert backend.submit(GrammarSpec(GrammarKind.EBNF, 'root ::= "cache"')) is not first


def test_compile_runs_off_the_caller_thread(run_dir):
    backend = GrammarBackend(run_dir, VOCAB)
    seen = []
    load = backend._load
    backend._load = lambda xgrammar: seen.append(threading.current_thread()) or load(xgrammar)
    backend.submit(GrammarSpec(GrammarKind.JSON_OBJECT)).result(timeout=60)
    backend.close()
    assert len(seen) == 1 and seen[0] is not threading.current_thread()
    assert seen[0].name.startswith("grammar")


def test_a_slow_compile_does_not_hold_the_next_grammar(run_dir):
    """A grammar submitted while another compiles for long (a large schema: seconds to tens
    of seconds) compiles beside it: here the first compile waits until the second is done,
    which with one compile thread never happened (before, every grammar queued behind)."""
    backend = GrammarBackend(run_dir, VOCAB)
    compile_one = backend._compile
    slow, fast = GrammarSpec(GrammarKind.REGEX, "a+"), GrammarSpec(GrammarKind.JSON_OBJECT)
    second: list = []
    saw: list[bool] = []  # whether the slow compile saw the second one finish before going on

    def compile_(spec):
        if spec == slow:
            deadline = time.monotonic() + 30
            while not (second and second[0].done()) and time.monotonic() < deadline:
                time.sleep(0.01)
            saw.append(bool(second) and second[0].done())
        return compile_one(spec)

    backend._compile = compile_
    first = backend.submit(slow)
    second.append(backend.submit(fast))
    try:
        assert second[0].result(timeout=25) is not None
        assert first.result(timeout=60) is not None
        assert saw == [True]
    finally:
        backend.close()


def test_compile_errors(run_dir, tmp_path, backend):
    bad = backend.submit(GrammarSpec(GrammarKind.EBNF, "root ::= foo"))  # never checked by the HTTP side
    with pytest.raises(GrammarError, match='^EBNF parser error at line 1, column 10: Rule "foo" is not defined$'):
        bad.result(timeout=60)
    # parsed and compiled, but no output can satisfy them: the request ended at once with
    # finish_reason "stop" and no text, as if the output were complete
    for spec in (GrammarSpec(GrammarKind.EBNF, "root ::= root"), GrammarSpec(GrammarKind.REGEX, r"[^\x00-\U0010FFFF]")):
        with pytest.raises(GrammarError, match="^it matches no text: no token may begin the output"):
            backend.submit(spec).result(timeout=60)
    assert backend.submit(GrammarSpec(GrammarKind.EBNF, 'root ::= ""')).result(timeout=60) is not None  # empty text
    with pytest.raises(ValueError, match="is for 49152 tokens, the model scores 1000"):
        GrammarBackend(run_dir, 1000).submit(GrammarSpec(GrammarKind.JSON_OBJECT)).result(timeout=60)
    with pytest.raises(FileNotFoundError):
        GrammarBackend(tmp_path, VOCAB).submit(GrammarSpec(GrammarKind.JSON_OBJECT)).result(timeout=60)


# ------------------------------------------------------------------ simulated generation
@pytest.fixture(scope="module")
def short_ids(tokenizer) -> np.ndarray:
    """Token ids that spell one character, which the fake sampler prefers so that strings
    and repetitions end in a few hundred steps."""
    return np.array([i for i, t in enumerate(tokenizer.convert_ids_to_tokens(list(range(VOCAB)))) if len(t) == 1])


def generate(row: RowGrammar, short_ids: np.ndarray, seed: int, max_steps: int = 5000) -> list[int]:
    """A fake sampling loop: at each step a seeded random allowed token (a one-character
    one 80% of the time when any is allowed), until the grammar terminates. Returns the ids,
    the EOS that ended them included."""
    rng = np.random.default_rng(seed)
    short = np.zeros(VOCAB, dtype=bool)
    short[short_ids] = True
    ids = []
    while not row.terminated:
        allowed = allowed_ids(row.next_mask(), VOCAB)
        assert allowed.any()
        pool = np.flatnonzero(allowed & short) if rng.random() < 0.8 else np.array([])
        token = int(rng.choice(pool if pool.size else np.flatnonzero(allowed)))
        assert row.accept(token)
        ids.append(token)
        assert len(ids) < max_steps
    return ids


@pytest.fixture(scope="module")
def vocab_bytes(run_dir) -> list[bytes]:
    """Each token's bytes, as xgrammar sees them."""
    import xgrammar

    return xgrammar.TokenizerInfo.deserialize_json((run_dir / GRAMMAR_TOKENIZER_FILE).read_text()).decoded_vocab


@pytest.fixture
def decode(tokenizer, vocab_bytes):
    """The text of an output that ended with EOS, as the detokenizer renders it, after
    checking its bytes: no special token, and well-formed UTF-8 but for one gap of
    xgrammar's: its character classes admit UTF-8-encoded surrogates (ED A0..BF xx), which
    strict UTF-8 (and so the text) renders as U+FFFD."""

    def run(ids: list[int]) -> str:
        assert ids[-1] == EOS and EOS not in ids[:-1]
        assert not set(ids) & set(range(17)) - {EOS}
        raw = b"".join(vocab_bytes[t] for t in ids[:-1])
        raw.decode("utf-8", "surrogatepass")
        text = tokenizer.decode(ids[:-1])
        assert text == raw.decode("utf-8", "replace")
        return text

    return run


@pytest.mark.parametrize("seed", range(4))
def test_json_schema_generation(backend, decode, short_ids, seed):
    compiled = backend.submit(from_response_format(schema_format(PERSON))).result(timeout=60)
    text = decode(generate(RowGrammar(compiled), short_ids, seed))
    value = json.loads(text)
    jsonschema.validate(value, PERSON)
    assert list(value) == ["name", "age"]  # the schema's order
    assert isinstance(value["name"], str) and type(value["age"]) is int


@pytest.mark.parametrize("seed", range(3))
def test_json_object_generation(backend, decode, short_ids, seed):
    compiled = backend.submit(from_response_format({"type": "json_object"})).result(timeout=60)
    text = decode(generate(RowGrammar(compiled), short_ids, seed))
    assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("seed", range(4))
def test_regex_generation(backend, decode, short_ids, seed):
    pattern = r"[a-z]{3,8}-\d{2,4}(\.[A-Z])?"
    compiled = backend.submit(from_native(None, pattern, None)).result(timeout=60)
    text = decode(generate(RowGrammar(compiled), short_ids, seed))
    assert re.fullmatch(pattern, text), text


ARITHMETIC = r"""
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= num | "(" expr ")"
num ::= "0" | [1-9] [0-9]*
"""


@pytest.mark.parametrize("seed", range(4))
def test_ebnf_generation(backend, decode, short_ids, seed):
    compiled = backend.submit(from_native(None, None, ARITHMETIC)).result(timeout=60)
    text = decode(generate(RowGrammar(compiled), short_ids, seed))
    assert re.fullmatch(r"[0-9()+\-]+", text), text
    tree = ast.parse(text, mode="eval")  # Python rejects 007: the grammar's num rule did too
    kinds = {type(node) for node in ast.walk(tree)}
    assert kinds <= {ast.Expression, ast.BinOp, ast.Add, ast.Sub, ast.Constant}, text


def test_row_masks_and_termination(backend, tokenizer):
    row = RowGrammar(backend.submit(GrammarSpec(GrammarKind.JSON_SCHEMA, PERSON_TEXT)).result(timeout=60))
    mask = row.next_mask()
    assert len(mask) == 4 * 1536
    first = np.flatnonzero(allowed_ids(mask, VOCAB))
    assert first.size and all(tokenizer.decode([t]).startswith("{") for t in first)
    x = tokenizer.convert_tokens_to_ids("x")
    assert not row.accept(x) and not row.accept(VOCAB) and not row.accept(EOS)
    assert row.next_mask() == mask  # rejected tokens leave the state as it was
    for t in tokenizer.encode('{"name": "Ann", "age": 42}', add_special_tokens=False):
        assert row.accept(t)
    assert not row.terminated
    assert np.flatnonzero(allowed_ids(row.next_mask(), VOCAB)).tolist() == [EOS]  # complete: only EOS
    assert row.accept(EOS) and row.terminated
    assert not row.accept(EOS)
    with pytest.raises(RuntimeError, match="terminated"):
        row.next_mask()


@pytest.mark.parametrize(
    "regex, written",
    [
        ("ab[^\\w\\W]c", "ab"),
        ("(x|ab[^\\s\\S])", "ab"),
    ],
)
def test_a_row_at_a_dead_end_says_so(backend, tokenizer, regex, written):
    """A grammar part that matches no text (an empty character class) lets xgrammar accept a
    prefix that nothing can continue or end: its mask then allows no token, and the row says
    it is at a dead end (the scheduler fails the request with a 400 instead of ending it
    "stop" with the output cut there). A JSON-schema pattern that matches no string is
    refused up front (`test_string_patterns_the_grammar_cannot_enforce_are_refused`)."""
    row = RowGrammar(backend.submit(from_native(None, regex, None)).result(timeout=60))
    assert row.next_mask() and not row.dead_end
    for t in tokenizer.encode(written, add_special_tokens=False):
        row.next_mask()
        assert not row.dead_end and row.accept(t)
    assert not any(row.next_mask()) and row.dead_end and not row.terminated


@pytest.mark.parametrize(
    ("schema", "valid", "invalid"),
    [
        ({"type": "integer", "minimum": 0.5}, "1", "0"),
        ({"type": "integer", "exclusiveMinimum": 0.5, "exclusiveMaximum": 2.5}, "2", "3"),
        ({"type": "integer", "minimum": 0.5, "exclusiveMinimum": 1.5}, "2", "1"),
        ({"type": ["integer", "null"], "maximum": -0.5}, "-1", "0"),
        ({"type": "array", "minItems": 2}, '["a", 1]', "[1]"),
        ({"type": "array", "prefixItems": [{"type": "integer"}], "minItems": 2}, '[1, "x"]', '["x", 1]'),
        ({"type": "object", "minProperties": 1}, '{"k": 1}', "{}"),
        (
            {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "minProperties": 2},
            '{"a": 1, "b": null}',
            '{"a": 1}',
        ),
        (
            {
                "type": "object",
                "properties": {"n": {"$ref": "#/$defs/half"}},
                "required": ["n"],
                "$defs": {"half": {"type": "integer", "exclusiveMaximum": 0.5}},
            },
            '{"n": 0}',
            '{"n": 1}',
        ),
    ],
)
def test_valid_schemas_the_grammar_engine_refuses_as_written_are_enforced(schema, valid, invalid):
    """xgrammar refuses a fractional integer bound ("Integer constraint must be a whole
    number") and, in its strict mode, a minItems / minProperties beyond the listed items or
    properties when ``items`` / ``additionalProperties`` is absent ("additional items are not
    allowed"), both 400s for schemas any instance of which JSON Schema allows. They are served
    as the whole-number bounds and the spelled-out ``{}`` they mean: the grammar accepts a
    valid instance and refuses an invalid one."""
    from xgrammar.testing import _is_grammar_accept_string

    validator = jsonschema.Draft202012Validator(schema)
    assert validator.is_valid(json.loads(valid)) and not validator.is_valid(json.loads(invalid))
    grammar = spec_grammar(from_response_format(schema_format(schema)))
    assert _is_grammar_accept_string(grammar, valid)
    assert not _is_grammar_accept_string(grammar, invalid)


def test_forced_tool_call_parameters_are_enforced_as_json_schema_reads_them():
    """A forced call's grammar takes the tool's parameters as `test_valid_schemas_...` above."""
    from xgrammar.testing import _is_grammar_accept_string

    from tokenizer_proc.tools.models import ToolDef
    from tokenizer_proc.tools.parsers import HermesParser
    from tokenizer_proc.tools.plan import plan_tools

    params = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0.5}, "tags": {"type": "array", "minItems": 1}},
        "required": ["n", "tags"],
    }
    tools = [ToolDef.model_validate({"type": "function", "function": {"name": "f", "parameters": params}})]
    grammar = spec_grammar(plan_tools(tools, "required", None, HermesParser).grammar)
    call = '<tool_call>\n{"name": "f", "arguments": {"n": %s, "tags": %s}}\n</tool_call>'
    assert _is_grammar_accept_string(grammar, call % (1, '["x"]'))
    assert not _is_grammar_accept_string(grammar, call % (0, '["x"]'))
    assert not _is_grammar_accept_string(grammar, call % (1, "[]"))


# ------------------------------------------------------------------ forced tool calls
def test_forced_tool_call_parameters_must_be_enforceable():
    """A forced call's grammar holds the tool's parameters: a keyword it would not enforce
    is a 400 naming the tool; under ``auto`` the schema is only shown, so it is accepted."""
    from tokenizer_proc.tools.models import NamedToolChoice, ToolDef
    from tokenizer_proc.tools.parsers import HermesParser
    from tokenizer_proc.tools.plan import plan_tools

    unique = {
        "type": "object",
        "properties": {"ids": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}},
        "required": ["ids"],
    }
    tools = [
        ToolDef.model_validate({"type": "function", "function": {"name": "ok", "parameters": PERSON}}),
        ToolDef.model_validate({"type": "function", "function": {"name": "pick", "parameters": unique}}),
    ]
    assert plan_tools(tools, "auto", None, HermesParser).grammar is None
    assert (
        plan_tools(
            tools, NamedToolChoice.model_validate({"type": "function", "function": {"name": "ok"}}), None, HermesParser
        ).grammar
        is not None
    )
    for choice in ("required", NamedToolChoice.model_validate({"type": "function", "function": {"name": "pick"}})):
        with pytest.raises(APIError) as e:
            plan_tools(tools, choice, None, HermesParser)
        assert (e.value.status, e.value.param) == (400, "tools.1.function.parameters")
        assert "`uniqueItems` cannot be enforced (at $.properties.ids)" in e.value.message


def test_oneof_check_is_linear_in_its_branches():
    """A discriminated oneOf of 3,000 branches is checked in well under a second (pairwise it
    took 45 s of the HTTP process's CPU); one repeated tag is still found."""
    import time

    from tokenizer_proc.structured.schema_enforce import unenforced

    branches = [
        {
            "type": "object",
            "properties": {"kind": {"const": f"k{i}"}, "x": {"type": "integer"}},
            "required": ["kind", "x"],
        }
        for i in range(3000)
    ]
    start = time.perf_counter()
    assert unenforced({"oneOf": branches}) is None
    branches[-1]["properties"]["kind"] = {"const": "k0"}
    assert "may match the same value" in unenforced({"oneOf": branches})[1]
    assert time.perf_counter() - start < 5


def _pet(tag: str, field: str, **extra) -> dict:
    """A pydantic model of a discriminated union whose tag has a default (so it is not required)."""
    return {
        "type": "object",
        "properties": {"pet_type": {"const": tag, "default": tag, "type": "string"}, field: {"type": "integer"}},
        "required": [field],
        **extra,
    }


def test_oneof_of_objects_each_requiring_a_property_the_other_does_not_list_is_accepted():
    """pydantic's ``Annotated[Cat | Dog, Field(discriminator=...)]`` with ``pet_type:
    Literal["cat"] = "cat"`` gives a oneOf whose tag is not required: what the grammar writes
    for Cat lists only Cat's properties, so it lacks Dog's required ``barks`` (and the other
    way round). It was refused as overlapping. A branch that may write other properties
    (``additionalProperties`` a schema) still overlaps and is refused."""
    import xgrammar
    from xgrammar.testing import _is_grammar_accept_string

    from protocol.grammar import JSON_SCHEMA_OPTIONS

    schema = {
        "$defs": {"Cat": _pet("cat", "meows"), "Dog": _pet("dog", "barks")},
        **_prop(
            {
                "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
                "discriminator": {"mapping": {"cat": "#/$defs/Cat", "dog": "#/$defs/Dog"}, "propertyName": "pet_type"},
            }
        ),
    }
    assert from_response_format(schema_format(schema)).kind == GrammarKind.JSON_SCHEMA
    grammar = xgrammar.Grammar.from_json_schema(json.dumps(schema), **JSON_SCHEMA_OPTIONS)
    assert _is_grammar_accept_string(grammar, '{"e": {"meows": 1}}')
    assert not _is_grammar_accept_string(grammar, '{"e": {"meows": 1, "barks": 2}}')  # matches both: never written
    schema["$defs"]["Cat"]["additionalProperties"] = {"type": "integer"}
    with pytest.raises(APIError) as e:
        from_response_format(schema_format(schema))
    assert "`oneOf` branches 0 and 1 may both match" in e.value.message


@pytest.mark.parametrize(
    ("rf", "expected"),
    [
        ({"type": "json_object", "json_schema": None}, GrammarKind.JSON_OBJECT),
        ({"type": "text", "json_schema": None, "schema": None}, None),
        ({**schema_format(PERSON), "schema": None}, GrammarKind.JSON_SCHEMA),
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "p", "schema": PERSON, "strict": None, "description": None},
            },
            GrammarKind.JSON_SCHEMA,
        ),
    ],
)
def test_response_format_keys_sent_as_null_are_absent(rf, expected):
    """A client that serializes every field of its response_format model sends the others as
    null: those are the fields absent (as on the rest of the body and Responses' text.format),
    not unknown keys (they were a 400)."""
    spec = from_response_format(rf)
    assert (spec.kind if spec is not None else None) == expected


def test_a_schema_with_more_union_branches_than_the_limit_is_refused_at_once(monkeypatch):
    """A 100,000-branch anyOf was accepted after 20 s of the HTTP process's CPU, then held the
    scheduler's one compile thread for minutes (quadratic in the branches), so every later
    structured-output request waited, also after its client left: over `MAX_BRANCHES` (all
    unions together) it is a 400 naming the count, found before the costly checks (the
    metaschema check, the first of them, is never reached)."""
    import tokenizer_proc.structured.check as grammar_check
    from tokenizer_proc.structured.schema_enforce import MAX_BRANCHES

    def costly(schema) -> None:
        raise AssertionError("the metaschema check ran before the size limit refused the schema")

    monkeypatch.setattr(grammar_check, "check_schema", costly)

    union = {
        "anyOf": [{"type": "object", "properties": {"k": {"const": i}}, "required": ["k"]} for i in range(100_000)]
    }
    split = _prop({"type": "array", "items": {"oneOf": [{"const": i} for i in range(MAX_BRANCHES // 2 + 1)]}})
    split["properties"]["f"] = {"anyOf": [{"const": f"v{i}"} for i in range(MAX_BRANCHES // 2)]}
    for schema, count in ((union, 100_000), (split, MAX_BRANCHES + 1)):
        with pytest.raises(APIError) as e:
            from_response_format(schema_format(schema))
        assert (e.value.status, e.value.param) == (400, "response_format")
        assert f"has {count} anyOf / oneOf branches and enum values in all; at most {MAX_BRANCHES}" in e.value.message


def test_a_schema_with_more_enum_values_than_the_limit_is_refused_at_once():
    """An enum is a union to xgrammar, its compile time quadratic in the values too (4,096
    strings 1.7 s, 20,000 31 s on 2 cores), but only anyOf / oneOf branches were counted: a
    20,000-string enum held the scheduler's one compile thread for half a minute, and every
    structured-output request sent after it waited as long. Enum values count with the
    branches now; an enum of `MAX_BRANCHES` values is still served."""
    from tokenizer_proc.structured.schema_enforce import MAX_BRANCHES

    words = [f"v{i}" for i in range(20_000)]  # an enum of `MAX_BRANCHES` keeps `MAX_STRING_CHARS` too
    split = _prop({"type": "string", "enum": words[: MAX_BRANCHES // 2]})
    split["properties"]["f"] = {"anyOf": [{"const": w} for w in words[: MAX_BRANCHES // 2 + 1]]}
    for schema, count in (({"type": "string", "enum": words}, 20_000), (split, MAX_BRANCHES + 1)):
        with pytest.raises(APIError) as e:
            from_response_format(schema_format(schema))
        assert (e.value.status, e.value.param) == (400, "response_format")
        assert f"has {count} anyOf / oneOf branches and enum values in all; at most {MAX_BRANCHES}" in e.value.message
    assert (
        from_response_format(schema_format({"type": "string", "enum": words[:MAX_BRANCHES]})).kind
        == GrammarKind.JSON_SCHEMA
    )


def test_schema_size_counts_the_whole_schema():
    """Object properties are counted in nested objects and definitions (referred to or not),
    each subschema once however often it is referred to (a recursive one too); the
    characters of property names, definition names and enum / const values (the JSON text of
    one that is not a string), not of patterns or references."""
    from tokenizer_proc.structured.schema_enforce import SchemaSize

    tree = {
        "type": "object",
        "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/tree"}}},
    }
    schema = {
        "type": "object",
        "properties": {
            "root": {"$ref": "#/$defs/tree"},
            "also": {"$ref": "#/$defs/tree"},
            "kind": {"enum": ["ab", 12, None, {"x": [1]}]},
        },
        "patternProperties": {"^x-[a-z]+$": {"type": "object", "properties": {"q": {"const": True}}}},
        "$defs": {"tree": tree, "unused": {"type": "object", "properties": {"u": {"type": "string"}}}},
        "definitions": {"old": {"anyOf": [{"type": "string"}, {"type": "null"}]}},
    }
    names = len("rootalsokindqtreeunusedvaluechildrenuold")
    values = len('ab12null{"x":[1]}true')
    assert SchemaSize.of(schema) == SchemaSize(branches=4 + 2, properties=3 + 1 + 2 + 1, chars=names + values)
    assert SchemaSize.of(_properties(1001)).properties == 1001
    assert SchemaSize.of(_characters(30_001)) == SchemaSize(branches=1, properties=2, chars=30_001)


def test_schemas_over_the_size_limits_are_refused_and_at_them_accepted():
    """8,000 optional properties (OpenAI allows 5,000) held one of the scheduler's two compile
    threads for seconds to tens of seconds; object properties are limited (`MAX_PROPERTIES`,
    nested objects and definitions included), and so are the characters of names and values
    (`MAX_STRING_CHARS`), with which the compile time of optional properties grows too. Over
    either it is a 400 naming the count and the limit, at them the schema is served."""
    from tokenizer_proc.structured.schema_enforce import MAX_PROPERTIES, MAX_STRING_CHARS

    for schema, says in (
        (
            _properties(MAX_PROPERTIES + 1),
            f"has {MAX_PROPERTIES + 1} object properties in all (nested objects and definitions included); at "
            f"most {MAX_PROPERTIES} are supported",
        ),
        (
            _characters(MAX_STRING_CHARS + 1),
            f"has {MAX_STRING_CHARS + 1} characters of property names, definition names, enum values and const "
            f"values in all; at most {MAX_STRING_CHARS} are supported",
        ),
    ):
        with pytest.raises(APIError) as e:
            from_response_format(schema_format(schema))
        assert (e.value.status, e.value.param) == (400, "response_format")
        assert e.value.message.startswith(f"response_format.json_schema.schema {says}")
        with pytest.raises(APIError) as e:
            from_native(json.dumps(schema), None, None)
        assert (e.value.status, e.value.param) == (400, "sampling_params.json_schema")
        assert e.value.message.startswith(f"sampling_params.json_schema {says}")
    for schema in (_properties(MAX_PROPERTIES), _characters(MAX_STRING_CHARS)):
        assert from_response_format(schema_format(schema)).kind == GrammarKind.JSON_SCHEMA


def test_a_schema_at_the_size_limits_compiles(backend, tokenizer):
    """`MAX_PROPERTIES` optional properties whose names take `MAX_STRING_CHARS` characters,
    the shape whose compile time the limits bound, compile, and the grammar holds to them."""
    from tokenizer_proc.structured.schema_enforce import MAX_PROPERTIES, MAX_STRING_CHARS

    names = [f"p{i}".ljust(MAX_STRING_CHARS // MAX_PROPERTIES, "_") for i in range(MAX_PROPERTIES)]
    schema = {
        "type": "object",
        "properties": {name: {"type": "string"} for name in names},
        "additionalProperties": False,
    }
    spec = from_response_format(schema_format(schema))
    assert _accepts(backend, tokenizer, spec, json.dumps({names[7]: "x", names[-1]: "y"}))
    assert not _accepts(backend, tokenizer, spec, json.dumps({names[-1]: "y", names[7]: "x"}))
    assert not _accepts(backend, tokenizer, spec, json.dumps({"p1000": "x"}))


def test_tools_a_grammar_holds_together_keep_the_size_limits():
    """Forced calls and strict tools compile into one grammar: the parameters of the tools
    it holds are limited together, so tools each within the limits cannot add up to a
    grammar over them; tools only shown to the model (``auto``, not strict) are not."""
    from tokenizer_proc.structured.schema_enforce import MAX_PROPERTIES
    from tokenizer_proc.tools.models import ToolDef
    from tokenizer_proc.tools.parsers import HermesParser
    from tokenizer_proc.tools.plan import plan_tools

    half = MAX_PROPERTIES // 2 + 1

    def tools(strict: bool) -> list[ToolDef]:
        return [
            ToolDef.model_validate(
                {"type": "function", "function": {"name": f"f{i}", "strict": strict, "parameters": _properties(half)}}
            )
            for i in range(2)
        ]

    assert plan_tools(tools(False), "auto", None, HermesParser).grammar is None
    for choice, strict in (("required", False), ("auto", True)):
        with pytest.raises(APIError) as e:
            plan_tools(tools(strict), choice, None, HermesParser)
        assert (e.value.status, e.value.param) == (400, "tools")
        assert e.value.message.startswith(
            f"tools: the parameters of the tools a call may use (0, 1), which one grammar enforces, have {2 * half} "
            f"object properties in all (nested objects and definitions included); at most {MAX_PROPERTIES} are "
            f"supported"
        )


def _accepts(backend, tokenizer, spec: GrammarSpec, text: str) -> bool:
    """Whether `spec` lets the output be `text` and then end (EOS)."""
    row = backend.matcher(backend.submit(spec).result(timeout=60))
    return all(row.accept(i) for i in tokenizer.encode(text, add_special_tokens=False)) and row.accept(EOS)


@pytest.mark.parametrize(
    ("family", "texts"),
    [
        (
            "hermes",
            {
                "Hi [x]": True,
                "a <tool_call>\n{C}\n</tool_call> b": True,
                "<tool_call>\n{B}\n</tool_call>": False,
                "<tool_call>\n{C}\n</tool_call>\n<tool_call>\n{F}\n</tool_call>": True,
            },
        ),
        ("mistral", {"Hi [x]": True, "ok[TOOL_CALLS][{C}, {F}]": True, "[TOOL_CALLS][{B}]": False}),
        # no marker: a call only where the output starts with "{"; text that starts otherwise is free
        (
            "llama3_json",
            {
                "Hi {x}": True,
                " Hi": True,
                "": True,
                "{C}": True,
                "\n{C}; {F}": True,
                "{B}": False,
                "{bad": False,
                "{C} then text": False,
            },
        ),
    ],
)
def test_strict_auto_grammar_per_family(backend, tokenizer, family, texts):
    from tokenizer_proc.tools.grammar import auto_calls
    from tokenizer_proc.tools.parsers import PARSERS

    parser = PARSERS[family]
    tools = [
        {"type": "function", "function": {"name": "get_person", "parameters": PERSON}},
        {"type": "function", "function": {"name": "free", "parameters": PERSON}},
    ]
    spec = auto_calls(parser, tools, [True, False], parallel=True)
    key = parser.ARGUMENTS_KEY
    calls = {
        "{C}": f'{{"name": "get_person", "{key}": {{"name": "Al", "age": 3}}}}',
        "{B}": f'{{"name": "get_person", "{key}": {{"name": "Al"}}}}',  # age missing
        "{F}": f'{{"name": "free", "{key}": {{"x": [1]}}}}',
    }  # not strict: any object
    for text, ok in texts.items():
        for short, call in calls.items():
            text = text.replace(short, call)
        assert _accepts(backend, tokenizer, spec, text) is ok, text


# ------------------------------------------------------------------ strings: patterns, lengths, formats
FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER


@pytest.mark.parametrize(
    ("sub", "value", "written"),
    [
        # a pattern with a non-ASCII character went to xgrammar's regex-to-EBNF engine: its
        # negated class wrote a raw quote (the string ends early: invalid JSON)
        ({"pattern": "é[^@]*"}, r'"éa"b"', False),
        ({"pattern": "é[^@]*"}, r'"éa\"b\\c"', True),
        # a pattern that needs a quote or a backslash: the same engine wrote them raw
        ({"pattern": '[^"]*"'}, r'"ab""', False),
        ({"pattern": '[^"]*"'}, r'"ab\""', True),
        ({"pattern": r".*\\"}, r'"a\"', False),
        ({"pattern": r".*\\"}, r'"a\\"', True),
        # control characters only as escapes; "." is not a line terminator
        ({"pattern": "[^,]*"}, '"a\tb"', False),
        ({"pattern": "[^,]*"}, r'"a\tb\u0001"', True),
        ({"pattern": ".*"}, r'"a\nb"', False),
        ({"pattern": ".*"}, r'"a\u2028b"', False),
        ({"pattern": r"\S+"}, r'"a\tb"', False),
        # characters are code points, whatever their UTF-8 length
        ({"pattern": "^.{3}$"}, '"é€😀"', True),
        ({"pattern": "^.{3}$"}, '"éa"', False),
        ({"pattern": "[а-я]+"}, '"да"', True),
        ({"pattern": "[а-я]+"}, '"da"', False),
        # a character only where ECMA-262 and Python's re (jsonschema's check) both match it
        ({"pattern": r"\W"}, '"!"', True),
        ({"pattern": r"\W"}, '"é"', False),
        ({"pattern": r"\d"}, '"٣"', False),
        ({"pattern": r"^(a|^b)$"}, '"b"', True),
        # minLength / maxLength: xgrammar wrote [^"\\\r\n]{m,n}, raw tabs included, no escapes
        ({"maxLength": 3}, '"a\tb"', False),
        ({"maxLength": 3}, r'"a\tb"', True),
        ({"maxLength": 3}, '"ééé"', True),
        ({"maxLength": 3}, r'"\"\"\"\""', False),
        ({"minLength": 2}, '"é"', False),
        # formats xgrammar wrote wrong: the 31st of November, a leap second at any minute, an
        # octet with a leading zero (Python's ipaddress refuses it), a raw tab in a JSON pointer
        ({"format": "date"}, '"2024-11-31"', False),
        ({"format": "date"}, '"2023-02-29"', False),
        ({"format": "date"}, '"2024-02-29"', True),
        ({"format": "date-time"}, '"2024-01-01T12:30:60Z"', False),
        ({"format": "date-time"}, '"2024-01-01T23:59:59.5+01:00"', True),
        ({"format": "time"}, '"12:00:60Z"', False),
        ({"format": "ipv4"}, '"01.2.3.4"', False),
        ({"format": "ipv4"}, '"10.2.255.4"', True),
        ({"format": "json-pointer"}, '"/a\tb"', False),
        ({"format": "json-pointer"}, r'"/a\tb/~1"', True),
        ({"format": "date"}, '"0000-01-01"', False),
        # listed values xgrammar already writes right, escapes and all
        ({"enum": ['a"b', "c\\d", "é\n"]}, r'"a\"b"', True),
        ({"enum": ['a"b', "c\\d", "é\n"]}, r'"é\n"', True),
        ({"enum": ['a"b', "c\\d", "é\n"]}, '"a"b"', False),
    ],
)
def test_strings_are_written_as_json_that_matches_the_schema(sub, value, written):
    """The grammar writes a string value only as JSON (each character the schema allows raw
    where JSON allows that, else escaped) whose decoded value the schema accepts, checked
    with `jsonschema` and its format checks."""
    from xgrammar.testing import _is_grammar_accept_string

    schema = _prop({"type": "string", **sub})
    text = '{"e": ' + value + "}"
    assert _is_grammar_accept_string(spec_grammar(from_response_format(schema_format(schema))), text) is written
    if written:
        jsonschema.validate(json.loads(text), schema, format_checker=FORMATS)


def test_patterns_are_read_as_ecma_262_named_groups_included():
    """JSON Schema patterns are ECMA-262: its named group (?<n>...) was refused as "not a
    'regex'" (the metaschema check compiled it with Python's re) and Python's (?P<n>...),
    which ECMA has not, was accepted. Now the first is enforced, the second refused saying
    why; escaped or in a class, ``(?P`` is not a group."""
    from xgrammar.testing import _is_grammar_accept_string

    grammar = spec_grammar(from_response_format(schema_format(_prop({"type": "string", "pattern": "^(?<n>a+)b$"}))))
    assert _is_grammar_accept_string(grammar, '{"e": "aab"}')
    assert not _is_grammar_accept_string(grammar, '{"e": "b"}')
    with pytest.raises(APIError) as e:
        from_response_format(schema_format(_prop({"type": "string", "pattern": "(?P<n>a)b"})))
    assert (
        "the pattern '(?P<n>a)b' (at $.properties.e.pattern) cannot be used: (?P...) is Python's syntax, not "
        "ECMA-262's: write a named group as (?<name>...)" in e.value.args[0]
    )
    for literal in (r"^\(?P$", "^[(?P]$"):
        from_response_format(schema_format(_prop({"type": "string", "pattern": literal})))


def test_pattern_property_names_are_written_as_json():
    from xgrammar.testing import _is_grammar_accept_string

    grammar = spec_grammar(
        from_response_format(schema_format({"type": "object", "patternProperties": {"é.": {"type": "integer"}}}))
    )
    assert _is_grammar_accept_string(grammar, '{"éa": 1, "é\\"": 2}')
    assert not _is_grammar_accept_string(grammar, '{"é"": 1}')


@pytest.mark.parametrize(
    ("sub", "problem"),
    [
        ({"pattern": "a^b"}, "`^` can only stand at the start of the pattern"),
        ({"pattern": "a$b"}, "`$` can only stand at the end of the pattern"),
        ({"pattern": "(^a)*"}, "`^` can only stand at the start"),
        ({"pattern": "(?!a)[a-z]+"}, "a lookahead or lookbehind cannot be enforced (at character 2)"),
        ({"pattern": "(a)\\1"}, "a backreference"),
        ({"pattern": "\\bfoo"}, "a word boundary"),
        ({"pattern": "(?i)abc"}, "inline flags"),
        ({"pattern": "a{,3}"}, "write a literal { as \\{"),
        ({"pattern": "[^\\s\\S]"}, "it matches no string"),
        ({"pattern": "ab|\\uD83D\\uDE00"}, None),  # a surrogate is never written; the other branch stays
        ({"minLength": 4, "maxLength": 3}, "minLength 4 is above maxLength 3 at $.properties.e: no string fits"),
    ],
)
def test_string_patterns_the_grammar_cannot_enforce_are_refused(sub, problem):
    """What the grammar cannot enforce is a 400 naming the pattern and its place. xgrammar
    skipped a lookahead (``(?!a)[a-z]+`` wrote "a"), dropped an anchor inside the pattern
    (``a^b``, which matches no string, wrote "ab"), and an empty class left the output cut
    at the open string."""
    schema = _prop({"type": "string", **sub})
    if problem is None:
        assert from_response_format(schema_format(schema)).kind == GrammarKind.EBNF
        return
    with pytest.raises(APIError) as e:
        from_response_format(schema_format(schema))
    assert (e.value.status, e.value.param) == (400, "response_format")
    assert problem in e.value.message
    if "pattern" in sub:
        assert f"the pattern {sub['pattern']!r} at $.properties.e.pattern cannot be enforced" in e.value.message


def test_string_patterns_of_tools():
    """A forced call's parameters get our string rules; a pattern the grammar cannot enforce
    is a 400 for it, and accepted where the schema is only shown (``auto``, not strict)."""
    from xgrammar.testing import _is_grammar_accept_string

    from tokenizer_proc.tools.models import ToolDef
    from tokenizer_proc.tools.parsers import HermesParser
    from tokenizer_proc.tools.plan import plan_tools

    def tools(pattern):
        params = {"type": "object", "properties": {"q": {"type": "string", "pattern": pattern}}, "required": ["q"]}
        return [ToolDef.model_validate({"type": "function", "function": {"name": "f", "parameters": params}})]

    grammar = spec_grammar(plan_tools(tools("é[^@]*"), "required", None, HermesParser).grammar)
    call = '<tool_call>\n{"name": "f", "arguments": {"q": %s}}\n</tool_call>'
    assert _is_grammar_accept_string(grammar, call % '"é\\"x"')
    assert not _is_grammar_accept_string(grammar, call % '"é"x"')
    assert plan_tools(tools("(?=a)a"), "auto", None, HermesParser).grammar is None
    with pytest.raises(APIError) as e:
        plan_tools(tools("(?=a)a"), "required", None, HermesParser)
    assert "a lookahead or lookbehind cannot be enforced" in e.value.message


STRINGS = {
    "type": "object",
    "properties": {
        "email": {"type": "string", "pattern": "^[^@]+@[^@]+$"},
        "any": {"type": "string", "pattern": ".+"},
        "short": {"type": "string", "maxLength": 4},
        "day": {"type": "string", "format": "date"},
        "at": {"type": "string", "format": "date-time"},
        "ip": {"type": "string", "format": "ipv4"},
    },
    "required": ["email", "any", "short", "day", "at", "ip"],
}


@pytest.mark.parametrize("seed", range(4))
def test_string_generation(backend, decode, short_ids, seed):
    compiled = backend.submit(from_response_format(schema_format(STRINGS))).result(timeout=60)
    value = json.loads(decode(generate(RowGrammar(compiled), short_ids, seed)))
    jsonschema.validate(value, STRINGS, format_checker=FORMATS)


@pytest.mark.parametrize(
    ("schema", "where", "count"),
    [
        ({"type": "string", "pattern": "^a{4294967296}$"}, "$.pattern", 4294967296),  # past Python re's limit: a 500
        ({"type": "string", "pattern": "^a{5,2147483648}$"}, "$.pattern", 2147483648),
        ({"type": "string", "maxLength": 4294967296}, "$.maxLength", 4294967296),  # enforced as 0
        (
            {"type": "object", "properties": {"s": {"type": "string", "minLength": 1, "maxLength": 2**40}}},
            "$.properties.s.maxLength",
            2**40,
        ),
        ({"type": "array", "minItems": 2147483648}, "$.minItems", 2147483648),
        (
            {"type": "object", "patternProperties": {"^x{9999999999}$": {"type": "string"}}},
            "$.patternProperties['^x{9999999999}$']",
            9999999999,
        ),
    ],
)
def test_a_repetition_count_past_32_bits_is_a_400_naming_it(schema, where, count):
    """xgrammar holds repetition counts in 32 bits: ``a{4294967297}`` matched one ``a`` (a 200
    breaking the grammar it claimed to match), ``maxLength`` 4294967296 allowed only the empty
    string, and a count past Python re's limit in a pattern raised an OverflowError, a 500 on
    every route. Each is a 400 that names the count and where it is; 2**31 - 1 still passes."""
    message = f"the repetition count {count} at {where} is above 2147483647"
    if "pattern" not in json.dumps(schema) or count < 4294967296:
        with pytest.raises(APIError) as e:
            from_response_format(schema_format(schema))
        assert (e.value.status, e.value.param) == (400, "response_format") and message in e.value.message, e.value
    else:  # Python's re refuses it first, in the metaschema's format check
        with pytest.raises(APIError) as e:
            from_response_format(schema_format(schema))
        assert e.value.status == 400 and "the repetition number is too large" in e.value.message, e.value
    assert from_response_format(schema_format({"type": "string", "maxLength": 2**31 - 1})) is not None


@pytest.mark.parametrize(
    ("field", "text"),
    [("regex", "a{4294967297}"), ("regex", "[a-z]{3,4294967299}"), ("ebnf", 'root ::= "a"{4294967297}')],
)
def test_a_native_grammar_with_a_repetition_count_past_32_bits_is_a_400(field, text):
    with pytest.raises(APIError) as e:
        from_native(None, text if field == "regex" else None, text if field == "ebnf" else None)
    assert (e.value.status, e.value.param) == (400, f"sampling_params.{field}")
    assert "above 2147483647, the largest the grammar engine holds" in e.value.message
    assert from_native(None, "a{2147483647}", None) is not None
