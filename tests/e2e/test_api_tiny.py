"""Integration tests against a tiny random-weight model: the HTTP API, streaming, the error
contract (cases V1-V3, F3 of shared/acceptance/serving-cases.md) and liveness."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import re

import httpx
import openai
import pytest

from tests.support.live_sse import sse_events
from tests.support.pool_state import metrics, wait_idle


@pytest.fixture(scope="module")
def url(tiny_server):
    return tiny_server.base_url


@pytest.fixture(scope="module")
def model_name(url):
    return httpx.get(f"{url}/v1/models").json()["data"][0]["id"]


@pytest.fixture(scope="module")
def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none")


def assert_live(url: str) -> None:
    """Liveness rule: a tiny greedy request answers 200 within 10 s."""
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 4, "temperature": 0}, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 4


def test_health_and_models(url, model_name):
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    body = httpx.get(f"{url}/v1/models").json()
    assert body["object"] == "list" and body["data"][0]["id"] == model_name
    assert body["data"][0]["max_model_len"] == 2048


def test_version_model_and_server_info(url, model_name, tiny_model_dir, tiny_server):
    """vLLM's /version and /ping, SGLang's /get_model_info and /get_server_info (the settings
    as launch resolved them, those left to the worker as it resolved them (they read null),
    the API key never shown)."""
    version = httpx.get(f"{url}/version").json()["version"]
    assert version == importlib.metadata.version("lazyserve")
    assert httpx.get(f"{url}/ping").json() == {"status": "ok"}
    info = httpx.get(f"{url}/get_model_info").json()
    assert info == {
        "model_path": str(tiny_model_dir),
        "tokenizer_path": str(tiny_model_dir),
        "served_model_name": model_name,
        "is_generation": True,
        "max_model_len": 2048,
    }
    server = httpx.get(f"{url}/get_server_info").json()
    assert server["version"] == version and server["model"]["path"] == str(tiny_model_dir)
    assert server["port"] == int(url.rsplit(":", 1)[1]) and server["api_key"] == ""
    assert server["max_running_requests"] > 0
    # one model call of the CPU worker's prefills bounds the chunk (what a cancelled prompt costs the others)
    assert server["prefill_call_tokens"] == 512 and server["chunked_prefill_size"] == 512
    graph = re.search(r"decode_graph_max_bs=(\d+)", tiny_server.log())
    assert server["context_length"] == 2048 and server["max_total_tokens"] == metrics(url)["lazyserve_kv_pool_tokens"]
    assert graph is not None and server["decode_graph_max_bs"] == int(graph.group(1)) > 0


def test_completion_shape_and_usage(client, model_name, tokenizer):
    r = client.completions.create(model=model_name, prompt="Once upon a time", max_tokens=5, temperature=0)
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason in ("length", "stop")
    assert r.usage.prompt_tokens == len(tokenizer.encode("Once upon a time", add_special_tokens=False))
    assert r.usage.completion_tokens == 5 or r.choices[0].finish_reason == "stop"
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


@pytest.mark.parametrize("max_tokens", [1, 5, 20])
def test_stream_usage_matches_non_stream(client, model_name, max_tokens):
    """F3: exactly one usage chunk, after the content, with choices [] and equal to the non-streamed usage."""
    full = client.completions.create(
        model=model_name,
        prompt="Once upon a time",
        max_tokens=max_tokens,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert full.usage.completion_tokens == max_tokens
    assert full.choices[0].finish_reason == "length"
    chunks = list(
        client.completions.create(
            model=model_name,
            prompt="Once upon a time",
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    usage = [c for c in chunks if c.usage is not None]
    assert len(usage) == 1 and chunks[-1] is usage[0] and usage[0].choices == []
    assert usage[0].usage.model_dump() == full.usage.model_dump()
    assert "".join(c.choices[0].text for c in chunks if c.choices) == full.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_stream_equals_non_stream(client, model_name):
    msgs = [{"role": "user", "content": "Tell me a story about a cat."}]
    full = client.chat.completions.create(model=model_name, messages=msgs, max_tokens=40, temperature=0)
    assert full.object == "chat.completion" and full.choices[0].message.role == "assistant"
    stream = list(
        client.chat.completions.create(model=model_name, messages=msgs, max_tokens=40, temperature=0, stream=True)
    )
    assert stream[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in stream)
    assert text == full.choices[0].message.content
    assert stream[-1].choices[0].finish_reason == full.choices[0].finish_reason


def test_native_generate(url):
    body = {"text": "The sky is", "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}}
    r = httpx.post(f"{url}/generate", json=body, timeout=30)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["meta_info"]["completion_tokens"] == 6
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    with httpx.stream("POST", f"{url}/generate", json={**body, "stream": True}, timeout=30) as s:
        events = sse_events(s)
    assert events[-1] == "[DONE]"
    assert events[-2]["text"] == out["text"]


def test_seeded_sampling_is_reproducible(client, model_name):
    kw = dict(
        model=model_name,
        prompt="Random words:",
        max_tokens=12,
        temperature=1.0,
        top_p=0.9,
        extra_body={"ignore_eos": True, "top_k": 50},
    )
    a = client.completions.create(seed=1234, **kw).choices[0].text
    b = client.completions.create(seed=1234, **kw).choices[0].text
    c = client.completions.create(seed=999, **kw).choices[0].text
    assert a == b
    assert a != c


def test_max_tokens_zero_and_one(url):
    """V2: 0 gives empty text and completion_tokens 0; 1 gives exactly one token."""
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 0, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "" and r.json()["usage"]["completion_tokens"] == 0
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] == 1
    assert r.json()["choices"][0]["finish_reason"] in ("length", "stop")


async def test_max_tokens_zero_one_load(url):
    """V2: 500 requests alternating max_tokens 0 and 1 at concurrency 8, then the KV pool is
    idle (nothing running or held) within 2 s and the server is live."""
    sem = asyncio.Semaphore(8)
    async with httpx.AsyncClient(timeout=60) as c:

        async def one(i: int) -> int:
            async with sem:
                r = await c.post(f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": i % 2, "temperature": 0})
                return r.json()["usage"]["completion_tokens"] if r.status_code == 200 else -1

        counts = await asyncio.gather(*(one(i) for i in range(500)))
    assert counts == [i % 2 for i in range(500)]
    await asyncio.to_thread(wait_idle, url, 2.0)
    assert_live(url)


@pytest.mark.parametrize(
    "path,body,status,param",
    [
        ("/v1/completions", {"prompt": "Hi", "temperature": -1}, 400, "temperature"),
        ("/v1/completions", {"prompt": "Hi", "top_p": 0}, 400, "top_p"),
        ("/v1/completions", {"prompt": "Hi", "top_p": 1.5}, 400, "top_p"),
        ("/v1/completions", {"prompt": "Hi", "top_k": -5}, 400, "top_k"),
        ("/v1/completions", {"prompt": "Hi", "n": 0}, 400, "n"),
        ("/v1/completions", {"prompt": "Hi", "n": 17}, 400, "n"),
        ("/v1/completions", {"prompt": "Hi", "logprobs": 50}, 400, "logprobs"),
        ("/v1/completions", {"prompt": "Hi", "max_tokens": "ten"}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "Hi", "max_tokens": -1}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 5000}, 400, "max_tokens"),
        ("/v1/completions", {"prompt": "Hi", "model": "no-such-model"}, 404, "model"),
        ("/v1/completions", {"prompt": "Hi", "logit_bias": {"999999": 5}}, 400, "logit_bias"),
        ("/v1/completions", {"prompt": "Hi", "presence_penalty": 2.5}, 400, "presence_penalty"),
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 3, "min_tokens": 4}, 400, "min_tokens"),
        ("/v1/completions", {"prompt": ""}, 400, "prompt"),
        ("/v1/completions", {"prompt": [""]}, 400, "prompt"),
        ("/v1/completions", {"prompt": []}, 400, "prompt"),
        ("/v1/completions", {"prompt": [[]]}, 400, "prompt"),
        ("/v1/completions", {"prompt": [1, 99999999]}, 400, "prompt"),
        ("/v1/completions", {}, 400, "prompt"),
        ("/v1/chat/completions", {}, 400, "messages"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
            400,
            "top_logprobs",
        ),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "model": "nope"}, 404, "model"),
        ("/generate", {"sampling_params": {"max_new_tokens": 3}}, 400, "text"),
        ("/generate", {"text": "Hi", "sampling_params": {"temperature": -2}}, 400, "sampling_params.temperature"),
        ("/generate", {"text": "Hi", "sampling_params": {"max_tokens": 3}}, 400, "sampling_params.max_tokens"),
    ],
)
def test_error_contract(url, path, body, status, param):
    """V1/V3: each bad input gets its status and a JSON error naming the parameter; the server stays live."""
    r = httpx.post(f"{url}{path}", json=body, timeout=10)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["message"] and err["type"]
    assert err["param"] == param
    assert_live(url)


def test_malformed_json_body(url):
    r = httpx.post(f"{url}/v1/completions", content=b"{", headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert "JSON" in r.json()["error"]["message"]


def test_non_finite_numbers_are_refused(url):
    """Python's JSON reader takes Infinity and NaN; a sampling parameter must be finite."""
    for path, body in (
        ("/v1/completions", '{"prompt": "Hi", "temperature": Infinity}'),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "Hi"}], "top_p": NaN}'),
        ("/generate", '{"text": "Hi", "sampling_params": {"temperature": -Infinity}}'),
    ):
        r = httpx.post(f"{url}{path}", content=body.encode(), headers={"content-type": "application/json"})
        assert r.status_code == 400 and "finite" in r.json()["error"]["message"], (path, r.text)


def test_body_without_json_content_type_names_the_header(url):
    """curl -d without -H 'content-type: application/json' sends a form body: the 400 says
    what to send instead of a pydantic message about dictionaries."""
    for path in ("/v1/completions", "/v1/chat/completions", "/generate"):
        r = httpx.post(
            f"{url}{path}", content=b'{"prompt": "Hi"}', headers={"content-type": "application/x-www-form-urlencoded"}
        )
        assert r.status_code == 400
        msg = r.json()["error"]["message"]
        assert "Content-Type: application/json" in msg and "application/x-www-form-urlencoded" in msg, msg


def test_benign_inputs_succeed(url, model_name):
    """V3 benign: empty logit_bias, temperature 1e-5 (same as greedy), top_k -1, an unknown field."""
    base = {"prompt": "The weather today", "max_tokens": 8, "model": model_name, "ignore_eos": True}
    greedy = httpx.post(f"{url}/v1/completions", json={**base, "temperature": 0}).json()["choices"][0]["text"]
    for extra in ({"logit_bias": {}}, {"top_k": -1}, {"some_vendor_field": 1}):
        r = httpx.post(f"{url}/v1/completions", json={**base, "temperature": 0, **extra})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == greedy
    r = httpx.post(f"{url}/v1/completions", json={**base, "temperature": 1e-5})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == greedy


def test_empty_user_message_succeeds(url):
    r = httpx.post(f"{url}/v1/chat/completions", json={"messages": [{"role": "user", "content": ""}], "max_tokens": 3})
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens"] > 0


def test_logit_bias_forces_token(url, tokenizer):
    """F1 (partial): +100 on one token makes greedy pick it every step."""
    tok = tokenizer.encode(" banana", add_special_tokens=False)
    assert len(tok) == 1
    r = httpx.post(
        f"{url}/v1/completions",
        json={"prompt": "Name a fruit.", "max_tokens": 3, "temperature": 0, "logit_bias": {str(tok[0]): 100}},
    )
    assert r.json()["choices"][0]["text"] == " banana banana banana"


def test_stop_token_ids_end_the_text(url, tokenizer):
    base = {"prompt": "Count: one two three", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    ref = httpx.post(f"{url}/v1/completions", json={**base, "return_ids": True}).json()
    ids = tokenizer.encode(ref["choices"][0]["text"], add_special_tokens=False)
    stop_id = ids[3]
    r = httpx.post(f"{url}/v1/completions", json={**base, "stop_token_ids": [stop_id]}).json()
    assert r["choices"][0]["finish_reason"] == "stop"
    assert r["choices"][0]["stop_reason"] == stop_id
    assert ref["choices"][0]["text"].startswith(r["choices"][0]["text"])
    assert r["usage"]["completion_tokens"] <= 4


def test_min_tokens_holds_stop_strings_back_too(url):
    """With min_tokens m, a stop string ends the text only where it ends after the first m
    tokens' text (it may begin inside it, as in vLLM), streamed or not (the first token's own
    text stopped it at 1 token once)."""
    base = {"prompt": "The cat sat on", "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    ref = httpx.post(f"{url}/v1/completions", json={**base, "logprobs": 0}).json()["choices"][0]
    text, tokens = ref["text"], ref["logprobs"]["tokens"]
    stop = tokens[0].strip()[:3]
    assert stop and text.find(stop) < len(tokens[0])  # without min_tokens it stops in the first token
    for m in (3, 6):
        after = text.find(stop, max(0, len("".join(tokens[:m])) - len(stop) + 1))
        want = text if after < 0 else text[:after]
        body = {**base, "stop": [stop], "min_tokens": m}
        full = httpx.post(f"{url}/v1/completions", json=body).json()
        events = sse_events(httpx.post(f"{url}/v1/completions", json={**body, "stream": True}, timeout=60))
        streamed = "".join(e["choices"][0]["text"] for e in events if isinstance(e, dict) and e["choices"])
        assert (full["choices"][0]["text"], streamed) == (want, want), m
        assert full["usage"]["completion_tokens"] >= m


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/completions", {"prompt": "Hi", "seed": 2**70}),
        ("/v1/completions", {"prompt": "Hi", "seed": -(2**70)}),
        ("/v1/completions", {"prompt": "Hi", "top_k": 2**70}),
        ("/v1/completions", {"prompt": "Hi", "stream": "yes"}),
        ("/generate", {"text": "Hi", "sampling_params": {"seed": 2**70}}),
    ],
)
def test_out_of_range_and_lax_values_are_400(url, path, body):
    r = httpx.post(f"{url}{path}", json=body, timeout=10)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"]


@pytest.mark.parametrize(
    "path,raw",
    [
        ("/v1/completions", '{"prompt": "Hi \\ud800 there", "max_tokens": 2}'),
        ("/v1/completions", '{"prompt": "Hi", "stop": ["\\udc00"], "max_tokens": 2}'),
        ("/v1/completions", '{"prompt": "Hi", "model": "\\ud800"}'),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\ud83d"}]}'),
        ("/generate", '{"text": "Hi", "rid": "\\ud800"}'),
    ],
)
def test_unpaired_surrogates_are_400(url, path, raw):
    r = httpx.post(f"{url}{path}", content=raw.encode(), headers={"content-type": "application/json"}, timeout=10)
    assert r.status_code == 400, r.text
    assert "surrogate" in r.json()["error"]["message"]
    assert_live(url)


def test_tiny_temperature_and_top_p_act_greedy(url):
    base = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}}
    greedy = httpx.post(
        f"{url}/generate", json={**base, "sampling_params": {**base["sampling_params"], "temperature": 0}}
    )
    for extra in ({"temperature": 1e-50}, {"temperature": 1.0, "top_p": 1e-300, "seed": 3}):
        r = httpx.post(f"{url}/generate", json={**base, "sampling_params": {**base["sampling_params"], **extra}})
        assert r.status_code == 200 and r.json()["text"] == greedy.json()["text"], extra


async def test_duplicate_rid_leaves_the_first_request_alone(url):
    body = {
        "text": "Count: 1 2 3",
        "rid": "dup-rid",
        "sampling_params": {"max_new_tokens": 400, "temperature": 0, "ignore_eos": True},
    }
    async with httpx.AsyncClient(timeout=60) as c:
        async with c.stream("POST", f"{url}/generate", json={**body, "stream": True}) as first:
            lines = first.aiter_lines()
            while not (await lines.__anext__()).startswith("data: {"):
                pass
            second = await c.post(f"{url}/generate", json=body)
            assert second.status_code == 400 and "already in use" in second.json()["error"]["message"]
            streamed = await c.post(f"{url}/generate", json={**body, "stream": True})  # refused before the 200
            assert streamed.status_code == 400 and "already in use" in streamed.json()["error"]["message"]
            events = [json.loads(x[6:]) for x in [line async for line in lines] if x.startswith("data: {")]
    assert events[-1]["meta_info"]["completion_tokens"] == 400


async def test_duplicate_rids_sent_together_are_refused_before_the_200(url):
    """Streams sent at the same moment with one rid: one runs, the others get the 400 status
    (the id is claimed by the check that accepts a request, not when its stream starts;
    before, all three got a 200 and two of them an error event)."""
    body = {
        "text": "Count: 1 2 3",
        "rid": "same-time",
        "stream": True,
        # long enough that the first stream still runs when the others arrive on a loaded machine
        "sampling_params": {"max_new_tokens": 300, "temperature": 0, "ignore_eos": True},
    }

    async def one(c: httpx.AsyncClient) -> tuple[int, str]:
        async with c.stream("POST", f"{url}/generate", json=body) as r:
            return r.status_code, (await r.aread()).decode()

    async with httpx.AsyncClient(timeout=60) as c:
        for _ in range(3):
            got = sorted(await asyncio.gather(*[one(c) for _ in range(3)]))
            assert [s for s, _ in got] == [200, 400, 400], got
            assert all("already in use" in json.loads(t)["error"]["message"] for _, t in got[1:]), got
            events = [json.loads(x[6:]) for x in got[0][1].splitlines() if x.startswith("data: {")]
            assert events[-1]["meta_info"]["completion_tokens"] == 300 and events[-1]["meta_info"]["id"] == "same-time"
    assert_live(url)


async def test_rid_reused_once_its_request_ended_gets_only_its_own_output(url):
    """A client may reuse its rid once the request ended, even at once after leaving a stream
    whose last text is still on its way: the new request gets its own text (the old run's
    text reached it once: a 500 "part of the output was lost" in about 2 of 5 tries), and
    meta_info.id is the client's id; n > 1 choices reuse ``{rid}-{i}`` alike."""
    ref_body = {"text": "Ref prompt", "sampling_params": {"max_new_tokens": 8, "temperature": 0, "n": 2}}
    async with httpx.AsyncClient(timeout=60) as c:
        ref = (await c.post(f"{url}/generate", json=ref_body)).json()
        for i in range(15):
            long = {
                "text": f"Other {i}",
                "rid": "reused",
                "stream": True,
                "sampling_params": {"max_new_tokens": 500, "ignore_eos": True, "n": 1 + i % 2},
            }
            async with c.stream("POST", f"{url}/generate", json=long) as r:
                lines = r.aiter_lines()
                while not (await lines.__anext__()).startswith("data: {"):
                    pass
            r = await c.post(f"{url}/generate", json={**ref_body, "rid": "reused"})
            assert r.status_code == 200, (i, r.text)
            assert [b["text"] for b in r.json()] == [b["text"] for b in ref], i
            assert [b["meta_info"]["id"] for b in r.json()] == ["reused", "reused-1"]
    assert_live(url)


async def test_huge_prompt_does_not_stall_other_requests(url):
    """Tokenizing a multi-megabyte text (``/tokenize`` takes it whole) runs off the event loop:
    a small request still answers meanwhile. The same text as a completions prompt is refused
    from its head, past the context (it was tokenized whole first)."""
    text = "hello world " * 300_000
    async with httpx.AsyncClient(timeout=120) as c:
        big = asyncio.create_task(c.post(f"{url}/tokenize", json={"prompt": text}))
        await asyncio.sleep(0.3)
        small = await c.post(f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "temperature": 0})
        assert small.status_code == 200
        assert not big.done(), "the big text should still be tokenizing"
        r = await big
        assert r.status_code == 200 and r.json()["count"] > 300_000
        refused = await c.post(f"{url}/v1/completions", json={"prompt": text, "max_tokens": 4})
    assert refused.status_code == 400, refused.text[:300]
    assert (
        "longer than the context length of 2048 tokens: its first 65536 characters alone"
        in refused.json()["error"]["message"]
    )


async def test_large_body_is_parsed_while_streams_flow(url):
    """A multi-megabyte JSON body (4 MiB of token ids, refused for its last field only after
    every id was validated) is decoded and validated off the event loop: a stream running
    meanwhile keeps getting chunks, its largest gap a fraction of the time the body took.
    Parsed on the loop, the stream stood still for all of it (the gap was the whole time)."""
    ids = [1] * ((4 << 20) // 3)
    big = json.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": -1}}).encode()
    body = {"text": "Count:", "stream": True, "sampling_params": {"max_new_tokens": 1900, "ignore_eos": True}}
    stamps: list[float] = []
    loop = asyncio.get_running_loop()
    async with httpx.AsyncClient(timeout=60) as c, c.stream("POST", f"{url}/generate", json=body) as s:

        async def read() -> None:
            async for line in s.aiter_lines():
                if line.startswith("data: {"):
                    stamps.append(loop.time())

        reader = asyncio.create_task(read())
        while len(stamps) < 10:  # the stream is flowing
            assert not reader.done(), "the stream ended early"
            await asyncio.sleep(0.01)
        t0 = loop.time()
        r = await c.post(f"{url}/generate", content=big, headers={"content-type": "application/json"})
        took = loop.time() - t0
        while stamps[-1] < t0 + took and not reader.done():  # the chunk that closes the last gap
            await asyncio.sleep(0.01)
        reader.cancel()
    assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params.max_new_tokens", r.text
    assert stamps[-1] > t0 + took, "the stream ended before the body was parsed"
    gap = max(b - a for a, b in zip(stamps, stamps[1:]) if b > t0 and a < t0 + took)
    assert gap < took / 2, f"largest gap {gap:.3f} s while the body took {took:.3f} s"
    assert_live(url)


def test_n_greedy_choices_are_equal(client, model_name):
    """n=2 greedy: two equal choices, indexes 0 and 1; usage counts both (F3)."""
    r = client.completions.create(
        model=model_name, prompt="Once upon a time", max_tokens=6, temperature=0, n=2, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].text == r.choices[1].text != ""
    assert [c.finish_reason for c in r.choices] == ["length", "length"]
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12


def test_n_seeded_chat_stream_matches_non_stream(client, model_name):
    """n=3 seeded at temperature 1: streamed chunks carry their choice's index (each choice's
    first chunk has the role), one usage chunk at the end counts all choices, and each
    choice's streamed text equals the non-streamed one (choice i is seeded seed + i)."""
    kw = dict(
        model=model_name,
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=8,
        temperature=1.0,
        seed=7,
        n=3,
        extra_body={"ignore_eos": True},
    )
    full = client.chat.completions.create(**kw)
    assert [c.index for c in full.choices] == [0, 1, 2]
    assert full.usage.completion_tokens == 24
    texts = [c.message.content for c in full.choices]
    assert len(set(texts)) > 1, texts
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    usage = [c for c in chunks if c.usage is not None]
    assert len(usage) == 1 and chunks[-1] is usage[0] and usage[0].choices == []
    counts = lambda u: (u.prompt_tokens, u.completion_tokens, u.total_tokens)  # noqa: E731 (cached_tokens grows)
    assert counts(usage[0].usage) == counts(full.usage)
    by_index: dict[int, list] = {0: [], 1: [], 2: []}
    for c in chunks[:-1]:
        by_index[c.choices[0].index].append(c.choices[0])
    for i, got in by_index.items():
        assert got[0].delta.role == "assistant"
        assert "".join(ch.delta.content or "" for ch in got) == texts[i]
        assert got[-1].finish_reason == "length"


def test_native_n_returns_a_list(url):
    body = {
        "text": "The sky is",
        "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True, "n": 2},
    }
    r = httpx.post(f"{url}/generate", json=body, timeout=30)
    assert r.status_code == 200, r.text
    out = r.json()
    assert isinstance(out, list) and len(out) == 2
    assert out[0]["text"] == out[1]["text"]
    assert out[0]["meta_info"]["id"] != out[1]["meta_info"]["id"]
    assert [o["meta_info"]["completion_tokens"] for o in out] == [4, 4]
    with httpx.stream("POST", f"{url}/generate", json={**body, "stream": True}, timeout=30) as s:
        events = sse_events(s)
    assert events[-1] == "[DONE]"
    last = {e["index"]: e for e in events[:-1]}
    assert sorted(last) == [0, 1]
    assert [last[i]["text"] for i in (0, 1)] == [out[0]["text"]] * 2


@pytest.mark.parametrize("max_tokens", [0, 3])
def test_echo_returns_the_prompt_first(url, max_tokens):
    """echo: the text starts with the prompt; with logprobs, the prompt's first token leads the
    entries with a null logprob (the rest arrive once the worker computes logprobs)."""
    base = {"prompt": "Once upon", "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "echo": True}
    plain = httpx.post(f"{url}/v1/completions", json=base, timeout=30)
    assert plain.status_code == 200, plain.text
    choice = plain.json()["choices"][0]
    assert choice["text"].startswith("Once upon") and choice["logprobs"] is None
    r = httpx.post(f"{url}/v1/completions", json={**base, "logprobs": 1}, timeout=30)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["text"] == plain.json()["choices"][0]["text"]
    lp = choice["logprobs"]
    assert lp["tokens"][0] == "Once" and lp["token_logprobs"][0] is None and lp["text_offset"][0] == 0
    assert r.json()["usage"]["completion_tokens"] == max_tokens
    assert_live(url)


def test_worker_ready_line_names_the_blas_thread_policy(tiny_server):
    """The worker's ready info states the BLAS thread count and wait policy launch chose."""
    import os

    from worker_proc.cpu.blas import find_fast_blas, thread_env, thread_report, usable_cores

    blas = find_fast_blas()
    if not blas:
        pytest.skip("no optimized BLAS to preload here")
    env = {**os.environ, **thread_env(0, usable_cores(), dict(os.environ))}
    ready = [line for line in tiny_server.log().splitlines() if "ready" in line and "proc=worker" in line]
    assert len(ready) == 1 and thread_report(blas, env) in ready[0], ready


@pytest.mark.parametrize(
    "prompt, prompt_tokens",
    [
        ([19556, 15107, 116], ["Hello", "", " \ufffd"]),  # "Hello 🦙" without its last byte: ends mid-character
        ([19556, 15107], ["Hello", " \ufffd"]),
        ([23274], ["\ufffd"]),  # one token, half of 日: the head is the prompt's last token too
        ([15107, 19556], ["", " \ufffdHello"]),  # an unfinished character inside the prompt
    ],
)
@pytest.mark.parametrize("max_tokens", [0, 3])
def test_echoed_prompt_that_ends_mid_character_matches_its_tokens(url, prompt, prompt_tokens, max_tokens):
    """With echo and logprobs, the tokens concatenate to the text, streamed or not, also for a
    prompt of token ids that leaves a UTF-8 character unfinished: the echo shows it decoded
    (U+FFFD), and so does the prompt's last entry, as an output cut inside a character ends
    its last entry. The prompt's tokens said "" for it, so they lacked the echo's U+FFFD."""
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "echo": True,
        "logprobs": 1,
    }
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert lp["tokens"][: len(prompt)] == prompt_tokens
    assert "".join(lp["tokens"]) == choice["text"]
    assert choice["text"].startswith("".join(prompt_tokens))
    assert lp["text_offset"] == [len("".join(lp["tokens"][:j])) for j in range(len(lp["tokens"]))]
    with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True}, timeout=30) as s:
        chunks = [e for e in sse_events(s)[:-1] if e["choices"]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    assert [t for c in chunks for t in (c["choices"][0]["logprobs"] or {}).get("tokens", [])] == lp["tokens"]


@pytest.mark.parametrize(
    "path, body, param",
    [
        (
            "/generate",
            {"text": "Hi", "sampling_params": {"max_new_tokens": 20, "ebnf": 'root ::= "ab" [^\\0-\\U0010FFFF]'}},
            "sampling_params.ebnf",
        ),
        (
            "/generate",
            {"text": "Hi", "sampling_params": {"max_new_tokens": 20, "regex": "ab[^\\d\\D]"}},
            "sampling_params.regex",
        ),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_grammar_that_reaches_a_dead_end_is_a_400(url, path, body, param, stream):
    """A structured-output constraint with a part that matches no text (an empty character
    class) let the output reach a point nothing can continue: it was a 200 with 'ab' and
    finish_reason "stop". It is now a 400 about the grammar's field, streamed as the SSE
    error event after the text written, and the server serves on. (A JSON-schema string
    pattern that matches no string is refused before the request starts.)"""
    r = httpx.post(f"{url}{path}", json={**body, "stream": stream}, timeout=60)
    if stream:
        assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text
        err = json.loads([line for line in r.text.splitlines() if line.startswith("data: {")][-1][6:])["error"]
        status = err["code"]
    else:
        status, err = r.status_code, r.json()["error"]
    assert (status, err["param"]) == (400, param), r.text
    assert "the grammar allows no next token and the output is not complete" in err["message"]
    assert "[^\\s\\S]" in err["message"]
    assert_live(url)
