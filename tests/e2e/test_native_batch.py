"""SGLang's batch form of native ``POST /generate`` (`tokenizer_proc.native.batch`): ``text``
as a list of prompts or ``input_ids`` as a list of token-id lists, with per-prompt
``sampling_params``, ``rid`` and logprob fields. It was a 400 (text must be a string).

Against the tiny random model: each prompt's greedy output in a batch equals the prompt sent
alone, in order, streamed and not; then the refusals. A bad batch refused before anything is
sent, in-process against the fake manager: tests/api/test_native_batch.py."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest

from tests.support.live_sse import sse_events
from tests.support.pool_state import wait_idle

PROMPTS = ["The sky is", "Once upon a time there was", "1 2 3 4"]
GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def url(tiny_server):
    return tiny_server.base_url


def generate(url: str, body: dict):
    r = httpx.post(f"{url}/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def alone(url: str, prompts: list, field: str = "text", params: list[dict] | None = None) -> list[str]:
    """The greedy text of each prompt sent alone (with its own sampling params)."""
    return [
        generate(url, {field: p, "sampling_params": (params or [GREEDY] * len(prompts))[i]})["text"]
        for i, p in enumerate(prompts)
    ]


def test_text_batch_returns_each_prompts_own_output_in_order(url):
    out = generate(url, {"text": PROMPTS, "sampling_params": GREEDY})
    assert isinstance(out, list) and len(out) == len(PROMPTS)
    assert [o["text"] for o in out] == alone(url, PROMPTS)
    assert [o["meta_info"]["completion_tokens"] for o in out] == [6, 6, 6]
    assert [o["meta_info"]["finish_reason"]["type"] for o in out] == ["length"] * 3
    assert len({o["meta_info"]["id"] for o in out}) == 3
    one = generate(url, {"text": PROMPTS[:1], "sampling_params": GREEDY})  # a batch of one is still a list
    assert isinstance(one, list) and [o["text"] for o in one] == [out[0]["text"]]


def test_input_ids_batch(url, tokenizer):
    ids = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS[:2]] + [[5, 6, 7]]
    out = generate(url, {"input_ids": ids, "sampling_params": GREEDY})
    assert [o["text"] for o in out] == alone(url, ids, "input_ids")
    assert [o["meta_info"]["prompt_tokens"] for o in out] == [len(i) for i in ids]


def test_per_prompt_sampling_params(url):
    params = [{**GREEDY, "max_new_tokens": 2}, {**GREEDY, "max_new_tokens": 7}, {**GREEDY, "max_new_tokens": 4}]
    out = generate(url, {"text": PROMPTS, "sampling_params": params})
    assert [o["meta_info"]["completion_tokens"] for o in out] == [2, 7, 4]
    assert [o["text"] for o in out] == alone(url, PROMPTS, params=params)


def test_per_prompt_logprob_fields(url):
    out = generate(
        url,
        {"text": PROMPTS[:2], "sampling_params": GREEDY, "return_logprob": [True, False], "top_logprobs_num": [2, 0]},
    )
    assert [len(t) for t in out[0]["meta_info"]["output_top_logprobs"]] == [2] * 6
    assert len(out[0]["meta_info"]["output_token_logprobs"]) == 6
    assert "output_token_logprobs" not in out[1]["meta_info"]


def test_rid_list_names_each_prompt_and_n_fans_out_per_prompt(url):
    """Choice i of prompt p at index p * n + i, as SGLang orders a batch with n > 1; choice
    i > 0 shows ``{rid}-{i}``; one rid for a batch names prompt p ``{rid}_{p}`` (SGLang's)."""
    texts = alone(url, PROMPTS[:2])
    out = generate(url, {"text": PROMPTS[:2], "rid": ["first", "second"], "sampling_params": {**GREEDY, "n": 2}})
    assert [o["meta_info"]["id"] for o in out] == ["first", "first-1", "second", "second-1"]
    assert [o["text"] for o in out] == [texts[0], texts[0], texts[1], texts[1]]
    out = generate(url, {"text": PROMPTS[:2], "rid": "run", "sampling_params": GREEDY})
    assert [o["meta_info"]["id"] for o in out] == ["run_0", "run_1"]
    out = generate(url, {"text": PROMPTS[:2], "rid": ["first", "second"], "sampling_params": GREEDY})  # free again
    assert [o["meta_info"]["id"] for o in out] == ["first", "second"]


def test_streamed_batch_events_carry_their_index(url):
    body = {"text": PROMPTS, "sampling_params": [GREEDY, {**GREEDY, "max_new_tokens": 9}, GREEDY]}
    full = generate(url, body)
    with httpx.stream("POST", f"{url}/generate", json={**body, "stream": True}, timeout=60) as s:
        assert s.status_code == 200
        events = sse_events(s)
    assert events[-1] == "[DONE]"
    assert all(isinstance(e["index"], int) for e in events[:-1])
    last = {e["index"]: e for e in events[:-1]}
    assert sorted(last) == [0, 1, 2]
    assert [last[i]["text"] for i in range(3)] == [o["text"] for o in full]
    assert [last[i]["meta_info"]["completion_tokens"] for i in range(3)] == [6, 9, 6]


def test_mismatched_list_is_400_naming_the_field(url):
    for field, value in (("sampling_params", [GREEDY] * 2), ("rid", ["a"]), ("logprob_start_len", [0, 0])):
        r = httpx.post(
            f"{url}/generate",
            json={"text": PROMPTS, "sampling_params": GREEDY, "return_logprob": True, field: value},
            timeout=30,
        )
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == field and f"a list of length {len(value)} for a batch of 3 prompts" in err["message"]


def _aborts(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    m = re.search(r'^lazyserve_request_success_total\{finished_reason="abort"\} ([0-9.e+]+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


async def test_client_leaving_a_streamed_batch_aborts_every_prompt(url):
    before = _aborts(url)
    body = {"text": PROMPTS, "stream": True, "sampling_params": {**GREEDY, "max_new_tokens": 1900}}
    async with httpx.AsyncClient(timeout=60) as c, c.stream("POST", f"{url}/generate", json=body) as r:
        lines = r.aiter_lines()
        while not (await lines.__anext__()).startswith("data: {"):
            pass
    deadline = time.monotonic() + 10
    while _aborts(url) < before + len(PROMPTS):
        assert time.monotonic() < deadline, f"{_aborts(url) - before} of {len(PROMPTS)} prompts aborted"
        await asyncio.sleep(0.05)
    await asyncio.to_thread(wait_idle, url, 5.0)
