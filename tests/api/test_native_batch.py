"""SGLang's batch form of native ``POST /generate``: a bad batch is a 400 naming the
prompt, checked in-process against the fake manager (`tests.support.fake_app`), which
shows that nothing was sent. On the tiny model's server: tests/e2e/test_native_batch.py."""

from __future__ import annotations

import pytest

from tests.support.fake_app import client_for


# ---------------------------------------------------------------- refusals, in-process
@pytest.mark.parametrize(
    "body,param,says",
    [
        ({"text": []}, "text", "an empty list"),
        ({"input_ids": [[5, 6], []]}, "input_ids.1", "the prompt is empty"),
        ({"text": ["a", ""]}, "text.1", "the prompt is empty"),
        ({"input_ids": [[5], [6, 10**6]]}, "input_ids.1", "token id 1000000 is out of range"),
        (
            {"text": ["a", "b"], "sampling_params": [{}, {"max_tokens": 3}]},
            "sampling_params.1.max_tokens",
            "SGLang's name here is max_new_tokens",
        ),
        (
            {"text": ["a", "b"], "sampling_params": [{}, {"max_new_tokens": 9000}]},
            "sampling_params.1.max_new_tokens",
            "exceeds the context length",
        ),
        ({"text": ["a", "b"], "sampling_params": {"max_new_tokens": 8191}}, None, None),
        (
            {"text": ["a", "b c d"], "sampling_params": {"max_new_tokens": 8191}},
            "sampling_params.max_new_tokens",
            "text.1: sampling_params.max_new_tokens=8191",
        ),
        ({"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params", "a list of length 1 for a batch of 2"),
        ({"text": ["a", "b"], "sampling_params": [{}, {"n": 2}]}, "sampling_params.1.n", "the same n"),
        (
            {"text": ["a", "b", "c"], "sampling_params": {"n": 2}},
            "text",
            "6 choices, more than this server allows in one request (--max-batch-choices 5)",
        ),
        ({"text": ["a", "b"], "rid": ["x", "x"]}, "rid.1", "'x' is given twice"),
        ({"text": ["a", "b"], "rid": ["x", "x-1"], "sampling_params": {"n": 2}}, "rid.1", "'x-1' is given twice"),
        (
            {"text": ["a", "b"], "logprob_start_len": [0, 5], "return_logprob": True},
            "logprob_start_len.1",
            "lies past the prompt",
        ),
        (
            {"text": ["a", "b"], "top_logprobs_num": [0, 2]},
            "top_logprobs_num.1",
            "top_logprobs_num.1 needs return_logprob",
        ),
        (
            {"text": ["a", "b"], "top_logprobs_num": 2},
            "top_logprobs_num",
            "text.0: top_logprobs_num needs return_logprob",
        ),
        ({"text": "a", "sampling_params": [{}]}, "sampling_params", "a list of values is for a batch"),
        (
            {"input_ids": [5, 6], "token_ids_logprob": [[1], [2]], "return_logprob": True},
            "token_ids_logprob",
            "a list of values is for a batch",
        ),
        ({"text": ["a"], "input_ids": [[5]]}, "text", "exactly one of text and input_ids"),
    ],
)
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
