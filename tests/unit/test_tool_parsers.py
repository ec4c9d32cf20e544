"""Tool-call parsers on canned model outputs (tokenizer_proc/tools/parsers): one call,
parallel calls, nested JSON and unicode arguments, markup split across streamed pieces at
every position, malformed markup left as content; the forced-call grammar accepts exactly
the family's markup."""

from __future__ import annotations

import json

import pytest
import xgrammar

from tokenizer_proc.output.chat_output import ChatOutput, OutputPlan
from tokenizer_proc.tools.grammar import forced_calls
from tokenizer_proc.tools.parsers import detect, parse_text, parser_class, resolve

NESTED = {
    "query": {"filters": [{"field": "città", "op": "=", "value": "Zürich 🌍"}], "limit": 3},
    "note": 'braces } and ] in "strings" \\ too',
}
ARGS = json.dumps(NESTED, ensure_ascii=False)

OUTPUTS = {
    "hermes": [
        (f'<tool_call>\n{{"name": "search", "arguments": {ARGS}}}\n</tool_call>', "", [("search", ARGS)]),
        (
            'Let me check.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
            '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>',
            "Let me check.\n",
            [("a", '{"x": 1}'), ("b", "{}")],
        ),
        (
            '<tool_call>[{"name": "a", "arguments": {"x": [1, {"y": 2}]}}, {"name": "b", "arguments": {}}]</tool_call>',
            "",
            [("a", '{"x": [1, {"y": 2}]}'), ("b", "{}")],
        ),
    ],
    "llama3_json": [
        (f'{{"name": "search", "parameters": {ARGS}}}', "", [("search", ARGS)]),
        (
            '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}',
            "",
            [("a", '{"x": 1}'), ("b", "{}")],
        ),
    ],
    "mistral": [
        (f'[TOOL_CALLS][{{"name": "search", "arguments": {ARGS}}}]', "", [("search", ARGS)]),
        (
            'Sure. [TOOL_CALLS] [{"name": "a", "arguments": {"x": "é"}}, {"name": "b", "arguments": {}}]',
            "Sure. ",
            [("a", '{"x": "é"}'), ("b", "{}")],
        ),
        (
            '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}, "id": "a1b2c3d4e"}, {"name": "b", "arguments": {}, '
            '"id": "} ]"}] ok',
            " ok",
            [("a", '{"x": 1}'), ("b", "{}")],
        ),  # tokenizer v3+: ids after the arguments
        (f"[TOOL_CALLS]search[ARGS]{ARGS}", "", [("search", ARGS)]),  # v11: name[ARGS]{...} per call
        (
            'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Zürich"}[TOOL_CALLS]ping[ARGS] {}',
            "Sure.",
            [("get_weather", '{"city": "Zürich"}'), ("ping", "{}")],
        ),
    ],
}
CASES = [(family, *case) for family, cases in OUTPUTS.items() for case in cases]

MALFORMED = {
    "hermes": [
        "<tool_call>not json</tool_call> after",
        '<tool_call>{"name": 5}</tool_call>',
        "a <tool_call> b",
        '<tool_call>{"name": "f", "arg',
        "x <tool_ca",
    ],
    "llama3_json": ['hello {"name": "a", "parameters": {}}', '{"name": "a"}', '{"nam', "{ not json }"],
    "mistral": [
        "[TOOL_CALLS] nope",
        '[TOOL_CALLS][{"x": 1}]',
        "[TOOL_C",
        "[TOOL_CALLS]na me[ARGS]{}",
        "[TOOL_CALLS]f[ARG",
    ],
}


def run(family: str, pieces: list[str], cut: bool = False):
    """Feed `pieces` as a stream (cut: the token limit ended it); returns (content,
    [(name, arguments)], ids by index)."""
    parser = parser_class(family)()
    content, calls = "", {}
    for i, piece in enumerate(pieces):
        out = parser.feed(piece)
        if i == len(pieces) - 1:
            out.extend(parser.finish(cut))
        content += out.content
        for c in out.calls:
            if c.id is not None:
                assert c.index not in calls and c.name, "id and name come first, once"
                calls[c.index] = [c.name, "", c.id]
            calls[c.index][1] += c.arguments
    return content, [(n, a) for n, a, _ in (calls[i] for i in sorted(calls))], [calls[i][2] for i in sorted(calls)]


@pytest.mark.parametrize("family,text,content,calls", CASES)
def test_calls_parse_whole(family, text, content, calls):
    got_content, got_calls, ids = run(family, [text])
    assert (got_content, got_calls) == (content, calls)
    assert all(i.startswith("call_") and len(i) == 29 for i in ids) and len(set(ids)) == len(ids)
    for _, arguments in got_calls:
        json.loads(arguments)


@pytest.mark.parametrize("family,text,content,calls", CASES)
def test_every_split_position_gives_the_same_calls(family, text, content, calls):
    for k in range(len(text) + 1):
        assert run(family, [text[:k], text[k:]])[:2] == (content, calls), f"split at {k}: {text[:k]!r}"
    assert run(family, list(text))[:2] == (content, calls)  # one character per piece


@pytest.mark.parametrize("family,text", [(f, t) for f, ts in MALFORMED.items() for t in ts])
def test_malformed_markup_is_content(family, text):
    for k in range(len(text) + 1):
        assert run(family, [text[:k], text[k:]])[:2] == (text, []), f"split at {k}"


@pytest.mark.parametrize(
    "call", ['<tool_call>\n{"name": "a", "arguments": {}}', '<tool_call>[{"name": "a", "arguments": {}}']
)
def test_section_end_cut_by_the_token_limit_is_not_content(call):
    """Complete calls whose closing markup the token limit cut (``\n</too``) leave no markup in
    the content (it reached the content once), streamed in pieces or whole."""
    close = "]\n</tool_call>" if "[" in call else "\n</tool_call>"
    for k in range(1, len(close)):
        text = call + close[:k]
        for pieces in ([text], list(text)):
            assert run("hermes", pieces)[:2] == ("", [("a", "{}")]), (k, len(pieces))


CUT_SHORT = {
    "hermes": ("Sure.\n", '<tool_call>\n{"name": "get_weather", "arguments": {'),
    "llama3_json": ("", '<|python_tag|>{"name": "get_weather", "parameters": {'),
    "mistral": ("Sure. ", '[TOOL_CALLS][{"name": "get_weather", "arguments": {'),
}
"""Family -> (text before a call, the call's markup through the ``{`` of its arguments)."""


@pytest.mark.parametrize("family", sorted(CUT_SHORT))
def test_markup_cut_by_the_token_limit_before_the_call_name_is_not_content(family):
    """The token limit cut the output inside a call's opening markup or header (``<tool``,
    ``<tool_call>\n{"name": "get_``): no call can be reported, and that markup is not
    content either (it was: a forced call cut short answered content ``<tool_call>\n{"name``;
    Anthropic added a text block ``\n<tool`` after a tool_use). Whole or streamed alike; an
    output that ended on its own there is still content (malformed markup)."""
    before, markup = CUT_SHORT[family]
    for k in range(1, len(markup)):
        text = before + markup[:k]
        for pieces in ([text], [before, markup[:k]], list(text)):
            content, calls, _ = run(family, pieces, cut=True)
            assert (content.strip(), calls) == (before.strip(), []), (k, len(pieces), content)
        assert run(family, [text])[:2] == (text, [])  # ended on its own: malformed, content
    complete = run(family, [before + markup + '"city": "Par'], cut=True)[:2]
    assert complete == (before, [("get_weather", '{"city": "Par')])  # once the name is out it is a call


AFTER_A_CALL = {
    "hermes": (
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>',
        '\n<tool_call>\n{"name": "get_weather", "arguments": {',
    ),
    "llama3_json": ('<|python_tag|>{"name": "a", "parameters": {}}', '; {"name": "get_weather", "parameters": {'),
    "mistral": ('[TOOL_CALLS][{"name": "a", "arguments": {}}', ', {"name": "get_weather", "arguments": {'),
    "mistral v11": ("[TOOL_CALLS]a[ARGS]{}", "[TOOL_CALLS]get_weather[ARGS]{"),
}
"""Family -> (a complete call, the next call's markup through the ``{`` of its arguments)."""


@pytest.mark.parametrize("case", sorted(AFTER_A_CALL))
def test_the_next_call_cut_before_its_name_leaves_no_content(case):
    """Parallel calls cut by the token limit between a complete call and the next one's
    name: the complete call and nothing else (Anthropic answered a tool_use block, then a
    text block ``\n<tool``)."""
    call, after = AFTER_A_CALL[case]
    for k in range(len(after)):
        for pieces in ([call + after[:k]], list(call + after[:k])):
            assert run(case.split()[0], pieces, cut=True)[:2] == ("", [("a", "{}")]), (k, len(pieces))


def test_a_forced_call_cut_before_its_name_answers_no_content():
    out = ChatOutput(OutputPlan(parser_class("hermes")))
    out.step("<tool_call>\n", final=False)
    out.step('{"name', final=True, cut=True)
    assert out.message() == {"role": "assistant", "content": "", "refusal": None}  # nothing was written but markup
    after_a_call = ChatOutput(OutputPlan(parser_class("hermes")))
    piece = after_a_call.step('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool', final=True, cut=True)
    assert piece.content == "" and after_a_call.message()["content"] is None
    assert [c["function"]["name"] for c in after_a_call.calls()] == ["a"]


def test_partial_markup_is_held_back_until_known():
    parser = parser_class("hermes")()
    assert parser.feed("Hi <tool").content == "Hi "
    assert parser.feed("bar").content == "<toolbar"


def test_a_call_cut_short_is_incomplete_and_stays_length():
    out = ChatOutput(OutputPlan(parser_class("hermes")))
    out.step('<tool_call>\n{"name": "a", "arguments": {"x": [1, ', final=False)
    out.step("2", final=True)
    from protocol.enums import FinishReason

    assert out.finish_reason(FinishReason.LENGTH) == "length"
    assert out.finish_reason(FinishReason.STOP) == "stop"  # incomplete arguments are never a finished call
    done = ChatOutput(OutputPlan(parser_class("hermes")))
    done.step('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n', final=True)
    assert done.finish_reason(FinishReason.STOP) == "tool_calls"
    assert done.message()["content"] is None and done.message()["tool_calls"][0]["function"]["arguments"] == "{}"


@pytest.mark.parametrize("value", ["NaN", "-Infinity", "1e400"])
def test_arguments_with_a_value_json_lacks_are_not_a_finished_call(value):
    """Python's json.loads reads NaN, Infinity and 1e400 (as inf): such a call was complete,
    finish_reason tool_calls, with arguments no JSON parser outside Python reads (Anthropic's
    input, streamed only as far as it is JSON, lacked the member while stop_reason said
    tool_use)."""
    from protocol.enums import FinishReason

    out = ChatOutput(OutputPlan(parser_class("hermes")))
    out.step(f'<tool_call>{{"name": "a", "arguments": {{"x": {value}}}}}</tool_call>', final=True)
    assert out.finish_reason(FinishReason.STOP) == "stop"
    assert out.calls()[0]["function"]["arguments"] == f'{{"x": {value}}}'  # as the model wrote them


def test_parallel_false_reports_one_call():
    out = ChatOutput(OutputPlan(parser_class("hermes"), max_calls=1))
    piece = out.step(
        '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}}</tool_call>',
        final=True,
    )
    assert {c.index for c in piece.calls} == {0} and [c["function"]["name"] for c in out.calls()] == ["a"]


@pytest.mark.parametrize("family,text,content,calls", CASES)
def test_a_chunk_has_one_tool_calls_entry_per_call(family, text, content, calls):
    """A whole call in one piece (a parser yields its id and name, then its arguments, as two
    deltas) is one ``delta.tool_calls`` entry, as OpenAI sends it; two entries of one index
    were sent. The entries still add up to the calls."""
    out = ChatOutput(OutputPlan(parser_class(family)))
    entries = out.step(text, final=True).delta().get("tool_calls", [])
    assert [e["index"] for e in entries] == list(range(len(calls)))
    assert [(e["function"]["name"], e["function"]["arguments"]) for e in entries] == calls
    assert all(e["id"].startswith("call_") and e["type"] == "function" for e in entries)


def test_detect_and_resolve():
    assert detect("{% if tools %}<tool_call>{% endif %}") == "hermes"
    assert detect("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert detect("<|python_tag|>") == "llama3_json"
    assert detect("{{ message.content }}") is None
    assert resolve("auto", "{{ message.content }}") is parser_class("hermes")  # SmolLM2: the fallback
    assert resolve("none", "<tool_call>") is None
    with pytest.raises(KeyError, match="known"):
        parser_class("nope")


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {"type": "function", "function": {"name": "ping"}},
]


@pytest.mark.parametrize(
    "family,good,bad",
    [
        (
            "hermes",
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
            '<tool_call>\n{"name": "get_weather", "arguments": {"town": "Oslo"}}\n</tool_call>',
        ),
        ("llama3_json", '{"name": "ping", "parameters": {}}', '{"name": "pong", "parameters": {}}'),
        ("mistral", '[TOOL_CALLS][{"name": "ping", "arguments": {}}]', '[TOOL_CALLS]{"name": "ping", "arguments": {}}'),
    ],
)
def test_forced_grammar_accepts_the_family_markup_only(family, good, bad):
    accepts = forced_acceptor(family, TOOLS)
    assert accepts(good) and not accepts(bad)
    assert parse_text(parser_class(family)(), good).calls


def forced_acceptor(family: str, tools: list[dict]):
    """text -> whether the forced-call grammar of `tools` in `family`'s markup accepts it whole."""
    spec = forced_calls(parser_class(family), tools, parallel=False)
    grammar = xgrammar.Grammar.from_ebnf(spec.text)
    info = xgrammar.TokenizerInfo([chr(c) for c in range(32, 127)] + ["\n"])
    compiled = xgrammar.GrammarCompiler(info).compile_grammar(grammar)

    def accepts(text: str) -> bool:
        m = xgrammar.GrammarMatcher(compiled, terminate_without_stop_token=True)
        return m.accept_string(text) and m.is_terminated()

    return accepts


ADDRESS = {
    "$defs": {"Addr": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    "type": "object",
    "properties": {"addr": {"$ref": "#/$defs/Addr"}, "next": {"$ref": "#"}},
    "required": ["addr"],
}


@pytest.mark.parametrize("tools", [1, 2], ids=["one tool", "two tools"])
def test_forced_grammar_follows_local_references_of_the_parameters(tools):
    """Parameters with ``$defs`` and ``#`` references (pydantic's nested models) are enforced
    where they sit in the call's schema, with one tool or several (an ``anyOf``)."""
    accepts = forced_acceptor(
        "hermes", [{"type": "function", "function": {"name": "send", "parameters": ADDRESS}}] + TOOLS[: tools - 1]
    )
    call = '<tool_call>\n{"name": "send", "arguments": %s}\n</tool_call>'
    assert accepts(call % '{"addr": {"city": "Oslo"}, "next": {"addr": {"city": "Rome"}}}')
    assert not accepts(call % '{"addr": {"town": "Oslo"}}')
    assert not accepts(call % '{"addr": {"city": "Oslo"}, "next": {"addr": 1}}')
