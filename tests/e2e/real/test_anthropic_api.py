"""The Anthropic Messages API through the official `anthropic` SDK on the default model's
server (the session's): a forced tool use. The rest: tests/api/ and tests/e2e/ (same name)."""

from __future__ import annotations

import anthropic
import httpx
import jsonschema

GREEDY = {"temperature": 0}


def without_ids(blocks) -> list[dict]:
    return [{k: v for k, v in b.model_dump(exclude_none=True).items() if k != "id"} for b in blocks]


# ---------------------------------------------------------------- end to end (default model)
CITY_UNIT = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}


def test_sdk_forced_tool_use_on_the_default_model(real_server):
    """A named tool choice is enforced by a grammar: SmolLM2-135M returns a schema-valid
    call, the same streamed and not."""
    url = real_server.base_url
    model = httpx.get(f"{url}/v1/models").json()["data"][0]["id"]
    c = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0)
    tool = {"name": "get_weather", "description": "Current weather in a city", "input_schema": CITY_UNIT}
    base = dict(
        model=model,
        max_tokens=60,
        tools=[tool],
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        extra_body=GREEDY,
    )
    msg = c.messages.create(**base)
    calls = [b for b in msg.content if b.type == "tool_use"]
    assert msg.stop_reason == "tool_use" and len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(calls[0].input, CITY_UNIT)
    with c.messages.stream(**base) as stream:
        final = stream.get_final_message()
    assert without_ids(final.content) == without_ids(msg.content) and final.stop_reason == "tool_use"
