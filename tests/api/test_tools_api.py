"""Tool calling in-process against the fake manager (`tests.support.fake_app`): the strict
``auto`` grammar and when it is sent, strict tools it cannot enforce, stop strings and tool
calls, tool messages that pair (or not) with calls, and earlier calls in the prompt. On live
servers: tests/e2e/test_tools_api.py and tests/e2e/real/test_tools_api.py."""

from __future__ import annotations

import pytest

from tests.support.tool_defs import TOOLS

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


# ---------------------------------------------------------------- strict tools under tool_choice auto
def strict_tools(strict: bool | None = True) -> list[dict]:
    return [{"type": "function", "function": {**t["function"], "strict": strict}} for t in TOOLS]


# ---------------------------------------------------------------- in-process: which requests get the grammar
NOT_ENFORCEABLE = {"type": "object", "properties": {"city": {"not": {"type": "string"}}}}


@pytest.fixture(scope="module")
def agent(tokenizer):
    from tests.support.fake_app import AGENT_OUTPUT, AGENT_PARSERS, app_client, in_pieces

    client, manager = app_client(tokenizer, in_pieces(AGENT_OUTPUT), AGENT_PARSERS)
    return client, manager


def sent_grammar(agent, **body):
    client, manager = agent
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": ASK, "max_tokens": 64, **body})
    assert r.status_code == 200, r.text
    return manager.sent[-1]


def test_strict_auto_grammar_is_sent_only_where_it_can_hold(agent):
    from protocol.enums import GrammarKind

    assert sent_grammar(agent, tools=TOOLS).grammar is None  # not strict: as before
    assert sent_grammar(agent, tools=strict_tools(False)).grammar is None
    assert sent_grammar(agent, tools=strict_tools(), tool_choice="none").grammar is None
    req = sent_grammar(agent, tools=strict_tools())
    assert req.grammar.kind == GrammarKind.EBNF and "TagDispatch" in req.grammar.text
    assert "get_weather" in req.grammar.text and "get_time" in req.grammar.text
    client, manager = agent
    client.post("/v1/chat/completions", json={"model": "m", "messages": ASK, "tools": strict_tools(), "n": 2})
    assert [r.grammar for r in manager.sent[-2:]] == [req.grammar] * 2
    assert (
        sent_grammar(
            agent,
            tools=strict_tools(),
            continue_final_message=True,
            add_generation_prompt=False,
            messages=ASK + [{"role": "assistant", "content": "Let me"}],
        ).grammar
        == req.grammar
    )
    # another constraint holds: today's behaviour (calls parsed, not enforced)
    rf = sent_grammar(agent, tools=strict_tools(), response_format={"type": "json_object"})
    assert rf.grammar.kind == GrammarKind.JSON_OBJECT
    budget = sent_grammar(agent, tools=strict_tools(), thinking_token_budget=8)
    assert budget.grammar is None and budget.reasoning_budget.budget == 8
    assert sent_grammar(agent, tools=strict_tools(), min_tokens=2).grammar is None


def test_strict_auto_grammar_reads_a_think_block_and_one_call_per_parallel_false(agent):
    """The agent server parses reasoning: a think block before the calls is free text;
    parallel_tool_calls false: the grammar stops after its first call."""
    import xgrammar

    parallel = sent_grammar(agent, tools=strict_tools()).grammar.text
    single = sent_grammar(agent, tools=strict_tools(), parallel_tool_calls=False).grammar.text
    assert "</think>" in parallel and parallel != single
    assert "loop_after_dispatch=true" in parallel and "loop_after_dispatch=false" in single
    xgrammar.Grammar.from_ebnf(single)


def test_a_strict_tool_the_grammar_cannot_enforce_is_refused_as_for_a_forced_call(agent):
    client, manager = agent
    sent = len(manager.sent)
    for choice in ("auto", "required"):
        tools = [
            TOOLS[0],
            {"type": "function", "function": {"name": "f", "parameters": NOT_ENFORCEABLE, "strict": choice == "auto"}},
        ]
        r = client.post(
            "/v1/chat/completions", json={"model": "m", "messages": ASK, "tools": tools, "tool_choice": choice}
        )
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "tools.1.function.parameters" and "not" in error["message"], error
    assert len(manager.sent) == sent
    not_strict = [{"type": "function", "function": {"name": "f", "parameters": NOT_ENFORCEABLE}}]
    assert sent_grammar(agent, tools=not_strict).grammar is None  # only shown to the model: accepted as before


def detokenized(tokenizer, req, text: str) -> tuple[str, str | None]:
    """(text, matched stop string) of `text` rendered token by token by a detokenizer with
    the detokenizer parameters of request `req` (a `GenerateReq`)."""
    from detokenizer_proc.manager import DetokenizerManager
    from protocol.enums import FinishReason
    from protocol.messages import BatchTokenOut, DetokSeed

    mgr = DetokenizerManager(tokenizer)
    mgr.seed(DetokSeed("r", req.detok, 0))
    out, matched = "", None
    ids = tokenizer.encode(text, add_special_tokens=False)
    for k, token in enumerate(ids):
        last = FinishReason.STOP if k == len(ids) - 1 else None
        got, _ = mgr.tokens(BatchTokenOut(["r"], [[token]], [k + 1], [last]))
        out += got.text_deltas[0]
        if got.finish_reasons[0] is not None:
            matched = got.matched_stop[0]
            break
    return out, matched


def test_a_stop_string_never_cuts_a_tool_call(agent, tokenizer):
    """A stop string that occurs in a call's arguments ("Paris" in {"city": "Paris"}) ended
    the request there, as vLLM and SGLang end it: the call's arguments cut to '{"city": "',
    finish_reason stop. Stop strings apply to the text outside calls: under ``auto`` until a
    call begins (the parser family's markers reach the detokenizer), under a forced call not
    at all (its output is the call); without tools, or with tool_choice none, as ever."""
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
    auto = sent_grammar(agent, tools=TOOLS, stop=["Paris"])
    strict = sent_grammar(agent, tools=strict_tools(), stop=["Paris"])
    forced = sent_grammar(agent, tools=TOOLS, tool_choice="required", stop=["Paris"])
    assert (
        (auto.detok.stop, auto.detok.call_markers)
        == (strict.detok.stop, strict.detok.call_markers)
        == (["Paris"], ["<tool_call>"])
    )
    assert forced.detok.stop == []
    for req in (auto, strict):
        assert detokenized(tokenizer, req, "Let me check." + call) == ("Let me check." + call, None)
        assert detokenized(tokenizer, req, "In Paris? " + call) == ("In ", "Paris")  # text before the call
    assert detokenized(tokenizer, forced, call) == (call, None)
    for plain in (
        sent_grammar(agent, stop=["Paris"]),
        sent_grammar(agent, tools=TOOLS, tool_choice="none", stop=["Paris"]),
    ):
        assert plain.detok.call_markers == [] and detokenized(tokenizer, plain, call) == (
            call[: call.index("Paris")],
            "Paris",
        )


def called(*ids: str, content: str | None = None) -> dict:
    """An assistant message calling get_weather once per id in `ids`."""
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            for i in ids
        ],
    }


def answer(call_id: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": "18C"}


@pytest.mark.parametrize(
    "messages,param,says",
    [
        (ASK + [answer("c1")], "messages.1.tool_call_id", "'c1' answers no tool call"),
        (ASK + [called("c1"), answer("c2")], "messages.2.tool_call_id", "'c2' answers no tool call"),
        (ASK + [called("c1"), answer("c1"), answer("c1")], "messages.3.tool_call_id", "'c1' answers no tool call"),
        (ASK + [called("c1"), answer("c1"), called("c2"), answer("c1")], "messages.4.tool_call_id", "answers no"),
        (ASK + [called("c1"), ASK[0]], "messages.1.tool_calls.0", "no tool message answering it before messages.2"),
        (ASK + [called("c1", "c2"), answer("c2"), ASK[0]], "messages.1.tool_calls.0", "'c1' has no tool message"),
        (ASK + [called("c1", "c2"), answer("c1")], "messages.1.tool_calls.1", "at the end of the conversation"),
        (
            ASK + [called("c1"), {"role": "system", "content": "Be brief."}, answer("c1")],
            "messages.1.tool_calls.0",
            "before messages.2",
        ),
        (
            ASK + [called("c1", "c1"), answer("c1")],
            "messages.1.tool_calls.1",
            "tool call id 'c1' is used twice (first at messages.1.tool_calls.0)",
        ),
        (
            ASK + [called("c1"), {"role": "assistant", "content": "One moment."}, called("c1"), answer("c1")],
            "messages.3.tool_calls.0",
            "'c1' is used twice (first at messages.1.tool_calls.0)",
        ),
    ],
    ids=[
        "no-call",
        "other-id",
        "answered-twice",
        "earlier-turn",
        "then-user",
        "one-of-two",
        "end",
        "then-system",
        "same-id-twice",
        "same-id-pending",
    ],
)
def test_tool_messages_that_do_not_pair_with_calls_are_400(agent, messages, param, says):
    """As OpenAI's API: a tool message must answer a call of the assistant turn before it, and
    each call needs its tool message before the next user or system turn, and calls waiting
    for results have ids of their own. They were rendered as sent (a result under an unknown id
    read as the answer to the last call; a call with no result followed by the user's next
    turn; two calls under one id, answered by one result, served as if both were answered)."""
    client, manager = agent
    sent = len(manager.sent)
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": messages, "tools": TOOLS})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"].startswith(param) and says in err["message"], err
    assert len(manager.sent) == sent


@pytest.mark.parametrize(
    "messages",
    [
        ASK + [called("c1", "c2"), answer("c2"), answer("c1"), ASK[0]],
        ASK + [called("c1", content="Let me check."), {"role": "assistant", "content": "One moment."}, answer("c1")],
        ASK + [called("c1"), answer("c1"), called("c2")],
        ASK + [called("c1")],
    ],
    ids=["any-order", "assistant-between", "ends-with-calls", "calls-just-made"],
)
def test_tool_messages_that_answer_each_call_are_served(agent, messages):
    """Results in any order, an assistant turn between calls and their results (the Responses
    and Anthropic routes write text after calls so), and calls not answered yet in a last
    assistant turn are served."""
    client, _ = agent
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": messages, "tools": TOOLS})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("tools", [{}, {"tools": TOOLS, "tool_choice": "none"}], ids=["no-tools", "choice-none"])
def test_earlier_calls_are_in_the_prompt_without_tools_in_the_request(agent, tokenizer, tools):
    """An agent's final turn often sends the conversation with its earlier calls and results
    but no tools, or ``tool_choice: "none"``. The calls were dropped from the prompt (an empty
    assistant turn before the tool result), since the family's markup was written only for a
    request whose tools were shown; now they are written as with tools (the server's
    ``--tool-call-parser`` family), and only the tool descriptions are left out."""
    client, manager = agent
    messages = ASK + [called("c1"), answer("c1")]
    r = client.post("/v1/chat/completions", json={"model": "m", "messages": messages, **tools})
    assert r.status_code == 200, r.text
    prompt = tokenizer.decode(manager.sent[-1].input_ids)
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>\n<|im_start|>tool\n18C<|im_end|>"
    ) in prompt
    assert "get_time" not in prompt  # the tools are not described
