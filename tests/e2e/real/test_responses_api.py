"""The OpenAI Responses API on the default model's server (the session's): a function call
through the `openai` SDK. In-process and on the tiny model: tests/api/, tests/e2e/ (same name)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai


def items(output) -> list[tuple]:
    return [(i.type, getattr(i, "name", None), getattr(i, "arguments", None), i.status) for i in output]


# ---------------------------------------------------------------- end to end (default model)
def test_sdk_function_call_on_the_default_model(real_server):
    """``tool_choice: required`` is enforced by a grammar: SmolLM2-135M returns a
    schema-valid call, the same streamed and not."""
    url = real_server.base_url
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    c = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"],
    }
    tool = {
        "type": "function",
        "name": "get_weather",
        "description": "Current weather in a city",
        "strict": True,
        "parameters": schema,
    }
    base = dict(
        model=model,
        input="What is the weather in Paris?",
        tools=[tool],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=60,
        temperature=0,
    )
    r = c.responses.create(**base)
    calls = [i for i in r.output if i.type == "function_call"]
    assert r.status == "completed" and len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), schema)
    events = list(c.responses.create(**base, stream=True))
    assert events[-1].type == "response.completed"
    assert items(events[-1].response.output) == items(r.output)
