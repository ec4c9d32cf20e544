"""``POST /tokenize``, ``POST /detokenize``, ``GET /v1/models`` and ``/v1/models/{id}`` on
the tiny model's server (the session's). In-process: tests/api/test_utility_endpoints.py."""

from __future__ import annotations

import httpx


def test_on_the_tiny_model_server(tiny_server, tokenizer):
    url = tiny_server.base_url
    card = httpx.get(f"{url}/v1/models").json()["data"][0]
    assert card["max_model_len"] == 2048
    r = httpx.post(f"{url}/tokenize", json={"prompt": "Once upon a time"}).json()
    assert r == {
        "tokens": tokenizer.encode("Once upon a time", add_special_tokens=False),
        "count": r["count"],
        "max_model_len": 2048,
    }
    assert httpx.post(f"{url}/detokenize", json={"tokens": r["tokens"]}).json()["prompt"] == "Once upon a time"
