"""The API key and the error-shape check of the security tests (in-process app and launched server)."""

from __future__ import annotations

import httpx

KEY = "sk-test-9f8e7d6c5b4a"


COMPLETION = {"prompt": "Hi", "max_tokens": 4, "temperature": 0}


def assert_error(r: httpx.Response, status: int, type_: str, needle: str) -> dict:
    """`r` is `status` with the error body shape, of `type_`, whose message contains `needle`."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == type_ and err["code"] == status and needle in err["message"], err
    return err
