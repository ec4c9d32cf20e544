"""``--default-max-tokens``: the output limit of a request that gives none, on every route
that lets a request leave it out, cut to the room the context leaves; a limit the request
gives wins, and without the flag each route keeps its own default."""

from __future__ import annotations

import pytest

from tests.support.fake_app import IM_END, VOCAB, client_for
from text.hf_tokenizer import ModelFacts
from tokenizer_proc.request.builder import RequestBuilder

CONTEXT = 512
DEFAULT = 7

BODIES = {  # a route's body without an output limit, and the field that sets one
    "/v1/chat/completions": ({"messages": [{"role": "user", "content": "Hi"}]}, "max_tokens"),
    "/v1/completions": ({"prompt": [5] * 10}, "max_tokens"),
    "/generate": ({"input_ids": [5] * 10}, None),
    "/v1/responses": ({"input": "Hi"}, "max_output_tokens"),
}


def builder_with(tok, default: int | None) -> RequestBuilder:
    return RequestBuilder(tok, ModelFacts(CONTEXT, (IM_END,), VOCAB), ("m",), default_max_tokens=default)


@pytest.mark.parametrize("path", list(BODIES))
def test_the_flag_is_the_limit_of_a_request_that_gives_none(tok, path):
    body, field = BODIES[path]
    client, manager = client_for(builder_with(tok, DEFAULT))
    assert client.post(path, json=body).status_code == 200
    given = {**body, field: 3} if field else {**body, "sampling_params": {"max_new_tokens": 3}}
    assert client.post(path, json=given).status_code == 200
    assert [r.max_new_tokens for r in manager.sent] == [DEFAULT, 3]


def test_the_flag_is_cut_to_the_room_the_context_leaves(tok):
    client, manager = client_for(builder_with(tok, 100))
    assert client.post("/v1/completions", json={"prompt": [5] * (CONTEXT - 5)}).status_code == 200
    assert client.post("/generate", json={"input_ids": [5] * (CONTEXT - 5)}).status_code == 200
    assert [r.max_new_tokens for r in manager.sent] == [5, 5]


def test_without_the_flag_each_route_keeps_its_default(tok):
    """Chat and Responses: the rest of the context (OpenAI's); completions: 16; native: 128."""
    client, manager = client_for(builder_with(tok, None))
    for path, (body, _) in BODIES.items():
        assert client.post(path, json=body).status_code == 200
    chat, completion, native, response = manager.sent
    assert (completion.max_new_tokens, native.max_new_tokens) == (16, 128)
    assert chat.max_new_tokens == CONTEXT - len(chat.input_ids)
    assert response.max_new_tokens == CONTEXT - len(response.input_ids)
