"""``POST /tokenize``, ``POST /detokenize``, ``GET /v1/models`` and ``/v1/models/{id}``
in-process (the tokenizer and the chat path's rendering). On the tiny model's server:
tests/e2e/test_utility_endpoints.py."""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.support.fake_app import AGENT_PARSERS, CONTEXT, app_client, deltas
from tokenizer_proc.link.tokenizer_manager import Delta


@pytest.fixture(scope="module")
def fake(tokenizer):
    return app_client(tokenizer, deltas(Delta("x", 1)))


def test_tokenize_prompt_matches_completions(fake, tokenizer):
    client, manager = fake
    r = client.post("/tokenize", json={"prompt": "Hello world", "return_token_strs": True}).json()
    client.post("/v1/completions", json={"prompt": "Hello world", "max_tokens": 1})
    assert r["tokens"] == list(manager.sent[-1].input_ids) == tokenizer.encode("Hello world", add_special_tokens=False)
    assert r["count"] == len(r["tokens"]) and r["max_model_len"] == CONTEXT
    assert r["token_strs"] == tokenizer.convert_ids_to_tokens(r["tokens"])


def test_tokenize_messages_matches_chat(fake):
    client, manager = fake
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    r = client.post("/tokenize", json={"messages": messages}).json()
    client.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
    assert r["tokens"] == list(manager.sent[-1].input_ids) and r["count"] == len(r["tokens"])
    without = client.post("/tokenize", json={"messages": messages, "add_generation_prompt": False}).json()
    assert without["count"] < r["count"] and r["tokens"][: without["count"]] == without["tokens"]


def test_tokenize_messages_takes_the_chat_fields_that_change_the_prompt(tokenizer):
    """vLLM's /tokenize takes ``tools``, ``chat_template_kwargs`` and
    ``continue_final_message`` beside ``messages``, so a client can count the prompt a chat
    request with tools (described in the prompt) or a prefill renders; they were 400s
    (unknown keys), and no count matched such a request."""
    client, manager = app_client(tokenizer, deltas(Delta("x", 1)), {"tool_parser": AGENT_PARSERS["tool_parser"]})
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    prefill = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    for extra in (
        {"tools": tools},
        {"continue_final_message": True, "add_generation_prompt": False},
        {"chat_template_kwargs": {"enable_thinking": False}},
    ):
        r = client.post("/tokenize", json={"messages": prefill, **extra})
        assert r.status_code == 200, r.text
        chat = client.post("/v1/chat/completions", json={"messages": prefill, "max_tokens": 1, **extra})
        assert chat.status_code == 200, chat.text
        assert r.json()["tokens"] == list(manager.sent[-1].input_ids), extra
    plain = client.post("/tokenize", json={"messages": prefill}).json()
    assert client.post("/tokenize", json={"messages": prefill, "tools": tools}).json()["count"] > plain["count"]
    r = client.post("/tokenize", json={"messages": prefill, "tools": [{"type": "function", "function": {}}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools.0.function.name"


def test_detokenize_round_trip(fake, tokenizer):
    client, _ = fake
    ids = tokenizer.encode("Hello <|im_end|> world", add_special_tokens=False)
    r = client.post("/detokenize", json={"tokens": ids}).json()
    assert r == {"prompt": "Hello <|im_end|> world", "text": "Hello <|im_end|> world"}
    assert (
        "<|im_end|>" not in client.post("/detokenize", json={"tokens": ids, "skip_special_tokens": True}).json()["text"]
    )


def test_tokenize_and_detokenize_run_off_the_event_loop(fake, tokenizer, monkeypatch):
    """Decoding a long list of ids (a million take about 1 s) or spelling out a long prompt's
    tokens ran on the HTTP process's event loop, which stalled every stream it served meanwhile
    (a 1.7 s gap in a concurrent stream); each now runs in a thread, where no loop runs."""
    import asyncio

    def loop_running() -> bool:
        try:
            asyncio.get_running_loop()
            return True
        except RuntimeError:
            return False

    seen = []
    for name in ("decode", "convert_ids_to_tokens"):
        real = getattr(tokenizer, name)
        monkeypatch.setattr(
            tokenizer,
            name,
            lambda *a, _real=real, _name=name, **k: seen.append((_name, loop_running())) or _real(*a, **k),
        )
    client, _ = fake
    assert client.post("/detokenize", json={"tokens": [1, 2, 3]}).status_code == 200
    assert client.post("/tokenize", json={"prompt": "Hi there", "return_token_strs": True}).status_code == 200
    assert seen == [("decode", False), ("convert_ids_to_tokens", False)]


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/tokenize", {}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, "prompt"),
        ("/tokenize", {"text": "a"}, "text"),
        ("/tokenize", {"prompt": "a", "model": "other"}, "model"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
        ("/detokenize", {"tokens": [-1]}, "tokens.0"),
    ],
)
def test_errors_name_the_field(fake, path, body, param):
    r = fake[0].post(path, json=body)
    assert r.status_code in (400, 404) and r.json()["error"]["param"] == param


def test_models_list_and_retrieve_parse_in_both_sdks(fake):
    client, _ = fake
    oai = openai.OpenAI(base_url="http://testserver/v1", api_key="k", http_client=client, max_retries=0)
    ant = anthropic.Anthropic(base_url="http://testserver", api_key="k", http_client=client, max_retries=0)
    assert [(m.id, m.object, m.owned_by) for m in oai.models.list()] == [("m", "model", "lazyserve")]
    assert oai.models.retrieve("m").model_dump(exclude_unset=True) == oai.models.list().data[0].model_dump(
        exclude_unset=True
    )
    listed = list(ant.models.list())  # Anthropic's ModelInfo: type, display_name, created_at required
    assert [(m.id, m.type, m.display_name, m.lifecycle, m.max_input_tokens) for m in listed] == [
        ("m", "model", "m", "active", CONTEXT)
    ]
    got = ant.models.retrieve("m")
    assert got.created_at == listed[0].created_at and got.created_at.timestamp() == oai.models.retrieve("m").created
    with pytest.raises(openai.NotFoundError) as e:
        oai.models.retrieve("org/other")
    assert e.value.body["message"] == (
        "The model `org/other` does not exist. This server serves `m`: send that "
        "name as `model` (GET /v1/models lists it)"
    )
    with pytest.raises(anthropic.NotFoundError) as a:  # Anthropic's client gets Anthropic's error shape
        ant.models.retrieve("org/other")
    assert a.value.body["type"] == "error" and a.value.body["error"]["type"] == "not_found_error"
    assert a.value.body["error"]["message"] == e.value.body["message"]
