"""Output control in the worker's graph against independent references: sampling sets and
frequencies, seeds independent of the batch, penalties against mlx-lm's own processors,
output and prompt logprobs against a plain mlx-lm forward pass, min_tokens, grammar masks,
and no leak of a row's state into its neighbours.

These tests run on the default model loaded in this process (`loaded`); the others of
the module: tests/unit/test_output_control_worker.py."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_frequency_penalty, make_presence_penalty, make_repetition_penalty

from protocol.enums import ForwardMode
from protocol.messages import ForwardBatch, SamplingParams
from tests.support.worker_runs import run
from worker_proc.model.runner import ModelRunner

EOS = 2


PROMPT = "Write a list of five fruits, one per line."


@pytest.fixture(scope="module")
def prompt_ids(tokenizer):
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], tokenize=False, add_generation_prompt=True
    )
    return tokenizer.encode(text, add_special_tokens=False)


# ---------------------------------------------------------------------- through the runner
def mlx_lm_reference(model, prompt: list[int], steps: int, processors, top: int):
    """Greedy steps with mlx-lm's processors: (tokens, chosen logprobs, top ids)."""
    cache = make_prompt_cache(model)
    logits = model(mx.array(prompt)[None], cache=cache)[:, -1].astype(mx.float32)
    out, chosen, tops = [], [], []
    for _ in range(steps):
        for proc, history in processors:
            logits = proc(mx.array(history(out), dtype=mx.int32), logits)
        lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        tok = mx.argmax(lp, axis=-1).item()
        out.append(tok)
        chosen.append(lp[0, tok].item())
        tops.append(mx.argsort(-lp[0])[:top].tolist())
        logits = model(mx.array([[tok]]), cache=cache)[:, -1].astype(mx.float32)
    return out, chosen, tops


def test_penalties_and_logprobs_equal_mlx_lms_processors(loaded, prompt_ids):
    steps = 6
    params = SamplingParams(
        temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.4, top_logprobs=5
    )
    toks, lps = run(ModelRunner(loaded), {"p": prompt_ids}, {"p": params}, steps)
    processors = [
        (make_repetition_penalty(1.3, 10**6), lambda out: prompt_ids + out),
        (make_presence_penalty(0.4, 10**6), lambda out: out),
        (make_frequency_penalty(0.5, 10**6), lambda out: out),
    ]
    ref_toks, ref_chosen, ref_tops = mlx_lm_reference(loaded.model, prompt_ids, steps, processors, 5)
    assert toks["p"] == ref_toks
    plain, _, _ = mlx_lm_reference(loaded.model, prompt_ids, steps, [], 5)
    assert plain != ref_toks  # the penalties change the output, so the comparison is not vacuous
    for lp, c, top in zip(lps["p"], ref_chosen, ref_tops):
        assert abs(lp.logprobs[0] - c) < 1e-3
        assert lp.top_ids[0] == top


def test_output_logprobs_are_sorted_and_the_greedy_token_is_the_top_one(loaded, prompt_ids):
    params = SamplingParams(temperature=0.0, top_logprobs=4, token_ids_logprob=[EOS, 100])
    toks, lps = run(ModelRunner(loaded), {"a": prompt_ids}, {"a": params}, 4)
    for t, lp in zip(toks["a"], lps["a"]):
        assert lp.token_ids == [t] and lp.top_ids[0][0] == t
        assert lp.logprobs[0] == pytest.approx(lp.top_logprobs[0][0], abs=1e-6)
        assert all(v <= 0 for v in lp.top_logprobs[0]) and lp.top_logprobs[0] == sorted(
            lp.top_logprobs[0], reverse=True
        )
        assert len(lp.ids_logprobs[0]) == 2 and all(v <= 0 for v in lp.ids_logprobs[0])


def test_penalties_bias_min_tokens_and_grammar_never_leak_into_other_rows(loaded, prompt_ids, tokenizer):
    other = tokenizer.encode("The quick brown fox", add_special_tokens=False)
    greedy = SamplingParams(temperature=0.0)
    seeded = SamplingParams(temperature=0.8, seed=11)
    alone, _ = run(ModelRunner(loaded), {"g": prompt_ids, "s": other}, {"g": greedy, "s": seeded}, 8)
    vocab = loaded.vocab_size
    mask = np.zeros((vocab + 31) // 32, dtype="<i4")
    mask[0] = 0b111000  # tokens 3, 4, 5 only
    mixed = {
        "pen": SamplingParams(temperature=0.0, repetition_penalty=2.0, frequency_penalty=1.5),
        "g": greedy,
        "bias": SamplingParams(temperature=0.0, logit_bias={EOS: 100.0}, min_tokens=3, min_tokens_ids=[EOS]),
        "s": seeded,
        "gram": SamplingParams(temperature=0.5, seed=3),
    }
    rows = {"pen": prompt_ids, "g": prompt_ids, "bias": other, "s": other, "gram": prompt_ids}
    toks, _ = run(ModelRunner(loaded), rows, mixed, 8, grammar={"gram": mask.tobytes()})
    assert toks["g"] == alone["g"] and toks["s"] == alone["s"]
    assert toks["bias"][:3] != [EOS] * 3 and EOS not in toks["bias"][:3] and toks["bias"][3] == EOS
    assert set(toks["gram"]) <= {3, 4, 5}


def test_prompt_logprobs_equal_a_plain_forward_pass_in_one_chunk_or_two(loaded, prompt_ids):
    logits = loaded.model(mx.array(prompt_ids)[None])[0].astype(mx.float32)
    lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    ref = [lp[j - 1, prompt_ids[j]].item() for j in range(1, len(prompt_ids))]
    top1 = mx.argmax(lp, axis=-1).tolist()
    params = SamplingParams(temperature=0.0, top_logprobs=2, logprob_start_len=0)
    one = ModelRunner(loaded)
    one.launch(1, ForwardMode.EXTEND, ForwardBatch(["a"], [prompt_ids], [params], [True]))
    one.finalize(1)
    whole = one.last_logprobs[1][0]
    assert whole.token_ids == prompt_ids[1:]
    assert np.allclose(whole.logprobs, ref, atol=1e-3)
    assert [t[0] for t in whole.top_ids] == top1[:-1]
    cut = 9
    two = ModelRunner(loaded)
    two.launch(1, ForwardMode.EXTEND, ForwardBatch(["a"], [prompt_ids[:cut]], [params], [False]))
    two.finalize(1)
    first = two.last_logprobs[1][0]
    two.launch(2, ForwardMode.EXTEND, ForwardBatch(["a"], [prompt_ids[cut:]], [None], [True]))
    two.finalize(2)
    second = two.last_logprobs[1][0]
    assert first.token_ids + second.token_ids == prompt_ids[1:]
    assert np.allclose(first.logprobs + second.logprobs, ref, atol=1e-3)
    late = ModelRunner(loaded)
    late.launch(
        1,
        ForwardMode.EXTEND,
        ForwardBatch(["a"], [prompt_ids], [SamplingParams(temperature=0.0, logprob_start_len=20)], [True]),
    )
    late.finalize(1)
    assert late.last_logprobs[1][0].token_ids == prompt_ids[20:]
    assert math.isclose(late.last_logprobs[1][0].logprobs[0], ref[19], abs_tol=1e-3)


def test_a_custom_processor_sees_its_outputs_and_arguments(loaded, prompt_ids, tmp_path, monkeypatch):
    (tmp_path / "my_procs.py").write_text(
        "import mlx.core as mx\n"
        "SEEN = []\n"
        "def only(logits, output_ids, args):\n"
        "    SEEN.append(list(output_ids))\n"
        "    keep = mx.arange(logits.shape[0]) == args['token'] + len(output_ids)\n"
        "    return mx.where(keep, logits, -mx.inf)\n"
        "def boom(logits, output_ids, args):\n"
        "    raise RuntimeError('processor exploded')\n"
        "def short(logits, output_ids, args):\n"
        "    return logits[:10]\n"
        "LOGIT_PROCESSORS = {'only': only, 'boom': boom, 'short': short}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from worker_proc.logits.custom import load_processors

    procs = load_processors("my_procs")
    runner = ModelRunner(loaded, processors=procs)
    params = {
        "c": SamplingParams(temperature=0.7, logit_processor="only", logit_processor_args='{"token": 500}'),
        "g": SamplingParams(temperature=0.0),
    }
    toks, _ = run(runner, {"c": prompt_ids, "g": prompt_ids}, params, 4)
    alone, _ = run(ModelRunner(loaded), {"g": prompt_ids}, {"g": params["g"]}, 4)
    assert toks["c"] == [500, 501, 502, 503] and toks["g"] == alone["g"]
    import my_procs

    assert my_procs.SEEN == [[], [500], [500, 501], [500, 501, 502]]
    for bad in ("boom", "short"):
        runner = ModelRunner(loaded, processors=procs)
        runner.launch(
            1,
            ForwardMode.EXTEND,
            ForwardBatch(
                ["x", "g"], [prompt_ids, prompt_ids], [SamplingParams(logit_processor=bad), params["g"]], [True, True]
            ),
        )
        rids, ids = runner.finalize(1)
        assert ids[1] == alone["g"][0] and runner.last_row_errors[1] == ""
        assert runner.last_row_errors[0].startswith(f"custom logit processor {bad!r} failed")
    with pytest.raises(ValueError, match="unknown logit processor"):
        runner.launch(
            9, ForwardMode.EXTEND, ForwardBatch(["y"], [prompt_ids], [SamplingParams(logit_processor="no")], [True])
        )
    with pytest.raises(ValueError, match="cannot import"):
        load_processors("no_such_module_here")


@pytest.mark.parametrize("after", [0, 2], ids=["prefill", "decode"])
@pytest.mark.parametrize("name", ["raises", "exits", "lazy", "wrong_shape"])
def test_a_failing_processor_fails_its_row_alone(loaded, prompt_ids, name, after):
    """A processor that raises (SystemExit too), returns a bad value, or returns an array
    whose evaluation fails (MLX reports that only when the graph runs: left lazy it failed
    the whole launch, every row with it), at the prefill or at a later decode step: its row
    alone gets an error naming the processor and the exception; the greedy row beside it
    writes what it writes alone, and the runner serves the next launches."""
    from tests.support.faulty_processors import FAULTS, LOGIT_PROCESSORS

    greedy = SamplingParams(temperature=0.0)
    alone, _ = run(ModelRunner(loaded), {"g": prompt_ids}, {"g": greedy}, 5)
    runner = ModelRunner(loaded, processors=dict(LOGIT_PROCESSORS))
    faulty = SamplingParams(temperature=0.0, logit_processor=name, logit_processor_args=f'{{"after": {after}}}')
    runner.launch(
        1, ForwardMode.EXTEND, ForwardBatch(["x", "g"], [prompt_ids, prompt_ids], [faulty, greedy], [True, True])
    )
    rids, toks = ["x", "g"], {"x": [], "g": []}
    errors = []
    for lid in range(1, 6):
        if lid > 1:
            runner.launch(lid, ForwardMode.DECODE, ForwardBatch(list(rids)))
        got, ids = runner.finalize(lid)
        for r, t, err in zip(got, ids, runner.last_row_errors or [""] * len(got)):
            if err:
                errors.append((lid, r, err))
                runner.abort([r])  # as the scheduler does when it fails the request
                rids.remove(r)
            else:
                toks[r].append(t)
    assert errors == [(after + 1, "x", errors[0][2])], errors
    assert errors[0][2].startswith(f"custom logit processor {name!r} failed: {FAULTS[name]}")
    assert toks["g"] == alone["g"] and toks["x"] == alone["g"][:after]


def test_a_retracted_row_prefilled_again_continues_its_seeded_stream_and_penalties(loaded, prompt_ids):
    params = SamplingParams(temperature=0.8, seed=21, frequency_penalty=0.7, repetition_penalty=1.2)
    toks, _ = run(ModelRunner(loaded), {"a": prompt_ids}, {"a": params}, 6)
    done = toks["a"][:3]
    again = ModelRunner(loaded)
    again.launch(1, ForwardMode.EXTEND, ForwardBatch(["a"], [prompt_ids + done], [params], [True], num_generated=[3]))
    rest = [again.finalize(1)[1][0]]
    for lid in (2, 3):
        again.launch(lid, ForwardMode.DECODE, ForwardBatch(["a"]))
        rest.append(again.finalize(lid)[1][0])
    assert rest == toks["a"][3:]
