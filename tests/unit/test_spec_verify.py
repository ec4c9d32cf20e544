"""TARGET_VERIFY in the worker (issue 42): drafts checked in one launch, accepted runs and
rollback, against the same rows decoded one token per launch (`ModelRunner`, tiny llama)."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchKVCache

from protocol.config import ModelSource
from protocol.enums import ForwardMode
from protocol.messages import ForwardBatch, SamplingParams
from scheduler_proc.logprobs import position
from tests.support.tiny_model import write_random_model
from tests.support.window_configs import WINDOW_CONFIGS
from tests.support.worker_runs import GREEDY, extend, run, run_batch, spec_run
from worker_proc.model.decode_graph import DecodeGraph
from worker_proc.model.loader import load
from worker_proc.model.runner import ModelRunner
from worker_proc.spec.verify import accept, rollback, unsupported

SEEDED = SamplingParams(temperature=0.9, top_k=40, seed=11)
PLAIN_SEEDED = SamplingParams(temperature=1.0, seed=5)
PROMPTS = [list(range(40, 60)), list(range(300, 305)), list(range(900, 933))]


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load(ModelSource("hf", str(tiny_model_dir), "tiny"))


def oracle(reference, wrong_every=3):
    """Drafts from the reference output (right), with one token made wrong on some steps."""

    def draft(rid, so_far, step):
        if step % 5 == 0:
            return []
        k = 1 + step % 4
        d = list(reference[rid][len(so_far) : len(so_far) + k])
        if d and step % wrong_every == 0:
            d[len(d) // 2] = (d[len(d) // 2] + 1) % 49152
        return d

    return draft


@pytest.mark.parametrize("params", [[GREEDY] * 3, [SEEDED, GREEDY, PLAIN_SEEDED]], ids=["greedy", "seeded"])
def test_verify_equals_decoding_one_token_at_a_time(loaded, params):
    """Greedy and seeded rows (sampled and truncated) produce exactly the tokens of plain
    decoding, with right, partly wrong and absent drafts of 1-4 tokens, rows leaving as they
    end."""
    rids = ["a", "b", "c"]
    ref = run_batch(ModelRunner(loaded), rids, PROMPTS, 24, params)
    got = spec_run(ModelRunner(loaded), rids, PROMPTS, params, 24, oracle(ref))
    assert got == ref


def test_verify_beside_captured_decodes(loaded):
    """Launches without drafts replay the captured decode step between verifies: the same
    output as plain decoding."""
    rids = ["a", "b"]
    ref = run_batch(ModelRunner(loaded), rids, PROMPTS[:2], 20, [GREEDY] * 2)
    graph = DecodeGraph(loaded.model, 4)
    got = spec_run(ModelRunner(loaded, graph=graph), rids, PROMPTS[:2], [GREEDY] * 2, 20, oracle(ref, wrong_every=2))
    assert got == ref and graph.replays > 0


def test_logprobs_of_accepted_tokens_are_those_of_plain_decoding(loaded):
    """A drafting row that asks for logprobs (top 2 and one fixed id) gets, for every token of
    its accepted runs, the logprobs plain decoding reports for it."""
    params = SamplingParams(temperature=0.0, top_logprobs=2, token_ids_logprob=[7])
    plain = ModelRunner(loaded)
    toks, lps = run(plain, {"a": PROMPTS[0]}, {"a": params}, 16)
    ref = {"a": toks["a"]}
    runner = ModelRunner(loaded)
    runner.launch(1, ForwardMode.EXTEND, extend(["a"], PROMPTS[:1], [params]))
    out, got = list(runner.finalize(1)[1]), [runner.last_logprobs[0][0]]
    lid, runs = 1, 0
    while len(out) < 16:
        lid += 1
        draft = ref["a"][len(out) : len(out) + 3]
        runner.launch(lid, ForwardMode.TARGET_VERIFY, ForwardBatch(["a"], draft_ids=[draft]))
        out += runner.finalize(lid)[1]
        got.append(runner.last_logprobs[0][0])
        if runner.last_more and runner.last_more[0]:
            runs += 1
            out += runner.last_more[0]
            more = runner.last_more_logprobs[0]
            got += [position(more, j) for j in range(len(runner.last_more[0]))]
    assert out[:16] == ref["a"] and runs > 0
    for mine, theirs in zip(got[:16], lps["a"]):
        assert mine.token_ids == theirs.token_ids and mine.top_ids == theirs.top_ids
        assert mine.logprobs == pytest.approx(theirs.logprobs, abs=1e-4)
        assert mine.ids_logprobs[0] == pytest.approx(theirs.ids_logprobs[0], abs=1e-4)


def test_wrong_drafts_are_all_rejected_and_kv_rolls_back(loaded):
    """Drafts that are always wrong: every verify yields one token, the rows' KV lengths stay
    those of plain decoding, and the output equals it."""
    rids = ["a", "b"]
    ref = run_batch(ModelRunner(loaded), rids, PROMPTS[:2], 16, [GREEDY] * 2)
    runner = ModelRunner(loaded)
    got = spec_run(runner, rids, PROMPTS[:2], [GREEDY] * 2, 16, lambda r, s, step: [(s[-1] + 7) % 49152] * 3)
    assert got == ref


def test_accepted_drafts_advance_several_tokens_per_launch(loaded):
    """Right drafts of 4 tokens: each launch yields 5 tokens (until a row ends), and the KV
    length of each row is its prompt plus its tokens but the last."""
    ref = run_batch(ModelRunner(loaded), ["a"], PROMPTS[:1], 40, [GREEDY])
    runner = ModelRunner(loaded)
    runner.launch(1, ForwardMode.EXTEND, extend(["a"], PROMPTS[:1]))
    out = runner.finalize(1)[1]
    runner.launch(2, ForwardMode.TARGET_VERIFY, ForwardBatch(["a"], draft_ids=[ref["a"][1:5]]))
    tok = runner.finalize(2)[1]
    assert [*out, *tok, *runner.last_more[0]] == ref["a"][:6]
    assert runner.batch.length(0) == len(PROMPTS[0]) + 5


def test_abort_during_a_verify_is_applied_after_its_finalize(loaded):
    runner = ModelRunner(loaded)
    runner.launch(1, ForwardMode.EXTEND, extend(["a", "b"], PROMPTS[:2]))
    runner.finalize(1)
    runner.launch(2, ForwardMode.TARGET_VERIFY, ForwardBatch(["a", "b"], draft_ids=[[5, 6], [7]]))
    runner.abort(["a"])
    assert runner.batch.rids == ["a", "b"]
    with pytest.raises(ValueError, match="before TARGET_VERIFY launch 2 was finalized"):
        runner.launch(3, ForwardMode.DECODE, ForwardBatch(["a", "b"]))
    rids, _ = runner.finalize(2)
    assert rids == ["a", "b"] and runner.batch.rids == ["b"]


def test_drafts_for_rows_that_read_each_token_are_refused(loaded):
    runner = ModelRunner(loaded)
    penalized = SamplingParams(temperature=0.0, frequency_penalty=0.5)  # its counts would need the draft
    runner.launch(1, ForwardMode.EXTEND, extend(["a"], PROMPTS[:1], [penalized]))
    runner.finalize(1)
    with pytest.raises(ValueError, match="cannot take a draft"):
        runner.launch(2, ForwardMode.TARGET_VERIFY, ForwardBatch(["a"], draft_ids=[[5]]))


def test_a_model_with_sliding_windows_refuses_drafts(tokenizer, tmp_path):
    path = write_random_model(tmp_path, tokenizer, WINDOW_CONFIGS["gpt_oss"])
    loaded = load(ModelSource("hf", str(path), "w"))
    assert "sliding-window layers, whose rollback is not built yet" in unsupported(loaded.caches)  # refused at start
    runner = ModelRunner(loaded)
    runner.launch(1, ForwardMode.EXTEND, extend(["a"], PROMPTS[:1]))
    runner.finalize(1)
    with pytest.raises(ValueError, match="sliding-window layers, whose rollback is not built yet"):
        runner.launch(2, ForwardMode.TARGET_VERIFY, ForwardBatch(["a"], draft_ids=[[5]]))


def test_the_decode_graph_refuses_target_verify_naming_it(loaded):
    graph = DecodeGraph(loaded.model, 2)
    with pytest.raises(ValueError, match="cannot capture forward mode TARGET_VERIFY.*DECODE"):
        graph.run(ForwardMode.TARGET_VERIFY, mx.array([1], dtype=mx.int32), [])


def test_accept_keeps_the_longest_agreeing_run():
    assert accept([5, 9], [[5, 6, 7], [1]], [[6, 8, 3], [4]]) == [[6, 8], []]
    assert accept([5], [[]], [[]]) == [[]]


def test_rollback_trims_rows_by_their_own_counts():
    c = BatchKVCache([2, 0])
    k = mx.arange(2 * 6, dtype=mx.float32).reshape(2, 1, 6, 1)
    c.update_and_fetch(k, k)
    rollback([c], [1, 3])
    keys, _ = c.keys_and_values()
    assert c._idx == 5 and c.offset.tolist() == [3, 3] and c.left_padding.tolist() == [2, 2]
    assert keys[0, 0, 2:, 0].tolist() == [2, 3, 4] and keys[1, 0, 2:, 0].tolist() == [6, 7, 8]


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_verify_equals_plain_decoding_on_moe_families(family, tokenizer, tmp_path):
    from tests.support.tiny_model import MOE_FAMILIES

    moe = load(ModelSource("hf", str(write_random_model(tmp_path, tokenizer, MOE_FAMILIES[family])), family))
    rids = ["a", "b"]
    ref = run_batch(ModelRunner(moe), rids, PROMPTS[:2], 16, [GREEDY, SEEDED])
    assert spec_run(ModelRunner(moe), rids, PROMPTS[:2], [GREEDY, SEEDED], 16, oracle(ref)) == ref


def test_rollback_of_layers_sharing_one_left_padding_array():
    """A captured decode step leaves every layer's cache with the same left_padding object;
    mlx-lm's finalize adds to it in place, so the per-row roll must not add once per layer."""
    caches = []
    for _ in range(3):
        c = BatchKVCache([0, 0])
        k = mx.zeros((2, 1, 6, 1))
        c.update_and_fetch(k, k)
        caches.append(c)
    shared = mx.array([0, 0])
    for c in caches:
        c.left_padding = shared
    rollback(caches, [0, 2])
    assert [c.left_padding.tolist() for c in caches] == [[0, 2]] * 3
