"""Incompatibilities other engines' own API test kits found (issue 44): SGLang's clients'
``logprob_start_len: 0`` beside ``return_logprob: false``, vLLM's and SGLang's ``root`` on
model cards, and the echo of a token-id prompt with its special tokens."""

from __future__ import annotations

import json

import pytest
from structlog.testing import capture_logs

from tests.support.fake_app import IM_END, client_for
from tokenizer_proc.request.unsupported import EXTRAS, UNSUPPORTED
from tokenizer_proc.web.ignored_fields import HEADER, MAX_HEADER_BYTES, MAX_NAME, header_value


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


SALTED_BODIES = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    "/v1/completions": {"prompt": "Hi", "max_tokens": 2},
    "/v1/responses": {"input": "Hi", "max_output_tokens": 2},
    "/v1/messages": {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
    "/generate": {"text": "Hi", "sampling_params": {"max_new_tokens": 2}},
}
"""A body of each route that generates; each takes ``cache_salt`` (vLLM's on its OpenAI
routes, taken on the Anthropic and native ones too, so every tenant of one server can be
isolated whatever API it speaks)."""


@pytest.mark.parametrize("route", sorted(SALTED_BODIES))
def test_cache_salt_reaches_the_scheduler_on_every_route(builder, route):
    client, manager = client_for(builder)
    r = client.post(route, json={**SALTED_BODIES[route], "cache_salt": "tenant-a"})
    assert r.status_code == 200, r.text
    r = client.post(route, json=SALTED_BODIES[route])
    assert r.status_code == 200, r.text
    assert [m.cache_salt for m in manager.sent] == ["tenant-a", ""]


@pytest.mark.parametrize("route", sorted(SALTED_BODIES))
@pytest.mark.parametrize("salt", ["", 7, ["a"]])
def test_a_cache_salt_that_is_not_a_non_empty_string_is_a_400_naming_it(builder, route, salt):
    client, manager = client_for(builder)
    r = client.post(route, json={**SALTED_BODIES[route], "cache_salt": salt})
    assert r.status_code == 400, r.text
    assert "cache_salt" in r.text and not manager.sent


def test_n_choices_share_their_salt(builder):
    client, manager = client_for(builder)
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "n": 3, "cache_salt": "s"}
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert [m.cache_salt for m in manager.sent] == ["s"] * 3


REFUSED_VALUES = {
    "min_characters": 10,
    "repetition_detection": {"max_pattern_size": 8},
    "vllm_xargs": {"k": 1},
    "samplers": ["top_k", "temperature"],
    "t_max_predict_ms": 500,
    "kv_transfer_params": {"do_remote_decode": True},
    "return_progress": True,
    "timings_per_token": True,
}
"""A value of each field of `unsupported.EXTRAS` that asks for its effect."""


def test_the_refusal_table_is_the_one_tested():
    assert set(REFUSED_VALUES) == set(EXTRAS)


@pytest.mark.parametrize("route", sorted(SALTED_BODIES))
@pytest.mark.parametrize("field", sorted(REFUSED_VALUES))
def test_fields_whose_effect_is_not_built_are_a_400_naming_them_on_every_route(builder, route, field):
    client, manager = client_for(builder)
    r = client.post(route, json={**SALTED_BODIES[route], field: REFUSED_VALUES[field]})
    assert r.status_code == 400, r.text
    assert field in json.dumps(r.json()) and not manager.sent
    if route != "/v1/messages":  # Anthropic's error has no param; its message names the field
        assert r.json()["error"]["param"] == field
        assert r.json()["error"]["message"].startswith(f"{field} {UNSUPPORTED}: ")


@pytest.mark.parametrize("route", sorted(set(SALTED_BODIES) - {"/v1/messages"}))
@pytest.mark.parametrize("field", sorted(REFUSED_VALUES))
def test_the_values_that_ask_for_nothing_are_accepted_silently(builder, route, field):
    client, manager = client_for(builder)
    for value in (None, *EXTRAS[field].accepts):
        r = client.post(route, json={**SALTED_BODIES[route], field: value})
        assert r.status_code == 200, (value, r.text)
        assert HEADER not in r.headers  # known: not an ignored field


@pytest.mark.parametrize("route", sorted(set(SALTED_BODIES) - {"/v1/messages"}))
@pytest.mark.parametrize("stream", [False, True])
def test_unknown_top_level_fields_are_ignored_with_a_warning_and_a_header(builder, route, stream):
    client, manager = client_for(builder)
    body = {**SALTED_BODIES[route], "x_vendor_hint": 1, "my,odd\nname": True, "stream": stream}
    with capture_logs() as logs:
        r = client.post(route, json=body)
    assert r.status_code == 200, r.text
    assert json.loads(r.headers[HEADER]) == ["x_vendor_hint", "my,odd\nname"]
    warned = [e for e in logs if e["log_level"] == "warning" and "ignored" in e["event"]]
    assert len(warned) == 1
    assert warned[0]["fields"] == ["x_vendor_hint", "my,odd\nname"] and warned[0]["path"] == route
    assert len(manager.sent) == 1  # the request ran as without them
    plain = client.post(route, json={**SALTED_BODIES[route], "stream": stream})
    assert plain.status_code == 200 and HEADER not in plain.headers


def test_the_anthropic_route_refuses_unknown_fields_instead(builder):
    client, manager = client_for(builder)
    r = client.post("/v1/messages", json={**SALTED_BODIES["/v1/messages"], "x_vendor_hint": 1})
    assert r.status_code == 400 and "x_vendor_hint" in r.text and not manager.sent


def test_the_ignored_fields_header_stays_small_whatever_the_names():
    """32 names of 64 emoji each escape to 24 KB of JSON, past what Node's fetch (16 KB) and
    nginx's default buffers take: the header keeps the names that fit in 2 KB."""
    names = [f"{i:02d}" + "\U0001f600" * 100 for i in range(40)]
    value = header_value([n[:MAX_NAME] for n in names])
    assert len(value) <= MAX_HEADER_BYTES and value.isascii()
    kept = json.loads(value)
    assert 0 < len(kept) < 32 and kept == [n[:MAX_NAME] for n in names[: len(kept)]]


def test_an_empty_unknown_key_on_the_anthropic_route_is_named_plainly(builder):
    client, _ = client_for(builder)
    r = client.post("/v1/messages", json={**SALTED_BODIES["/v1/messages"], "": 1})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("unknown key '' in the body")


@pytest.mark.parametrize("field", ["min_characters", "t_max_predict_ms"])
def test_a_zero_written_as_a_float_asks_for_nothing_too(builder, field):
    client, _ = client_for(builder)
    assert client.post("/v1/completions", json={**SALTED_BODIES["/v1/completions"], field: 0.0}).status_code == 200
