"""Security defaults and limits (issue 14): the API key, the request body limit, the stop
string limits and the waiting-queue limit. The app runs in-process (TestClient, a fake
manager) for each rule's cases. One server on the tiny random-weight model, started as a user
would with the key in ``LAZYSERVE_API_KEY``, checks them over real HTTP:
tests/e2e/test_security.py."""

from __future__ import annotations

import asyncio
import gzip
import json

import pytest
from fastapi.testclient import TestClient

from launcher.args import parse_args
from protocol.config import MAX_REQUEST_BODY_BYTES
from tests.support.fake_app import FakeManager, two_steps
from tests.support.security import COMPLETION, KEY, assert_error
from text.hf_tokenizer import ModelFacts
from tokenizer_proc.app import create_app
from tokenizer_proc.errors import APIError
from tokenizer_proc.link.tokenizer_manager import RETRY_AFTER_S, TokenizerManager
from tokenizer_proc.request.builder import RequestBuilder
from tokenizer_proc.request.fields import MAX_STOP_CHARS, MAX_STOP_STRINGS


@pytest.fixture(scope="module")
def builder():
    from protocol.model_source import resolve_model
    from text.hf_tokenizer import load_tokenizer

    return RequestBuilder(load_tokenizer(resolve_model(None)), ModelFacts(8192, (2,), 49152), ("m",))


def app_client(builder, **kwargs) -> TestClient:
    return TestClient(create_app(FakeManager(two_steps), builder, "m", **kwargs))


# ---------------------------------------------------------------- API key
def test_api_key_required_on_every_route_but_health(builder):
    c = app_client(builder, api_key=KEY)
    assert c.get("/health").json() == {"status": "ok"}
    assert c.get("/ping").json() == c.post("/ping").json() == {"status": "ok"}  # vLLM's name for /health
    for method, path in [
        ("GET", "/metrics"),
        ("GET", "/v1/models"),
        ("POST", "/v1/completions"),
        ("POST", "/generate"),
        ("GET", "/openapi.json"),
        ("GET", "/no-such-route"),
        ("GET", "/version"),
        ("GET", "/get_model_info"),
        ("GET", "/get_server_info"),
    ]:
        r = c.request(method, path, json=COMPLETION)
        assert_error(r, 401, "authentication_error", "missing API key")
        assert r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": f"Bearer {KEY}"},
        {"authorization": f"bearer {KEY}"},
        {"x-api-key": KEY},
        {"Authorization": "Bearer wrong", "x-api-key": KEY},
    ],
)
def test_right_key_in_either_header_is_accepted(builder, headers):
    c = app_client(builder, api_key=KEY)
    r = c.post("/v1/completions", json=COMPLETION, headers=headers)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == " Hello"
    assert c.get("/metrics", headers=headers).status_code == 200


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": f"Bearer {KEY}x"},
        {"Authorization": KEY},
        {"Authorization": f"Basic {KEY}"},
        {"x-api-key": KEY[:-1]},
        {"x-api-key": ""},
    ],
)
def test_wrong_key_is_401(builder, headers):
    c = app_client(builder, api_key=KEY)
    r = c.post("/v1/completions", json=COMPLETION, headers=headers)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"]["type"] == "authentication_error"
    assert r.json()["error"]["message"] in (
        "invalid API key: send the key the server was started with (--api-key or $LAZYSERVE_API_KEY) as "
        "Authorization: Bearer KEY or x-api-key: KEY",
        "missing API key: send the header Authorization: Bearer KEY or x-api-key: KEY",
    )


PREFLIGHT = {
    "Origin": "http://ui.example",
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


def test_browsers_on_allowed_origins_may_call_the_api_and_preflights_need_no_key(builder):
    """CORS (``--allowed-origins``, vLLM's and SGLang's default ``*``): a preflight, which a
    browser sends without credentials, is answered before the key check (it was a 401, and
    without a key a 405); an allowed origin's request gets Access-Control-Allow-Origin and
    can read the request id; a request still needs the key; with no origins there is no CORS."""
    c = app_client(builder, api_key=KEY, allowed_origins=("*",))
    r = c.options("/v1/chat/completions", headers=PREFLIGHT)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*", r.text
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    r = c.post("/v1/completions", json=COMPLETION, headers={"Origin": "http://ui.example", "x-api-key": KEY})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
    assert "x-request-id" in r.headers["access-control-expose-headers"].lower()
    assert "x-ignored-fields" in r.headers["access-control-expose-headers"].lower()
    assert c.post("/v1/completions", json=COMPLETION, headers={"Origin": "http://ui.example"}).status_code == 401
    only = app_client(builder, allowed_origins=("http://ui.example",))
    assert only.options("/v1/models", headers=PREFLIGHT).status_code == 200
    refused = only.options("/v1/models", headers={**PREFLIGHT, "Origin": "http://evil.example"})
    assert_error(refused, 400, "invalid_request_error", "cross-origin request refused: its origin is not allowed")
    assert (
        "access-control-allow-origin" not in only.get("/v1/models", headers={"Origin": "http://evil.example"}).headers
    )
    off = app_client(builder)
    assert "access-control-allow-origin" not in off.options("/v1/models", headers=PREFLIGHT).headers


@pytest.mark.parametrize(
    "given, origins",
    [("*", ["*"]), ("", []), (" http://a , http://b ", ["http://a", "http://b"]), ('["http://a"]', ["http://a"])],
)
def test_allowed_origins_flag_takes_a_comma_list_or_vllms_json_list(given, origins):
    import launcher.args

    assert launcher.args.parse_origins(given) == origins
    with pytest.raises(ValueError):
        launcher.args.parse_origins('["http://a", 5]')


def test_non_ascii_key_compares_its_utf8_bytes(builder):
    c = app_client(builder, api_key="clé-ü")
    assert c.get("/v1/models", headers={"x-api-key": "clé-ü".encode()}).status_code == 200
    assert c.get("/v1/models", headers={"x-api-key": "cle-u"}).status_code == 401


def test_no_key_configured_leaves_routes_open(builder):
    assert app_client(builder).get("/v1/models").status_code == 200


def test_api_key_flag_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("LAZYSERVE_API_KEY", "from-env")
    assert parse_args([]).api_key == "from-env"
    assert parse_args(["--api-key", "from-flag"]).api_key == "from-flag"
    monkeypatch.delenv("LAZYSERVE_API_KEY")
    assert parse_args([]).api_key == ""
    assert parse_args([]).max_request_body_bytes == MAX_REQUEST_BODY_BYTES == 16 * 1024 * 1024
    assert parse_args([]).max_queued_requests is None


# ---------------------------------------------------------------- body size
def test_body_over_the_limit_is_413(builder):
    c = app_client(builder, max_body_bytes=1024)
    small = c.post("/v1/completions", json={**COMPLETION, "prompt": "x" * 900})
    assert small.status_code == 200
    r = c.post("/v1/completions", json={**COMPLETION, "prompt": "x" * 1100})
    assert_error(r, 413, "invalid_request_error", "larger than 1024 bytes")
    assert "--max-request-body-bytes" in r.json()["error"]["message"]


def test_streamed_body_without_content_length_is_413(builder):
    c = app_client(builder, max_body_bytes=1024)
    chunks = [b'{"prompt": "', b"x" * 600, b"x" * 600, b'", "max_tokens": 4}']
    r = c.post("/v1/completions", content=iter(chunks), headers={"content-type": "application/json"})
    assert_error(r, 413, "invalid_request_error", "larger than 1024 bytes")


@pytest.mark.parametrize(
    "encoding,body",
    [("gzip", gzip.compress(json.dumps(COMPLETION).encode())), ("br", json.dumps(COMPLETION).encode())],
    ids=["gzip", "br"],
)
def test_encoded_body_is_415_naming_the_encoding(builder, encoding, body):
    """A body in a Content-Encoding is not decoded: a 415 naming it, in the path's error shape.
    A gzip body was a 400 saying it is "not UTF-8"; an encoding declared over a plain body was
    ignored (200)."""
    c = app_client(builder)
    r = c.post(
        "/v1/completions", content=body, headers={"content-type": "application/json", "content-encoding": encoding}
    )
    err = assert_error(r, 415, "invalid_request_error", f"Content-Encoding: {encoding}, which this server does not")
    assert err["param"] is None
    r = c.post("/v1/messages", content=body, headers={"content-type": "application/json", "content-encoding": encoding})
    assert r.status_code == 415 and r.json()["type"] == "error" and encoding in r.json()["error"]["message"]
    plain = c.post("/v1/completions", json=COMPLETION, headers={"content-encoding": "identity"})
    assert plain.status_code == 200 and plain.json()["choices"][0]["text"] == " Hello"


# ---------------------------------------------------------------- stop strings
@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/completions", {**COMPLETION, "stop": ["s"] * (MAX_STOP_STRINGS + 1)}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "Hi"}], "stop": ["s"] * (MAX_STOP_STRINGS + 1)},
        ),
        ("/generate", {"text": "Hi", "sampling_params": {"stop": ["s"] * (MAX_STOP_STRINGS + 1)}}),
    ],
)
def test_too_many_stop_strings_is_400(builder, path, body):
    err = assert_error(
        app_client(builder).post(path, json=body),
        400,
        "invalid_request_error",
        f"at most {MAX_STOP_STRINGS} stop strings, got {MAX_STOP_STRINGS + 1}",
    )
    assert err["param"] in ("stop", "sampling_params.stop")


@pytest.mark.parametrize("stop", ["y" * (MAX_STOP_CHARS + 1), ["ok", "y" * (MAX_STOP_CHARS + 1)]])
def test_too_long_stop_string_is_400(builder, stop):
    err = assert_error(
        app_client(builder).post("/v1/completions", json={**COMPLETION, "stop": stop}),
        400,
        "invalid_request_error",
        f"has {MAX_STOP_CHARS + 1} characters, at most {MAX_STOP_CHARS}",
    )
    assert err["param"] == "stop"


def test_stop_strings_at_the_limits_are_accepted(builder):
    stop = ["y" * MAX_STOP_CHARS] + [str(i) for i in range(MAX_STOP_STRINGS - 1)]
    assert app_client(builder).post("/v1/completions", json={**COMPLETION, "stop": stop}).status_code == 200


# ---------------------------------------------------------------- waiting queue
def test_check_room_counts_choices_beyond_the_running_ones(tmp_path):
    async def run() -> None:
        mgr = TokenizerManager(str(tmp_path), log=None, max_running=2, max_queued=1)
        unlimited = TokenizerManager(str(tmp_path / "u"), log=None, max_running=2)
        try:
            for i in range(2):
                mgr.queues[f"r{i}"] = unlimited.queues[f"r{i}"] = asyncio.Queue()
            mgr.check_room(1)  # 2 running, this one waits
            with pytest.raises(APIError) as e:
                mgr.check_room(2)
            assert e.value.status == 429 and e.value.headers == {"Retry-After": str(RETRY_AFTER_S)}
            mgr.queues["r2"] = asyncio.Queue()
            with pytest.raises(APIError) as e:
                mgr.check_room(1)
            assert e.value.status == 429
            assert "1 waiting (queued requests), and 1 more would pass the limit of 1" in e.value.message
            with pytest.raises(APIError) as e:
                mgr.check_room(4)
            assert e.value.status == 400 and e.value.param == "n"
            assert e.value.message.startswith(
                "4 choices in one request (n, times the prompts of a list) can never be "
                "admitted: at most 2 run and 1 wait"
            )
            unlimited.check_room(1000)
        finally:
            mgr.close()
            unlimited.close()

    (tmp_path / "u").mkdir()
    asyncio.run(run())


def test_a_full_queue_while_shutting_down_answers_503_not_429(tmp_path):
    """A drain refuses new requests with 503 'shutting down' also when the queue is full:
    a 429 (Retry-After) told the client to retry against a server that is going away."""
    from protocol.messages import GenerateReq
    from tokenizer_proc.request.choices import check_can_start

    async def run() -> None:
        mgr = TokenizerManager(str(tmp_path), log=None, max_running=1, max_queued=0)
        try:
            mgr.queues["r0"] = asyncio.Queue()  # the one running request: no room left
            with pytest.raises(APIError) as e:
                check_can_start(mgr, [GenerateReq("r1", [1], 4)])
            assert e.value.status == 429
            mgr.stopping = True
            with pytest.raises(APIError) as e:
                check_can_start(mgr, [GenerateReq("r2", [1], 4)])
            assert (e.value.status, e.value.message) == (503, "server is shutting down")
            assert mgr.in_flight == 1  # nothing claimed
        finally:
            mgr.close()

    asyncio.run(run())
