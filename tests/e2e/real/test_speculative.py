"""Speculative decoding with the default model's real weights (issue 42), in this process:
prompt-lookup drafts (the scheduler's `TokenHistory`) verified by the worker give the output
of plain greedy decoding, token for token, and are mostly accepted on text that repeats its
input."""

from __future__ import annotations

from bench.spec_prompts import WORKLOADS
from scheduler_proc.spec.ngram import TokenHistory
from tests.support.worker_runs import GREEDY, run_batch, spec_run
from worker_proc.model.runner import ModelRunner


def test_prompt_lookup_drafts_keep_greedy_output_and_are_accepted(loaded, tokenizer):
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": WORKLOADS[w][i]}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for w, i in (("quote_summary", 1), ("free_text", 0))
    ]
    rids = ["quote", "free"]
    ref = run_batch(ModelRunner(loaded), rids, prompts, 48, [GREEDY] * 2)
    counts = {r: [0, 0] for r in rids}

    def draft(rid, so_far, step):
        d = TokenHistory(prompts[rids.index(rid)] + so_far).propose(4)
        counts[rid][0] += len(d)
        n = len(so_far)
        counts[rid][1] += next((j for j, t in enumerate(d) if n + j >= len(ref[rid]) or ref[rid][n + j] != t), len(d))
        return d

    got = spec_run(ModelRunner(loaded), rids, prompts, [GREEDY] * 2, 48, draft)
    assert got == ref
    drafted, accepted = counts["quote"]
    assert accepted > 15 and accepted / drafted > 0.3, counts  # drafts of 4 at every step: the server adapts them
