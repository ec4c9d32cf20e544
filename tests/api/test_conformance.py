"""Incompatibilities other engines' own API test kits found (issue 44): SGLang's clients'
``logprob_start_len: 0`` beside ``return_logprob: false``, vLLM's and SGLang's ``root`` on
model cards, and the echo of a token-id prompt with its special tokens."""

from __future__ import annotations

import pytest

from tests.support.fake_app import IM_END, client_for


def test_logprob_start_len_0_without_return_logprob_asks_for_nothing(builder):
    client, manager = client_for(builder)
    r = client.post("/generate", json={"text": "Hi", "return_logprob": False, "logprob_start_len": 0})
    assert r.status_code == 200, r.text
    assert manager.sent[0].sampling.logprob_start_len == -1 and manager.sent[0].sampling.top_logprobs == -1


@pytest.mark.parametrize("field,value", [("logprob_start_len", 3), ("top_logprobs_num", 2)])
def test_logprob_fields_that_ask_for_something_still_need_return_logprob(builder, field, value):
    client, _ = client_for(builder)
    r = client.post("/generate", json={"text": "Hi", field: value})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == f"{field} needs return_logprob: true"


def test_model_cards_name_their_root(builder):
    """``root``: the model the name serves (vLLM's and SGLang's field; clients read
    ``client.models.retrieve(id).root``); the test builder serves it as "m"."""
    client, _ = client_for(builder)
    listed = client.get("/v1/models").json()["data"][0]
    assert (listed["root"], listed["parent"]) == (builder.served_names[-1], None)
    assert client.get("/v1/models/m").json()["root"] == builder.served_names[-1]


def test_echo_of_a_token_id_prompt_keeps_its_special_tokens(builder):
    """The echo equals the prompt's whole decode: its special tokens were dropped
    (skip_special_tokens, which is about the output, was applied to the prompt)."""
    client, _ = client_for(builder)
    prompt = [IM_END, 5, 6]
    body = client.post("/v1/completions", json={"prompt": prompt, "echo": True, "max_tokens": 2}).json()
    text = body["choices"][0]["text"]
    whole = builder.tok.decode(prompt, skip_special_tokens=False)
    assert "<|im_end|>" in whole and text.startswith(whole)
