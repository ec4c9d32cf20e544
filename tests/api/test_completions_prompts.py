"""Completions prompts (issue 10 item 4): a list of prompts (n choices each, choice i of
prompt p at index p * n + i), prompts as token-id lists, echo with prompt logprobs per
prompt, and ``suffix`` (fill-in-the-middle where the tokenizer has FIM tokens, else a 400),
in-process with scripted deltas. Greedy on the tiny model's server:
tests/e2e/test_completions_prompts.py."""

from __future__ import annotations

import copy
from functools import partial

import pytest

from tests.support.fake_app import IM_END, VOCAB, app_client, two_steps
from text.hf_tokenizer import ModelFacts
from tokenizer_proc.native.convert import build_native
from tokenizer_proc.openai.convert import build_completion
from tokenizer_proc.openai.models import CompletionRequest
from tokenizer_proc.request.builder import RequestBuilder


@pytest.fixture(scope="module")
def fake(tokenizer):
    return app_client(tokenizer, two_steps)


def test_list_of_prompts_gives_n_choices_each(fake, tokenizer):
    client, manager = fake
    prompts = ["Hi there", "Once upon a time"]
    body = client.post("/v1/completions", json={"prompt": prompts, "n": 2, "max_tokens": 8, "echo": True}).json()
    sent = manager.sent[-4:]
    ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    assert [list(r.input_ids) for r in sent] == [ids[0], ids[0], ids[1], ids[1]]
    assert [r.group for r in sent] == ["", sent[0].rid, "", sent[2].rid]  # each prompt leads its own group
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in body["choices"]] == [p + " Hello" for p in prompts for _ in range(2)]
    assert body["usage"]["prompt_tokens"] == len(ids[0]) + len(ids[1])
    assert body["usage"]["completion_tokens"] == 4 * 4 and body["usage"]["prompt_tokens_details"]["cached_tokens"] == 2


def test_streamed_list_of_prompts_keeps_indexes(fake):
    client, _ = fake
    r = client.post(
        "/v1/completions",
        json={"prompt": [[9, 10], [11]], "max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}},
    )
    from tests.support.fake_app import sse

    chunks = sse(r)
    texts: dict[int, str] = {}
    for ch in chunks[:-2]:
        for c in ch["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
    assert texts == {0: " Hello", 1: " Hello"}
    assert chunks[-2]["usage"]["prompt_tokens"] == 3 and chunks[-1] == "[DONE]"


def test_echo_logprobs_per_prompt(fake, tokenizer):
    client, manager = fake
    body = client.post(
        "/v1/completions", json={"prompt": ["Hi world", "Once upon"], "max_tokens": 8, "logprobs": 1, "echo": True}
    ).json()
    first, second = body["choices"]
    assert first["text"] == "Hi world Hello" and first["logprobs"]["token_logprobs"][0] is None
    assert first["logprobs"]["tokens"][0] == "Hi"
    assert second["text"] == "Once upon Hello" and second["logprobs"]["tokens"][0] == "Once"
    assert second["logprobs"]["token_logprobs"][0] is None
    assert all(r.sampling.logprob_start_len == 0 for r in manager.sent[-2:])


@pytest.mark.parametrize("prompt, param", [([], "prompt"), ([[1], [VOCAB]], "prompt.1"), (["a", ""], "prompt.1")])
def test_bad_prompt_lists_name_the_prompt(fake, prompt, param):
    r = fake[0].post("/v1/completions", json={"prompt": prompt, "max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_a_prompt_of_a_list_that_fills_the_context_is_named_once(fake):
    from tests.support.fake_app import CONTEXT

    r = fake[0].post("/v1/completions", json={"prompt": [[1], [1] * CONTEXT], "max_tokens": 4})
    error = r.json()["error"]
    assert (r.status_code, error["param"]) == (400, "prompt.1")
    assert error["message"] == (
        f"prompt.1: the prompt has {CONTEXT} tokens, which leaves no room in the context "
        f"length of {CONTEXT} tokens: shorten it to at most {CONTEXT - 1} tokens"
    )
    # was "prompt.1: prompt: the prompt has ..."


def test_suffix_without_fim_tokens_is_a_400(fake):
    r = fake[0].post("/v1/completions", json={"prompt": "def f(", "suffix": "\n    return x", "max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix" and "fill-in-the-middle" in r.text


def test_suffix_builds_a_fim_prompt(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.add_special_tokens({"additional_special_tokens": ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"]})
    pre, suf, mid = tok.convert_tokens_to_ids(["<fim_prefix>", "<fim_suffix>", "<fim_middle>"])
    builder = RequestBuilder(tok, ModelFacts(8192, (IM_END,), VOCAB + 3), ("m",))
    built = build_completion(builder, CompletionRequest(prompt="def f(x):", suffix="    return y", max_tokens=4))
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    assert list(built.reqs[0].input_ids) == [pre, *enc("def f(x):"), suf, *enc("    return y"), mid]


def test_prompt_lists_are_bounded_by_batch_choices_not_by_n(fake):
    """The fake app: --max-n 4, --max-batch-choices 5. Five prompts of one choice each pass
    (more prompts than --max-n); six, or three of n=2, are a 400 naming the batch flag."""
    client, manager = fake
    r = client.post("/v1/completions", json={"prompt": ["a"] * 5, "max_tokens": 2})
    assert r.status_code == 200 and len(r.json()["choices"]) == 5, r.text
    for body in ({"prompt": ["a"] * 6}, {"prompt": ["a", "b", "c"], "n": 2}):
        sent = len(manager.sent)
        r = client.post("/v1/completions", json={**body, "max_tokens": 2})
        error = r.json()["error"]
        assert (r.status_code, error["param"]) == (400, "prompt")
        assert "6 choices, more than this server allows in one request (--max-batch-choices 5)" in error["message"]
        assert len(manager.sent) == sent  # nothing of it was sent
    r = client.post("/v1/completions", json={"prompt": ["a"], "n": 5, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n" and "--max-n 4" in r.text


def test_a_list_of_one_prompt_is_bounded_by_batch_choices(tokenizer):
    """--max-n 4, --max-batch-choices 1: a single prompt may ask for 4 choices, a list of
    prompts (one prompt too, completions or native) for 1 in all."""
    from tokenizer_proc.errors import APIError
    from tokenizer_proc.native.models import GenerateRequest

    builder = RequestBuilder(tokenizer, ModelFacts(8192, (IM_END,), VOCAB), ("m",), max_n=4, max_batch_choices=1)
    assert len(build_completion(builder, CompletionRequest(prompt="a", n=4, max_tokens=2)).reqs) == 4
    assert len(build_completion(builder, CompletionRequest(prompt=["a"], max_tokens=2)).reqs) == 1
    assert len(build_native(builder, GenerateRequest(text="a", sampling_params={"n": 4})).reqs) == 4
    for build, body, field in (
        (partial(build_completion, builder), CompletionRequest(prompt=["a"], n=3, max_tokens=2), "prompt"),
        (partial(build_completion, builder), CompletionRequest(prompt=[[5, 6]], n=3, max_tokens=2), "prompt"),
        (partial(build_native, builder), GenerateRequest(text=["a"], sampling_params={"n": 3}), "text"),
        (partial(build_native, builder), GenerateRequest(input_ids=[[5]], sampling_params={"n": 3}), "input_ids"),
    ):
        with pytest.raises(APIError) as e:
            build(body)
        assert (e.value.status, e.value.param) == (400, field)
        assert "1 prompts with n=3 each are 3 choices" in e.value.message and "--max-batch-choices 1" in e.value.message
