"""Unit tests of the HTTP process's output control without a model server: request fields →
`SamplingParams` (and every 400), ``n`` fan-out and merge, and the logprob shapes of chat,
completions and native responses. The app runs in-process against a fake manager that
answers each `GenerateReq` with scripted `Delta`s."""

from __future__ import annotations

import pytest

from protocol.enums import FinishReason
from protocol.messages import GenerateReq, LogprobEntries
from tests.support.fake_app import CHAT, IM_END, VOCAB, client_for, sse
from tokenizer_proc.link.tokenizer_manager import Delta
from tokenizer_proc.native.convert import build_native
from tokenizer_proc.openai.convert import build_chat, build_completion
from tokenizer_proc.output.logprob_format import LOGPROB_FLOOR
from tokenizer_proc.request.fan_out import fan_out


# ---------------------------------------------------------------- request fields → SamplingParams
def test_openai_fields_map_to_sampling_params(builder):
    built = build_chat(
        builder,
        builder_chat(
            min_p=0.1,
            frequency_penalty=0.5,
            presence_penalty=-1.5,
            repetition_penalty=1.3,
            min_tokens=3,
            stop_token_ids=[7],
            logprobs=True,
            top_logprobs=4,
            seed=11,
        ),
    )
    s = built.reqs[0].sampling
    assert (s.min_p, s.frequency_penalty, s.presence_penalty, s.repetition_penalty) == (0.1, 0.5, -1.5, 1.3)
    assert s.min_tokens == 3 and s.min_tokens_ids == [IM_END, 7]
    assert (s.top_logprobs, s.logprob_start_len, s.seed) == (4, -1, 11)
    assert built.echo(0) is None and built.head(0) is None


def builder_chat(**kw):
    from tokenizer_proc.openai.models import ChatCompletionRequest

    return ChatCompletionRequest(**{**CHAT, **kw})


def completion(**kw):
    from tokenizer_proc.openai.models import CompletionRequest

    return CompletionRequest(**{"prompt": "Hi there", "max_tokens": 8, **kw})


def test_a_prefill_cannot_run_under_a_grammar(builder):
    """A grammar holds from the first generated token, so under continue_final_message the
    reply would start a new document after the prefilled text ('{"name": "Al' then
    '{"name": "Bo"}': the message does not parse although it ends "stop"): a 400."""
    from tokenizer_proc.errors import APIError
    from tokenizer_proc.openai.models import ChatCompletionRequest

    turns = [{"role": "user", "content": "Name?"}, {"role": "assistant", "content": '{"name": "Al'}]
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    prefill = {"messages": turns, "continue_final_message": True, "add_generation_prompt": False, "max_tokens": 8}
    assert build_chat(builder, ChatCompletionRequest(**prefill)).reqs[0].grammar is None  # a prefill alone is fine
    for fmt in ({"type": "json_object"}, {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}):
        with pytest.raises(APIError) as e:
            build_chat(builder, ChatCompletionRequest(**prefill, response_format=fmt))
        assert (e.value.status, e.value.param) == (400, "continue_final_message") and "grammar" in e.value.message


def test_logprob_defaults_and_min_tokens_without_eos(builder):
    assert build_chat(builder, builder_chat()).reqs[0].sampling.top_logprobs == -1
    assert build_chat(builder, builder_chat(logprobs=True)).reqs[0].sampling.top_logprobs == 0
    s = build_completion(builder, completion(min_tokens=2, ignore_eos=True)).reqs[0].sampling
    assert s.min_tokens_ids == [] and s.min_tokens == 2
    assert build_completion(builder, completion()).reqs[0].sampling.min_tokens_ids == []


def test_completion_echo_and_logprobs(builder, tok):
    built = build_completion(builder, completion(prompt="Hi there", logprobs=2, echo=True))
    req = built.reqs[0]
    assert req.sampling.top_logprobs == 2 and req.sampling.logprob_start_len == 0
    assert built.echo(0) == "Hi there"
    ids = tok.encode("Hi there", add_special_tokens=False)
    assert built.head(0).token_ids == ids[:1] and built.head(0).tokens == ["Hi"]
    assert req.detok.logprob_context_ids == ids[:1]
    assert build_completion(builder, completion(logprobs=0)).reqs[0].sampling.logprob_start_len == -1
    assert build_completion(builder, completion(echo=True)).head(0) is None


def test_native_fields(builder):
    from tokenizer_proc.native.models import GenerateRequest

    body = GenerateRequest(
        text="a b c d e f g h",
        return_logprob=True,
        top_logprobs_num=3,
        token_ids_logprob=[5, 9],
        logprob_start_len=3,
        sampling_params={"min_new_tokens": 2, "min_p": 0.2, "n": 2, "repetition_penalty": 1.1, "seed": 2**63 - 1},
    )
    built = build_native(builder, body)
    a, b = built.reqs
    assert (a.sampling.top_logprobs, a.sampling.token_ids_logprob, a.sampling.logprob_start_len) == (3, [5, 9], 3)
    assert a.sampling.min_tokens == 2 and a.sampling.min_p == 0.2 and a.sampling.repetition_penalty == 1.1
    assert a.detok.logprob_context_ids == a.input_ids[:3]
    assert built.head(0) is None  # prompt logprobs start past position 0
    assert b.group == a.rid and b.rid == f"{a.rid}-1" and a.group == ""
    assert b.sampling.seed == -(2**63)  # seed + 1, wrapped into int64
    assert b.input_ids == a.input_ids and b.max_new_tokens == a.max_new_tokens


def test_fan_out_seeds():
    req = GenerateReq("x", [1, 2], 4)
    out = fan_out(req, 3)
    assert [r.rid for r in out] == ["x", "x-1", "x-2"] and [r.group for r in out] == ["", "x", "x"]
    assert all(r.sampling.seed is None for r in out)
    from msgspec.structs import replace

    seeded = fan_out(replace(req, sampling=replace(req.sampling, seed=40)), 3)
    assert [r.sampling.seed for r in seeded] == [40, 41, 42]


def _deep(levels: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


DEEP = _deep(150)
"""A schema that nests deeper than the metaschema check can recurse (a 500 once)."""


BAD = [
    ("/v1/chat/completions", {**CHAT, "min_p": 1.5}, "min_p"),
    ("/v1/chat/completions", {**CHAT, "min_p": -0.1}, "min_p"),
    ("/v1/chat/completions", {**CHAT, "frequency_penalty": 2.5}, "frequency_penalty"),
    ("/v1/chat/completions", {**CHAT, "presence_penalty": -2.1}, "presence_penalty"),
    ("/v1/chat/completions", {**CHAT, "repetition_penalty": 0}, "repetition_penalty"),
    ("/v1/chat/completions", {**CHAT, "min_tokens": -1}, "min_tokens"),
    ("/v1/chat/completions", {**CHAT, "min_tokens": 9}, "min_tokens"),
    ("/v1/chat/completions", {**CHAT, "n": 0}, "n"),
    ("/v1/chat/completions", {**CHAT, "n": 5}, "n"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 0, "logprobs": False}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {str(VOCAB): 1}}, "logit_bias"),
    ("/v1/chat/completions", {**CHAT, "stop_token_ids": [-1]}, "stop_token_ids"),
    (
        "/v1/chat/completions",
        {**CHAT, "tools": [{"type": "function"}]},
        "tools.0.function",
    ),  # a tool needs its function
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema"}}, "response_format"),
    ("/v1/completions", {"prompt": "Hi", "logprobs": 50}, "logprobs"),
    ("/v1/completions", {"prompt": "Hi", "logprobs": -1}, "logprobs"),
    ("/v1/completions", {"prompt": "Hi", "best_of": 2}, "best_of"),
    ("/v1/completions", {"prompt": "Hi", "suffix": "x"}, "suffix"),
    ("/v1/completions", {"prompt": ["a", "b", "c"], "n": 2}, "prompt"),  # 6 choices > --max-batch-choices 5
    ("/generate", {"text": "Hi", "sampling_params": {"n": 5}}, "sampling_params.n"),
    ("/generate", {"text": "Hi", "sampling_params": {"n": 0}}, "sampling_params.n"),
    ("/generate", {"text": "Hi", "sampling_params": {"min_new_tokens": 200}}, "sampling_params.min_new_tokens"),
    (
        "/generate",
        {"text": "Hi", "sampling_params": {"min_new_tokens": 2, "regex": "a+"}},
        "sampling_params.min_new_tokens",
    ),
    ("/generate", {"text": "Hi", "custom_params": {"a": 1}}, "custom_params"),
    ("/generate", {"text": "Hi", "return_logprob": True, "token_ids_logprob": list(range(65))}, "token_ids_logprob"),
    (
        "/generate",
        {"text": "Hi", "sampling_params": {"repetition_penalty": 1e-39}},
        "sampling_params.repetition_penalty",
    ),
    ("/v1/completions", {"prompt": "Hi", "guided_regex": "a+"}, "guided_regex"),
    (
        "/v1/chat/completions",
        {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"schema": DEEP}}},
        "response_format",
    ),
    (
        "/generate",
        {"text": "Hi", "sampling_params": {"json_schema": "[" * 5000 + "]" * 5000}},
        "sampling_params.json_schema",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"},
        "tool_choice",
    ),
    ("/generate", {"text": "Hi", "sampling_params": {"frequency_penalty": 3}}, "sampling_params.frequency_penalty"),
    ("/generate", {"text": "Hi", "sampling_params": {"max_tokens": 3}}, "sampling_params.max_tokens"),
    ("/generate", {"text": "Hi", "sampling_params": {"logit_bias": {"-3": 1}}}, "sampling_params.logit_bias"),
    ("/generate", {"text": "Hi", "sampling_params": {"stop_token_ids": [VOCAB]}}, "sampling_params.stop_token_ids"),
    ("/generate", {"text": "Hi", "top_logprobs_num": 2}, "top_logprobs_num"),
    ("/generate", {"text": "Hi", "token_ids_logprob": [3]}, "token_ids_logprob"),
    ("/generate", {"text": "Hi", "logprob_start_len": 1}, "logprob_start_len"),  # 0 asks nothing (issue 44)
    ("/generate", {"text": "Hi", "return_logprob": True, "token_ids_logprob": [VOCAB]}, "token_ids_logprob"),
    ("/generate", {"text": "Hi", "return_logprob": True, "logprob_start_len": 5}, "logprob_start_len"),
    ("/generate", {"text": "Hi", "return_logprob": True, "logprob_start_len": -2}, "logprob_start_len"),
    ("/generate", {"text": "Hi", "return_logprob": True, "top_logprobs_num": 21}, "top_logprobs_num"),
]


@pytest.mark.parametrize("path,body,param", BAD, ids=[f"{p}-{param}-{i}" for i, (p, _, param) in enumerate(BAD)])
def test_bad_fields_are_400(builder, path, body, param):
    client, manager = client_for(builder)
    for stream in (False, True):
        r = client.post(path, json={**body, "stream": stream})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and err["message"]
    assert manager.sent == []


def test_unknown_native_key_names_it(builder):
    client, _ = client_for(builder)
    r = client.post("/generate", json={"text": "Hi", "sampling_params": {"max_tokens": 3}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params.max_tokens"
    assert r.json()["error"]["message"] == (
        "sampling_params.max_tokens: unknown key 'max_tokens' in sampling_params; SGLang's name here is max_new_tokens"
    )
    r = client.post("/generate", json={"text": "Hi", "sampling_params": {"min_tokens": 3}})
    assert r.json()["error"]["message"].endswith("; SGLang's name here is min_new_tokens")
    r = client.post("/generate", json={"text": "Hi", "sampling_params": {"foo": 3}})  # no hint for other keys
    assert r.json()["error"]["message"] == "sampling_params.foo: unknown key 'foo' in sampling_params"
    r = client.post("/generate", json={"text": "Hi", "sampling_params": {"response_format": {"type": "json_object"}}})
    assert r.json()["error"]["message"].endswith(
        "; structured output here is json_schema (the schema as a JSON string), regex or ebnf"
    )


# ---------------------------------------------------------------- chat
def test_chat_logprobs_stream_and_full(builder):
    client, _ = client_for(builder)
    body = {**CHAT, "logprobs": True, "top_logprobs": 2}
    full = client.post("/v1/chat/completions", json=body).json()
    content = full["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == [" H", "el", "lo"]
    assert "".join(c["token"] for c in content) == full["choices"][0]["message"]["content"] == " Hello"
    assert content[0] == {
        "token": " H",
        "logprob": -0.5,
        "bytes": list(b" H"),
        "top_logprobs": [
            {"token": " H", "logprob": -0.5, "bytes": list(b" H")},
            {"token": "alt", "logprob": -5.0, "bytes": list(b"alt")},
        ],
    }
    assert content[2]["logprob"] == LOGPROB_FLOOR  # -inf is not JSON
    chunks = sse(client.post("/v1/chat/completions", json={**body, "stream": True}))
    assert chunks[-1] == "[DONE]"
    streamed = [
        c for ch in chunks[:-1] if ch["choices"][0]["logprobs"] for c in ch["choices"][0]["logprobs"]["content"]
    ]
    assert streamed == content
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_chat_without_logprobs_has_null(builder):
    client, _ = client_for(builder)
    full = client.post("/v1/chat/completions", json=CHAT).json()
    assert full["choices"][0]["logprobs"] is None
    chunks = sse(client.post("/v1/chat/completions", json={**CHAT, "stream": True}))
    assert all(ch["choices"][0]["logprobs"] is None for ch in chunks[:-1])


def test_chat_top_logprobs_zero_gives_empty_lists(builder):
    client, _ = client_for(builder)
    full = client.post("/v1/chat/completions", json={**CHAT, "logprobs": True}).json()
    content = full["choices"][0]["logprobs"]["content"]
    assert [c["top_logprobs"] for c in content] == [[], [], []]


# ---------------------------------------------------------------- completions
def test_completion_logprobs_shape(builder):
    client, _ = client_for(builder)
    full = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 8, "logprobs": 2}).json()
    lp = full["choices"][0]["logprobs"]
    assert lp["tokens"] == [" H", "el", "lo"]
    assert lp["token_logprobs"] == [-0.5, -1.0, LOGPROB_FLOOR]
    assert lp["top_logprobs"][0] == {" H": -0.5, "alt": -5.0}
    assert lp["text_offset"] == [0, 2, 4]
    chunks = sse(client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 8, "logprobs": 2, "stream": True}))
    parts = [ch["choices"][0]["logprobs"] for ch in chunks[:-1] if ch["choices"][0]["logprobs"]]
    assert {k: [x for p in parts for x in p[k]] for k in lp} == lp


def test_completion_logprobs_zero_keeps_the_chosen_token(builder):
    client, _ = client_for(builder)
    lp = client.post("/v1/completions", json={"prompt": "Hi", "logprobs": 0}).json()["choices"][0]["logprobs"]
    assert lp["top_logprobs"] == [{" H": -0.5}, {"el": -1.0}, {"lo": LOGPROB_FLOOR}]


def colliding(req: GenerateReq) -> list[Delta]:
    """One token that ends inside a character ("" in the text) whose top alternatives include
    three byte tokens that each decode alone to U+FFFD, then one whose text a likelier other
    token shares."""
    top = [[15107, 116, 120, 31], [900, 901]]
    lps = [[-0.7, -1.2, -3.0, -2.0], [-0.4, -1.5]]
    texts = [["\ufffd", "\ufffd", "\ufffd", "x"], ["ab", "ab"]]
    raw = [[b"\xf0\x9f", b"\xa6", b"\x99", b"x"], [b"ab", b"ab"]]
    e = LogprobEntries(
        0,
        [15107, 901],
        ["", "\ufffdab"],
        [b"\xf0\x9f", b"ab"],
        [-0.7, -1.5],
        top_ids=top,
        top_tokens=texts,
        top_bytes=raw,
        top_logprobs=lps,
        ids_logprobs=[[-3.0], [-3.0]],
    )
    return [Delta("\ufffdab", 2, FinishReason.LENGTH, logprobs=e)]


def test_completion_top_logprobs_keep_the_likeliest_token_of_each_text(builder):
    """Completions top_logprobs are keyed by text; tokens that render alike (byte tokens that
    decode alone to U+FFFD, or another token with the chosen token's text) share one key,
    which holds the highest of their logprobs, streamed or not. It held the last one written,
    the least likely ("\ufffd": -3.0, "ab": -1.5). A chosen token that shows no text yet and is
    among the alternatives adds no "" key (it named no token). Chat lists every alternative
    with its bytes."""
    client, _ = client_for(builder, colliding)
    body = {"prompt": "Hi", "max_tokens": 2, "logprobs": 4}
    lp = client.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]
    assert lp["top_logprobs"] == [{"\ufffd": -0.7, "x": -2.0}, {"ab": -0.4, "\ufffdab": -1.5}]
    chunks = sse(client.post("/v1/completions", json={**body, "stream": True}))
    assert [
        t for ch in chunks[:-1] if ch["choices"][0]["logprobs"] for t in ch["choices"][0]["logprobs"]["top_logprobs"]
    ] == lp["top_logprobs"]
    chat = client.post("/v1/chat/completions", json={**CHAT, "logprobs": True, "top_logprobs": 4}).json()
    content = chat["choices"][0]["logprobs"]["content"]
    assert [[(t["token"], t["logprob"], bytes(t["bytes"])) for t in c["top_logprobs"]] for c in content] == [
        [("\ufffd", -0.7, b"\xf0\x9f"), ("\ufffd", -1.2, b"\xa6"), ("\ufffd", -3.0, b"\x99"), ("x", -2.0, b"x")],
        [("ab", -0.4, b"ab"), ("ab", -1.5, b"ab")],
    ]


def test_completion_echo_with_logprobs(builder):
    """Echo: the prompt text first; its entries first, the first token's logprob and top null;
    text_offset indexes the returned text; streamed parts join to the non-streamed."""
    client, _ = client_for(builder)
    body = {"prompt": "Hi world", "max_tokens": 8, "logprobs": 1, "echo": True}
    full = client.post("/v1/completions", json=body).json()
    choice = full["choices"][0]
    assert choice["text"] == "Hi world Hello"
    lp = choice["logprobs"]
    assert lp["tokens"] == ["Hi", " world", " H", "el", "lo"]
    assert lp["token_logprobs"] == [None, -2.5, -0.5, -1.0, LOGPROB_FLOOR]
    assert lp["top_logprobs"][0] is None and lp["top_logprobs"][1] == {" world": -2.5}
    assert lp["text_offset"] == [0, 2, 8, 10, 12]
    assert all(choice["text"][o:].startswith(t) for o, t in zip(lp["text_offset"], lp["tokens"]))
    chunks = sse(client.post("/v1/completions", json={**body, "stream": True}))
    assert "".join(ch["choices"][0]["text"] for ch in chunks[:-1]) == choice["text"]
    parts = [ch["choices"][0]["logprobs"] for ch in chunks[:-1] if ch["choices"][0]["logprobs"]]
    assert {k: [x for p in parts for x in p[k]] for k in lp} == lp


def test_completion_echo_without_logprobs(builder):
    client, _ = client_for(builder)
    choice = client.post("/v1/completions", json={"prompt": "Hi", "echo": True}).json()["choices"][0]
    assert choice["text"] == "Hi Hello" and choice["logprobs"] is None


# ---------------------------------------------------------------- native
def test_native_logprobs_meta_info(builder, tok):
    client, _ = client_for(builder)
    body = {
        "text": "Hi world",
        "return_logprob": True,
        "top_logprobs_num": 1,
        "token_ids_logprob": [9],
        "logprob_start_len": 0,
    }
    out = client.post("/generate", json=body).json()
    meta = out["meta_info"]
    assert out["text"] == " Hello"
    assert meta["output_token_logprobs"] == [[-0.5, 100, " H"], [-1.0, 101, "el"], [LOGPROB_FLOOR, 102, "lo"]]
    assert meta["output_top_logprobs"][0] == [[-0.5, 100, " H"]]
    assert meta["output_token_ids_logprobs"][0] == [[-3.0, 9, tok.decode([9])]]
    head = tok.encode("Hi world", add_special_tokens=False)[0]
    assert meta["input_token_logprobs"] == [[None, head, "Hi"], [-2.5, 100, " world"]]
    assert meta["input_top_logprobs"][0] is None and meta["input_token_ids_logprobs"][0] is None
    events = sse(client.post("/generate", json={**body, "stream": True}))
    assert events[-1] == "[DONE]" and events[-2]["index"] == 0
    assert {**events[-2]["meta_info"], "id": meta["id"]} == meta


def test_native_without_logprobs_has_no_logprob_keys(builder):
    client, _ = client_for(builder)
    meta = client.post("/generate", json={"text": "Hi"}).json()["meta_info"]
    assert not [k for k in meta if "logprobs" in k]
    meta = client.post("/generate", json={"text": "Hi", "return_logprob": True}).json()["meta_info"]
    assert sorted(k for k in meta if "logprobs" in k) == ["output_token_logprobs", "output_top_logprobs"]


# ---------------------------------------------------------------- n > 1
def by_choice(req: GenerateReq) -> list[Delta]:
    """Choice i (from its rid) answers "c{i}" in i + 1 tokens."""
    i = int(req.rid.rsplit("-", 1)[1]) if req.group else 0
    return [Delta(f"c{i}", i + 1, FinishReason.LENGTH, cached_tokens=3 if i == 0 else 9)]


def test_n_merge_non_stream(builder):
    client, manager = client_for(builder, by_choice)
    full = client.post("/v1/completions", json={"prompt": "Hi", "n": 3, "seed": 5}).json()
    assert [(c["index"], c["text"], c["finish_reason"]) for c in full["choices"]] == [
        (0, "c0", "length"),
        (1, "c1", "length"),
        (2, "c2", "length"),
    ]
    assert full["usage"]["completion_tokens"] == 6 and full["usage"]["prompt_tokens"] == 1
    assert full["usage"]["prompt_tokens_details"]["cached_tokens"] == 3
    assert sorted(r.sampling.seed for r in manager.sent) == [5, 6, 7]


def test_n_merge_stream_chat(builder):
    client, _ = client_for(builder, by_choice)
    chunks = sse(
        client.post(
            "/v1/chat/completions", json={**CHAT, "n": 3, "stream": True, "stream_options": {"include_usage": True}}
        )
    )
    assert chunks[-1] == "[DONE]"
    usage = [c for c in chunks[:-1] if c.get("usage")]
    assert len(usage) == 1 and usage[0] is chunks[-2] and usage[0]["choices"] == []
    assert usage[0]["usage"]["completion_tokens"] == 6
    roles = [c["choices"][0]["index"] for c in chunks[:-2] if c["choices"][0]["delta"].get("role")]
    assert roles == [0, 1, 2]
    text = {
        i: "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks[:-2] if c["choices"][0]["index"] == i)
        for i in range(3)
    }
    assert text == {0: "c0", 1: "c1", 2: "c2"}


@pytest.mark.parametrize(
    "path,body,n",
    [
        ("/v1/chat/completions", CHAT, 3),
        ("/v1/completions", {"prompt": "Hi"}, 3),
        ("/v1/completions", {"prompt": [[5, 6], [7, 8, 9]]}, 2),
    ],
)
def test_continuous_usage_stats_count_each_chunks_own_choice(builder, path, body, n):
    """vLLM's ``stream_options.continuous_usage_stats`` (with include_usage): every chunk
    carries the usage of the choice it belongs to, as vLLM counts it: that choice's prompt
    tokens (its own prompt's, when a completions request has several) and its own completion
    tokens so far (0 on a chat role chunk); the final usage chunk sums the choices, each
    prompt once. Without it only that last chunk has a usage. (Each chunk summed every
    choice's tokens so far.)"""
    client, manager = client_for(builder, by_choice)
    opts = {"include_usage": True, "continuous_usage_stats": True}
    chunks = sse(client.post(path, json={**body, "n": n, "stream": True, "stream_options": opts}))[:-1]
    prompt_len = [len(r.input_ids) for r in manager.sent]
    final = {i: 1 + i % n for i in range(len(manager.sent))}  # by_choice: choice i of a prompt ends with i + 1 tokens
    for c in chunks[:-1]:
        (choice,) = c["choices"]
        i, u = choice["index"], c["usage"]
        role = bool((choice.get("delta") or {}).get("role"))
        assert (u["prompt_tokens"], u["completion_tokens"]) == (prompt_len[i], 0 if role else final[i]), c
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        # its prompt's cached tokens as its leader reported them so far (by_choice: 3); a leader's
        # role chunk waits for its first delta, so it reports them too (it said 0, the rest 3)
        cached = u["prompt_tokens_details"]["cached_tokens"]
        assert cached == 3 if i % n == 0 else cached in (0, 3)
    leaders = [len(r.input_ids) for r in manager.sent if not r.group]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == sum(final.values())
    assert chunks[-1]["usage"]["prompt_tokens"] == sum(leaders)
    plain = sse(client.post(path, json={**body, "n": n, "stream": True, "stream_options": {"include_usage": True}}))
    assert [bool(c.get("usage")) for c in plain[:-1]] == [False] * (len(plain) - 2) + [True]


def test_n_native_list(builder):
    client, _ = client_for(builder, by_choice)
    out = client.post("/generate", json={"text": "Hi", "sampling_params": {"n": 2}}).json()
    assert [o["text"] for o in out] == ["c0", "c1"]
    assert out[1]["meta_info"]["id"] == out[0]["meta_info"]["id"] + "-1"


def test_error_in_one_choice_fails_the_request(builder):
    from tokenizer_proc.errors import APIError

    def script(req):
        return [APIError("boom", 503)] if req.group else by_choice(req)

    client, _ = client_for(builder, script)
    r = client.post("/v1/completions", json={"prompt": "Hi", "n": 2})
    assert r.status_code == 503 and r.json()["error"]["message"] == "boom"
    chunks = sse(client.post("/v1/completions", json={"prompt": "Hi", "n": 2, "stream": True}))
    assert chunks[-1] == "[DONE]" and chunks[-2]["error"]["message"] == "boom"
