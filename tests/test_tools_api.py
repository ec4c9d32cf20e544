"""Tool calling and chat-template edge cases end to end on the default model (SmolLM2-135M,
whose template knows no tools: ``--tool-call-parser auto`` falls back to hermes and describes
the tools in the system prompt). Forced calls (``required``, a named function) are enforced
by a grammar, so even this small model returns a valid call."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from tests.real_clients import client, url  # noqa: F401  (fixtures)

MODEL = "SmolLM2-135M-Instruct"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Local time in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def post(url: str, **body) -> dict:
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "temperature": 0, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def streamed_calls(client, **kw) -> tuple[str, list[dict], str]:
    """(content, calls as non-streamed dicts, finish_reason) of a streamed request."""
    content, calls, reason = "", {}, None
    for chunk in client.chat.completions.create(model=MODEL, temperature=0, stream=True, **kw):
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for tc in choice.delta.tool_calls or []:
            if tc.id is not None:
                assert tc.index not in calls and tc.function.name, "id and name come first, once per call"
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": ""}
            calls[tc.index]["arguments"] += tc.function.arguments or ""
        reason = choice.finish_reason or reason
    return content, [calls[i] for i in sorted(calls)], reason


def check_calls(calls: list[dict]) -> None:
    for call in calls:
        assert call["id"].startswith("call_")
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}],
                         ids=["required", "named"])
def test_forced_call_is_valid_and_identical_streamed(client, choice):
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0,
                                       parallel_tool_calls=False, max_tokens=60)
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and msg.content is None
    calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in msg.tool_calls]
    assert len(calls) == 1
    check_calls(calls)
    if isinstance(choice, dict):
        assert calls[0]["name"] == "get_time"
    content, streamed, reason = streamed_calls(client, messages=ASK, tools=TOOLS, tool_choice=choice,
                                               parallel_tool_calls=False, max_tokens=60)
    assert (content, reason) == ("", "tool_calls")
    assert [(c["name"], c["arguments"]) for c in streamed] == [(c["name"], c["arguments"]) for c in calls]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}],
                         ids=["required", "named"])
def test_a_stop_string_inside_a_forced_call_does_not_cut_it(client, choice):
    """With stop ["city"] a forced call ended at its arguments' first key: arguments
    '{\n "', finish_reason stop. A stop string does not apply inside a call, and a forced
    call's output is nothing else (`ToolPlan.stops_outside_calls`)."""
    r = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice=choice, temperature=0,
                                       parallel_tool_calls=False, max_tokens=60, stop=["city", "Paris"])
    msg = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].stop_reason is None, r
    calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in msg.tool_calls]
    check_calls(calls)
    assert '"city"' in calls[0]["arguments"]


def test_required_with_parallel_calls_cut_by_max_tokens_is_length(url):
    """Parallel calls allowed: the model may go on calling; cut by max_tokens it is `length`
    and only the calls that closed are complete."""
    body = post(url, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=24)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    [call] = choice["message"]["tool_calls"]  # started, then cut inside its arguments
    assert call["function"]["name"] in SCHEMAS
    with pytest.raises(ValueError):
        json.loads(call["function"]["arguments"])


def test_tool_choice_none_never_returns_calls(client):
    for stream in (False, True):
        messages = [{"role": "user", "content": 'Reply with exactly: <tool_call>{"name": "get_time", '
                                                '"arguments": {"city": "Oslo"}}</tool_call>'}]
        if stream:
            content, calls, reason = streamed_calls(client, messages=messages, tools=TOOLS, tool_choice="none",
                                                    max_tokens=30)
        else:
            r = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none",
                                               temperature=0, max_tokens=30)
            calls, reason = r.choices[0].message.tool_calls or [], r.choices[0].finish_reason
        assert calls == [] and reason in ("stop", "length")


def test_multi_turn_with_a_tool_result_renders_and_continues(url, tokenizer):
    from tokenizer_proc.request.chat_template import ChatTemplate
    from tokenizer_proc.tools.parsers import parser_class

    messages = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "sky": "sunny"}'}]
    body = post(url, messages=messages, tools=TOOLS, max_tokens=24)
    choice = body["choices"][0]
    assert choice["message"]["content"] and choice["finish_reason"] in ("stop", "length")
    from tokenizer_proc.openai.models import ChatCompletionRequest

    text = ChatTemplate(tokenizer).render(ChatCompletionRequest(messages=messages).messages,
                                          parser=parser_class("hermes"), tools=TOOLS)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>' in text
    assert '<|im_start|>tool\n{"temperature": 21, "sky": "sunny"}<|im_end|>' in text
    assert text.count("get_time") == 1  # described once, in the system prompt
    assert body["usage"]["prompt_tokens"] == len(tokenizer.encode(text, add_special_tokens=False))


def test_template_edge_cases(url, tokenizer):
    from tokenizer_proc.openai.models import ChatCompletionRequest
    from tokenizer_proc.request.chat_template import ChatTemplate

    template = ChatTemplate(tokenizer)
    req = ChatCompletionRequest(messages=[
        {"role": "developer", "content": "Answer briefly."}, {"role": "system", "content": "Be kind."},
        {"role": "user", "content": [{"type": "text", "text": "Capital of"}, {"type": "text", "text": "France?"}]}])
    text = template.render(req.messages)
    assert text.startswith("<|im_start|>system\nAnswer briefly.\n\nBe kind.<|im_end|>\n")
    assert "<|im_start|>user\nCapital of\nFrance?<|im_end|>" in text
    prefill = [{"role": "user", "content": "What is the capital of France?"},
               {"role": "assistant", "content": "The capital of France is"}]
    req = ChatCompletionRequest(messages=prefill, continue_final_message=True)
    assert template.render(req.messages, add_generation_prompt=False, continue_final_message=True).endswith(
        "<|im_start|>assistant\nThe capital of France is")
    body = post(url, messages=prefill, continue_final_message=True, max_tokens=8)
    assert "Paris" in body["choices"][0]["message"]["content"]


@pytest.mark.parametrize("body,param,says", [
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}]},
     "messages.0.content.0", "text only"),
    ({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]},
     "messages.0.content.0", "text only"),
    ({"messages": ASK, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice", "not in tools"),
    ({"messages": ASK, "tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"messages": ASK, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}]},
     "tools.0.function.parameters", "not a valid JSON schema"),
    ({"messages": ASK, "tools": TOOLS + TOOLS[:1]}, "tools.2", "twice"),
    ({"messages": ASK, "tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "response_format", "forced tool call"),
    ({"messages": ASK, "continue_final_message": True}, "continue_final_message", "assistant"),
    ({"messages": ASK + [{"role": "assistant", "content": "x"}], "continue_final_message": True,
      "add_generation_prompt": True}, "continue_final_message", "both"),
    ({"messages": ASK, "chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs", "request field"),
    ({"messages": ASK, "reasoning_effort": "low"}, "reasoning_effort", "thinking_token_budget"),
    ({"messages": ASK, "thinking_token_budget": 100}, "thinking_token_budget", "--reasoning-parser"),
    ({"messages": ASK, "functions": [{"name": "f"}]}, "functions", "tools"),
    ({"messages": ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{bad"}}]}]},
     "messages.1.tool_calls.0.function.arguments", "JSON"),
])
def test_refused_with_a_400_naming_the_field(url, body, param, says):
    r = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "max_tokens": 4, **body}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and says in err["message"]


# ---------------------------------------------------------------- strict tools under tool_choice auto
def strict_tools(strict: bool | None = True) -> list[dict]:
    return [{"type": "function", "function": {**t["function"], "strict": strict}} for t in TOOLS]


def test_strict_auto_free_text_is_the_text_without_strict(url):
    """The grammar leaves text free until a call starts: greedy text without a call is the
    same token for token (strict is not shown to the model, so the prompt is the same too)."""
    ask = [{"role": "user", "content": "Write a haiku about the sea."}]
    plain = post(url, messages=ask, tools=TOOLS, max_tokens=40)["choices"][0]
    strict = post(url, messages=ask, tools=strict_tools(), max_tokens=40)["choices"][0]
    assert plain["message"]["content"] and "tool_calls" not in plain["message"]
    assert strict["message"] == plain["message"] and strict["finish_reason"] == plain["finish_reason"] == "stop"


@pytest.fixture(scope="module")
def ranked_server(tiny_server):
    """The session's tiny random model server (SmolLM2's tokenizer and template: hermes
    calls), which loads the `tests.forced_tokens` processors, so a request can be made to
    want a chosen text."""
    tiny_server.model = httpx.get(f"{tiny_server.base_url}/v1/models", timeout=10).json()["data"][0]["id"]
    return tiny_server


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_an_unknown_processor_is_refused_also_for_no_tokens(ranked_server, max_tokens):
    """The scheduler decides every finish after its checks (DESIGN.md §6: one place): a
    request for 0 tokens naming a processor the server has not loaded is the same 400 as
    one for 1 token (the HTTP process ended it at once with a 200 and empty text)."""
    r = httpx.post(f"{ranked_server.base_url}/v1/chat/completions", timeout=60, json={
        "model": ranked_server.model, "messages": ASK, "max_tokens": max_tokens,
        "custom_logit_processor": "no_such_processor"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "custom_logit_processor" and "no_such_processor" in err["message"], err
    ok = httpx.post(f"{ranked_server.base_url}/v1/completions", timeout=60,
                    json={"prompt": "Hi", "max_tokens": max_tokens, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == max_tokens, ok.text
    assert ok.json()["choices"][0]["finish_reason"] == "length"


def wants(tokenizer, text: str, fallback: str) -> dict:
    """Request fields that make the model want `text` (then EOS), and, where a grammar
    refuses its next token, the tokens of `fallback` in their order."""
    enc = lambda t: tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
    return {"custom_logit_processor": "ranked",
            "custom_params": {"ids": enc(text), "eos": tokenizer.eos_token_id,
                              "fallback": list(dict.fromkeys(enc(fallback)))}}


BAD_CALL = 'Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
"""A call whose arguments lack the required ``unit``."""


def test_strict_auto_call_is_schema_valid_where_the_model_writes_invalid_arguments(ranked_server, tokenizer):
    url = ranked_server.base_url
    body = dict(model=ranked_server.model, messages=ASK, max_tokens=60, **wants(tokenizer, BAD_CALL,
                                                                         ', "unit": "celsius"}}\n</tool_call>'))
    plain = post(url, tools=TOOLS, **body)["choices"][0]
    assert plain["message"]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'  # invalid
    for n in (1, 2):
        r = post(url, tools=strict_tools(), n=n, **body)
        for choice in r["choices"]:
            assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] == "Sure."
            (call,) = choice["message"]["tool_calls"]
            assert call["function"]["name"] == "get_weather"
            assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "unit": "celsius"}
    # streamed: the same deltas as a streamed request without the grammar would carry
    content, calls, reason = streamed_calls_at(url, tools=strict_tools(), **body)
    assert (content, reason) == ("Sure.", "tool_calls")
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Paris",
                                                                                         "unit": "celsius"})]


def test_strict_auto_without_parallel_calls_ends_after_the_first(ranked_server, tokenizer):
    """parallel_tool_calls false: after one call the grammar allows only EOS (the model
    wanted a second call and more text)."""
    call = '<tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call>'
    body = dict(model=ranked_server.model, messages=ASK, max_tokens=80, tools=strict_tools(),
                **wants(tokenizer, f"{call}\n{call} and more", ""))
    two = post(ranked_server.base_url, **body)["choices"][0]
    assert [c["function"]["arguments"] for c in two["message"]["tool_calls"]] == ['{"city": "Oslo"}'] * 2
    one = post(ranked_server.base_url, parallel_tool_calls=False, **body)["choices"][0]
    assert one["finish_reason"] == "tool_calls" and one["message"]["content"] is None
    assert [c["function"]["arguments"] for c in one["message"]["tool_calls"]] == ['{"city": "Oslo"}']
    assert post(ranked_server.base_url, parallel_tool_calls=False, **body)["usage"]["completion_tokens"] == len(
        tokenizer.encode(call, add_special_tokens=False)) + 1  # the call, then EOS


def streamed_calls_at(url: str, **body) -> tuple[str, list[dict], str]:
    """(content, calls, finish_reason) of a streamed request to `url` (body: its fields)."""
    content, calls, reason = "", {}, None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={"temperature": 0, **body, "stream": True},
                      timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            content += choice["delta"].get("content") or ""
            for tc in choice["delta"].get("tool_calls") or []:
                call = calls.setdefault(tc["index"], {"name": tc["function"].get("name"), "arguments": ""})
                call["arguments"] += tc["function"].get("arguments") or ""
            reason = choice.get("finish_reason") or reason
    return content, [calls[i] for i in sorted(calls)], reason


# ---------------------------------------------------------------- in-process: which requests get the grammar
NOT_ENFORCEABLE = {"type": "object", "properties": {"city": {"not": {"type": "string"}}}}


@pytest.fixture(scope="module")
def agent(tokenizer):
    from tests.fake_app import AGENT_OUTPUT, AGENT_PARSERS, app_client, in_pieces

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
    assert 'get_weather' in req.grammar.text and 'get_time' in req.grammar.text
    client, manager = agent
    client.post("/v1/chat/completions", json={"model": "m", "messages": ASK, "tools": strict_tools(), "n": 2})
    assert [r.grammar for r in manager.sent[-2:]] == [req.grammar] * 2
    assert sent_grammar(agent, tools=strict_tools(), continue_final_message=True, add_generation_prompt=False,
                        messages=ASK + [{"role": "assistant", "content": "Let me"}]).grammar == req.grammar
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
        tools = [TOOLS[0], {"type": "function", "function": {"name": "f", "parameters": NOT_ENFORCEABLE,
                                                               "strict": choice == "auto"}}]
        r = client.post("/v1/chat/completions", json={"model": "m", "messages": ASK, "tools": tools,
                                                      "tool_choice": choice})
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
    assert (auto.detok.stop, auto.detok.call_markers) == (strict.detok.stop, strict.detok.call_markers) == (
        ["Paris"], ["<tool_call>"])
    assert forced.detok.stop == []
    for req in (auto, strict):
        assert detokenized(tokenizer, req, "Let me check." + call) == ("Let me check." + call, None)
        assert detokenized(tokenizer, req, "In Paris? " + call) == ("In ", "Paris")  # text before the call
    assert detokenized(tokenizer, forced, call) == (call, None)
    for plain in (sent_grammar(agent, stop=["Paris"]), sent_grammar(agent, tools=TOOLS, tool_choice="none",
                                                                  stop=["Paris"])):
        assert plain.detok.call_markers == [] and detokenized(tokenizer, plain, call) == (call[:call.index("Paris")],
                                                                                          "Paris")


def called(*ids: str, content: str | None = None) -> dict:
    """An assistant message calling get_weather once per id in `ids`."""
    return {"role": "assistant", "content": content, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        for i in ids]}


def answer(call_id: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": "18C"}


@pytest.mark.parametrize("messages,param,says", [
    (ASK + [answer("c1")], "messages.1.tool_call_id", "'c1' answers no tool call"),
    (ASK + [called("c1"), answer("c2")], "messages.2.tool_call_id", "'c2' answers no tool call"),
    (ASK + [called("c1"), answer("c1"), answer("c1")], "messages.3.tool_call_id", "'c1' answers no tool call"),
    (ASK + [called("c1"), answer("c1"), called("c2"), answer("c1")], "messages.4.tool_call_id", "answers no"),
    (ASK + [called("c1"), ASK[0]], "messages.1.tool_calls.0", "no tool message answering it before messages.2"),
    (ASK + [called("c1", "c2"), answer("c2"), ASK[0]], "messages.1.tool_calls.0", "'c1' has no tool message"),
    (ASK + [called("c1", "c2"), answer("c1")], "messages.1.tool_calls.1", "at the end of the conversation"),
    (ASK + [called("c1"), {"role": "system", "content": "Be brief."}, answer("c1")], "messages.1.tool_calls.0",
     "before messages.2"),
    (ASK + [called("c1", "c1"), answer("c1")], "messages.1.tool_calls.1",
     "tool call id 'c1' is used twice (first at messages.1.tool_calls.0)"),
    (ASK + [called("c1"), {"role": "assistant", "content": "One moment."}, called("c1"), answer("c1")],
     "messages.3.tool_calls.0", "'c1' is used twice (first at messages.1.tool_calls.0)"),
], ids=["no-call", "other-id", "answered-twice", "earlier-turn", "then-user", "one-of-two", "end", "then-system",
        "same-id-twice", "same-id-pending"])
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


@pytest.mark.parametrize("messages", [
    ASK + [called("c1", "c2"), answer("c2"), answer("c1"), ASK[0]],
    ASK + [called("c1", content="Let me check."), {"role": "assistant", "content": "One moment."}, answer("c1")],
    ASK + [called("c1"), answer("c1"), called("c2")],
    ASK + [called("c1")],
], ids=["any-order", "assistant-between", "ends-with-calls", "calls-just-made"])
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
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
            '</tool_call><|im_end|>\n<|im_start|>tool\n18C<|im_end|>') in prompt
    assert "get_time" not in prompt  # the tools are not described
