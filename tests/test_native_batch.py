"""SGLang's batch form of native ``POST /generate`` (`tokenizer_proc.native.batch`): ``text``
as a list of prompts or ``input_ids`` as a list of token-id lists, with per-prompt
``sampling_params``, ``rid`` and logprob fields. It was a 400 (text must be a string).

Against the tiny random model: each prompt's greedy output in a batch equals the prompt sent
alone, in order, streamed and not; then the refusals, checked in-process against the fake
manager of `test_http_output`, which shows that nothing was sent."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest

from tests.pool_state import wait_idle
from tests.test_api_tiny import sse_events
from tests.test_http_output import builder, client_for, tok  # noqa: F401 (fixtures)

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
    return [generate(url, {field: p, "sampling_params": (params or [GREEDY] * len(prompts))[i]})["text"]
            for i, p in enumerate(prompts)]


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
    out = generate(url, {"text": PROMPTS[:2], "sampling_params": GREEDY, "return_logprob": [True, False],
                         "top_logprobs_num": [2, 0]})
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
        r = httpx.post(f"{url}/generate", json={"text": PROMPTS, "sampling_params": GREEDY, "return_logprob": True,
                                                field: value}, timeout=30)
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
    async with httpx.AsyncClient(timeout=60) as c:
        async with c.stream("POST", f"{url}/generate", json=body) as r:
            lines = r.aiter_lines()
            while not (await lines.__anext__()).startswith("data: {"):
                pass
    deadline = time.monotonic() + 10
    while _aborts(url) < before + len(PROMPTS):
        assert time.monotonic() < deadline, f"{_aborts(url) - before} of {len(PROMPTS)} prompts aborted"
        await asyncio.sleep(0.05)
    await asyncio.to_thread(wait_idle, url, 5.0)


# ---------------------------------------------------------------- refusals, in-process
@pytest.mark.parametrize("body,param,says", [
    ({"text": []}, "text", "an empty list"),
    ({"input_ids": [[5, 6], []]}, "input_ids.1", "the prompt is empty"),
    ({"text": ["a", ""]}, "text.1", "the prompt is empty"),
    ({"input_ids": [[5], [6, 10**6]]}, "input_ids.1", "token id 1000000 is out of range"),
    ({"text": ["a", "b"], "sampling_params": [{}, {"max_tokens": 3}]}, "sampling_params.1.max_tokens",
     "SGLang's name here is max_new_tokens"),
    ({"text": ["a", "b"], "sampling_params": [{}, {"max_new_tokens": 9000}]}, "sampling_params.1.max_new_tokens",
     "exceeds the context length"),
    ({"text": ["a", "b"], "sampling_params": {"max_new_tokens": 8191}}, None, None),
    ({"text": ["a", "b c d"], "sampling_params": {"max_new_tokens": 8191}}, "sampling_params.max_new_tokens",
     "text.1: sampling_params.max_new_tokens=8191"),
    ({"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params", "a list of length 1 for a batch of 2"),
    ({"text": ["a", "b"], "sampling_params": [{}, {"n": 2}]}, "sampling_params.1.n", "the same n"),
    ({"text": ["a", "b", "c"], "sampling_params": {"n": 2}}, "text", "6 choices, more than this server allows in one request (--max-batch-choices 5)"),
    ({"text": ["a", "b"], "rid": ["x", "x"]}, "rid.1", "'x' is given twice"),
    ({"text": ["a", "b"], "rid": ["x", "x-1"], "sampling_params": {"n": 2}}, "rid.1", "'x-1' is given twice"),
    ({"text": ["a", "b"], "logprob_start_len": [0, 5], "return_logprob": True}, "logprob_start_len.1",
     "lies past the prompt"),
    ({"text": ["a", "b"], "top_logprobs_num": [0, 2]}, "top_logprobs_num.1", "top_logprobs_num.1 needs return_logprob"),
    ({"text": ["a", "b"], "top_logprobs_num": 2}, "top_logprobs_num", "text.0: top_logprobs_num needs return_logprob"),
    ({"text": "a", "sampling_params": [{}]}, "sampling_params", "a list of values is for a batch"),
    ({"input_ids": [5, 6], "token_ids_logprob": [[1], [2]], "return_logprob": True}, "token_ids_logprob",
     "a list of values is for a batch"),
    ({"text": ["a"], "input_ids": [[5]]}, "text", "exactly one of text and input_ids"),
])
def test_a_bad_batch_is_400_naming_the_prompt_before_anything_is_sent(builder, body, param, says):
    """builder: --max-n 4, --max-batch-choices 5 and a context of 8,192 tokens ("b c d" is 3 tokens, "a" and "b" one each)."""
    client, manager = client_for(builder)
    for stream in (False, True):
        r = client.post("/generate", json={**body, "stream": stream})
        if param is None:  # the control case: it fits
            assert r.status_code == 200, r.text
            manager.sent.clear()
            continue
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and says in err["message"], err
        assert manager.sent == []
