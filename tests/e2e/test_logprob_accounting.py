"""Token accounting at a finish (issue 44, item 5): the number of output logprob entries
equals ``completion_tokens`` at every finish kind (an ending EOS, an EOS as the first token,
a stop token id, a stop string, the length limit), on chat, completions and ``/generate``,
streamed and not. The choice held everywhere: an ending EOS or stop token counts (as in
vLLM and SGLang) and so has its entry, though its text is not rendered."""

from __future__ import annotations

import json

import httpx
import pytest

X = " banana"
"""A one-token text the tests force with logit_bias."""


@pytest.fixture(scope="module")
def url(tiny_server):
    return tiny_server.base_url


@pytest.fixture(scope="module")
def ids(tokenizer) -> dict[str, int]:
    x = tokenizer.encode(X, add_special_tokens=False)
    assert len(x) == 1
    return {"eos": tokenizer.eos_token_id, "x": x[0]}


def finish_kinds(ids: dict[str, int]) -> dict[str, tuple[dict, int]]:
    """Each finish kind: (sampling fields in OpenAI's names, the completion tokens it makes)."""
    eos, x = ids["eos"], ids["x"]
    return {
        "eos_first": ({"logit_bias": {eos: 100}, "max_tokens": 8}, 1),
        "eos_after_min_tokens": ({"logit_bias": {eos: 100}, "min_tokens": 3, "max_tokens": 8}, 4),
        "stop_token_id": ({"logit_bias": {x: 100}, "stop_token_ids": [x], "min_tokens": 2, "max_tokens": 8}, 3),
        "stop_string": ({"logit_bias": {x: 100}, "stop": [X], "min_tokens": 2, "max_tokens": 8}, 3),
        "length": ({"logit_bias": {x: 100}, "max_tokens": 5}, 5),
    }


KINDS = ["eos_first", "eos_after_min_tokens", "stop_token_id", "stop_string", "length"]


def _openai(url: str, route: str, fields: dict, stream: bool) -> tuple[int, int, str]:
    """(completion_tokens, logprob entries, finish_reason) of one OpenAI request."""
    body = {"temperature": 0, **fields, "logit_bias": {str(k): v for k, v in fields["logit_bias"].items()}}
    if route == "/v1/chat/completions":
        body.update(messages=[{"role": "user", "content": "Name a fruit."}], logprobs=True, top_logprobs=1)
    else:
        body.update(prompt="Name a fruit.", logprobs=1)
    count = lambda lp: len(lp["content"]) if "content" in lp else len(lp["tokens"])  # noqa: E731
    if not stream:
        r = httpx.post(url + route, json=body, timeout=60)
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        return r.json()["usage"]["completion_tokens"], count(choice["logprobs"]), choice["finish_reason"]
    body.update(stream=True, stream_options={"include_usage": True})
    entries, usage, reason = 0, None, None
    with httpx.stream("POST", url + route, json=body, timeout=60) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk["choices"]:
                entries += count(choice["logprobs"]) if choice.get("logprobs") else 0
                reason = choice.get("finish_reason") or reason
    return usage["completion_tokens"], entries, reason


def _native(url: str, fields: dict, stream: bool) -> tuple[int, int, str]:
    """(completion_tokens, output logprob entries, finish type) of one ``/generate`` request."""
    names = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"}
    params = {"temperature": 0, **{names.get(k, k): v for k, v in fields.items()}}
    params["logit_bias"] = {str(k): v for k, v in fields["logit_bias"].items()}
    body = {"text": "Name a fruit.", "return_logprob": True, "sampling_params": params, "stream": stream}
    if not stream:
        r = httpx.post(f"{url}/generate", json=body, timeout=60)
        assert r.status_code == 200, r.text
        meta = r.json()["meta_info"]
    else:
        meta = None
        with httpx.stream("POST", f"{url}/generate", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    meta = json.loads(line[6:])["meta_info"]
    return meta["completion_tokens"], len(meta["output_token_logprobs"]), meta["finish_reason"]["type"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions", "/generate"])
@pytest.mark.parametrize("kind", KINDS)
def test_logprob_entries_equal_completion_tokens_at_every_finish(url, ids, kind, route, stream):
    fields, tokens = finish_kinds(ids)[kind]
    if route == "/generate":
        used, entries, reason = _native(url, fields, stream)
    else:
        used, entries, reason = _openai(url, route, fields, stream)
    assert (used, entries) == (tokens, tokens)
    assert reason == ("length" if kind == "length" else "stop")


def test_the_ending_eos_entry_is_spelled_as_its_token(url, ids, tokenizer):
    """The EOS's entry: its text is not in the output, and the entry spells the token as its
    top alternatives (and vLLM) do, not as "" beside a "<|im_end|>" alternative."""
    eos_text = tokenizer.convert_ids_to_tokens(ids["eos"])
    bias = {str(ids["eos"]): 100}
    chat = httpx.post(
        f"{url}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Hi"}], "logit_bias": bias, "logprobs": True, "top_logprobs": 2},
        timeout=60,
    ).json()["choices"][0]
    entry = chat["logprobs"]["content"][-1]
    assert chat["message"]["content"] == "" and entry["token"] == eos_text
    assert entry["token"] in [t["token"] for t in entry["top_logprobs"]]
    completion = httpx.post(
        f"{url}/v1/completions", json={"prompt": "Hi", "logit_bias": bias, "logprobs": 2}, timeout=60
    ).json()["choices"][0]
    assert completion["text"] == "" and completion["logprobs"]["tokens"] == [eos_text]
    assert "" not in completion["logprobs"]["top_logprobs"][0] and eos_text in completion["logprobs"]["top_logprobs"][0]
