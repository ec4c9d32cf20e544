"""The error contract's ``param``: the field at fault named as the client wrote it, on every
route (OpenAI chat and completions, native, Anthropic, Responses), for pydantic's own errors.
The app runs in-process against a fake manager (`tests.fake_app`)."""

from __future__ import annotations

import pytest

from tests.fake_app import HELLO, app_client
from tokenizer_proc.errors import client_path

HI = [{"role": "user", "content": "Hi"}]
CHAT = {"messages": HI, "max_tokens": 8}
MESSAGES = {"model": "m", "max_tokens": 8, "messages": HI}


def _exists(body: object, param: str, missing: bool) -> bool:
    """Whether `param` is a path through `body` (its last key may be absent when `missing`)."""
    node = body
    parts = param.split(".")
    for i, part in enumerate(parts):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return missing and i == len(parts) - 1 and isinstance(node, dict)
    return True


# Each body has its error inside a union: pydantic's loc names the union member it tried
# (``str``, ``list[str]``, ``dict``, a tagged union's tag such as ``tool_result`` or ``text``,
# ``list[tagged-union[...]]``), which is not part of the body.
UNION_ERRORS = [
    ("/v1/chat/completions", {**CHAT, "stop": 5}, "stop"),
    ("/v1/chat/completions", {**CHAT, "stop": [5]}, "stop"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": {"type": "function"}}, "tool_choice.function"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": {"type": "function", "function": {}}},
     "tool_choice.function.name"),
    ("/v1/completions", {"prompt": [[1, "a"]]}, "prompt"),
    ("/v1/completions", {"prompt": "x", "stop": {"a": 1}}, "stop"),
    ("/generate", {"text": "x", "sampling_params": {"stop": 5}}, "sampling_params.stop"),
    ("/v1/messages", {**MESSAGES, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}]}]},
     "messages.0.content.0.content.0.type"),
    ("/v1/messages", {**MESSAGES, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": 5}]}]}]},
     "messages.0.content.0.content.0.text"),
    # the tag "text" is also the block's field "text": the error's own input tells them apart
    ("/v1/messages", {**MESSAGES, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
     "messages.0.content.0.text"),
    ("/v1/messages", {**MESSAGES, "messages": [{"role": "user", "content": [
        {"type": "text", "text": {"text": "a"}}]}]}, "messages.0.content.0.text"),
    ("/v1/messages", {**MESSAGES, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages.0.content.0.text"),
    ("/v1/messages", {**MESSAGES, "system": [{"type": "text", "text": 5}]}, "system.0.text"),
    ("/v1/responses", {"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": 5}]}]},
     "input.0.content.0.text"),
    ("/v1/responses", {"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
     "input.0.content.0.text"),
    ("/v1/responses", {"input": [{"type": "function_call_output", "call_id": "c", "output": 5}]}, "input.0.output"),
    ("/v1/responses", {"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}, "input.0.arguments"),
]


@pytest.mark.parametrize(("path", "body", "param"), UNION_ERRORS)
def test_union_errors_name_the_field_as_the_client_wrote_it(tokenizer, path, body, param):
    client, manager = app_client(tokenizer, HELLO)
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"].startswith(f"{param}: "), error
    assert _exists(body, param, missing="Field required" in error["message"])
    assert manager.sent == []


def _error(loc: tuple, type_: str, input_: object) -> dict:
    return {"loc": loc, "type": type_, "input": input_, "msg": "x"}


def test_client_path_keeps_keys_and_indexes_and_drops_labels():
    body = {"a": [{"type": "text", "text": {"text": 5}}], "str": {"x": 1}}
    inner = body["a"][0]["text"]
    # a label that is also a key: the walk that ends at the error's input wins, either way round
    assert client_path(_error(("body", "a", "list[tagged-union[X,Y]]", 0, "text", "text"), "dict_type", inner),
                       body) == ["a", "0", "text"]
    assert client_path(_error(("a", 0, "text", "text", "text"), "string_type", 5), body) == ["a", "0", "text", "text"]
    # a missing field ends at the object that lacks it
    assert client_path(_error(("a", 0, "text", "x", "missing_key"), "missing", inner), body) == \
        ["a", "0", "text", "missing_key"]
    # a key named like a union member's label ("str") is kept when the walk ends at the input
    assert client_path(_error(("str", "dict[str,int]", "x"), "int_type", 1), body) == ["str", "x"]
    assert client_path(_error(("str", "function-after[f(), str]"), "string_type", body["str"]), body) == ["str"]
    # an index the body does not have: nothing to walk, the loc as it is
    assert client_path(_error(("a", 3, "b"), "string_type", 1), body) == ["a", "3", "b"]
