"""Reasoning budgets in the scheduler (`scheduler_proc.reasoning_budget`): the closing tag
is forced right after ``budget`` tokens inside the think block, whether the prompt opened
the block or the model did, continuing a tag the model had begun, never when the model
closed the block itself or never opened one; exact under the overlap pipeline, which still
chains the other steps. Driven without sockets or MLX, by a fake worker that obeys masks."""

from __future__ import annotations

import pytest

from protocol.enums import GrammarKind
from protocol.messages import DetokParams, GenerateReq, GrammarSpec, ReasoningBudget, ReqError, SamplingParams
from protocol.token_mask import allowed_ids
from scheduler_proc.scheduler import Scheduler
from tests.support.sim_loop import Loop
from tests.support.sim_worker import FakeWorker, ListOutbox

VOCAB, EOS = 64, 2
OPEN, CLOSE = [7, 8], [9, 11]
W = 20  # a token the scripted model writes


class MaskingWorker(FakeWorker):
    """The fake worker, sampling the one allowed token of a launch's one-token masks (a
    chained decode carries no masks: if the scheduler chained a forced step, the script wins
    and the test sees it)."""

    def __init__(self, scripts: dict[str, list[int]]) -> None:
        super().__init__(lambda rid, n: scripts[rid][n] if n < len(scripts[rid]) else W)
        self.forced: dict[str, int] = {}

    def handle(self, msg):
        self.forced = {}
        batch = getattr(msg, "batch", None)
        if batch is not None:
            for row, mask in zip(batch.grammar_rows, batch.grammar_masks):
                allowed = allowed_ids(mask, VOCAB).nonzero()[0]
                assert len(allowed) == 1
                self.forced[batch.rids[row]] = int(allowed[0])
        return super().handle(msg)

    def _sample(self, rid: str) -> int:
        token = self.forced.get(rid, self.choose(rid, len(self.sampled[rid])))
        self.sampled[rid].append(token)
        return token


def serve(cases: dict[str, tuple[list[int], int, bool]], max_new=8, overlap=True):
    """Run requests rid -> (script, budget, inside) to the end; returns (outputs, loop)."""
    out = ListOutbox()
    worker = MaskingWorker({rid: script for rid, (script, _, _) in cases.items()})
    out.fake_worker = worker
    sched = Scheduler(out, max_running_requests=8, max_prefill_tokens=1024, detokenizers=1, vocab_size=VOCAB)
    for rid, (_, budget, inside) in cases.items():
        sched.add_request(
            GenerateReq(
                rid,
                [3, 4, 5],
                max_new,
                SamplingParams(temperature=0.0),
                DetokParams(),
                [EOS],
                reasoning_budget=ReasoningBudget(budget, OPEN, CLOSE, inside),
            )
        )
    loop = Loop(sched, out, worker, overlap=overlap)
    loop.run()
    assert not out.tokenizer
    return {rid: worker.sampled[rid][:max_new] for rid in cases}, loop  # a chained step may run past the end


CASES = {
    # prompt opened the block: W W W, then the tag is forced, then the answer
    "inside-3": (([W] * 8, 3, True), [W, W, W, *CLOSE, W, W, W]),
    "inside-0": (([W] * 8, 0, True), [*CLOSE, W, W, W, W, W, W]),
    # the model opens it (after a leading token), counting starts after the tag
    "opens-2": (([7, 8] + [W] * 6, 2, False), [7, 8, W, W, *CLOSE, W, W]),
    "lead-opens-1": (([30, 7, 8] + [W] * 5, 1, False), [30, 7, 8, W, *CLOSE, W, W]),
    "opens-0": (([7, 8] + [W] * 6, 0, False), [7, 8, *CLOSE, W, W, W, W]),
    # the model closes the block itself, or never opens one: untouched
    "closes-itself": (([W, 9, 11] + [W] * 5, 3, True), [W, 9, 11, W, W, W, W, W]),
    "never-opens": (([W] * 8, 0, False), [W] * 8),
    # the model began the tag when the budget ran out: it is finished, not begun again
    "half-tag": (([W, 9, W] + [W] * 5, 2, True), [W, 9, 11, W, W, W, W, W]),
    # a second block is content: no budget applies to it
    "second-block": (([W, *CLOSE, 7, 8, W, W, W], 1, True), [W, *CLOSE, 7, 8, W, W, W]),
}


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "plain"])
def test_the_closing_tag_is_forced_after_the_budget(overlap):
    got, loop = serve({rid: spec for rid, (spec, _) in CASES.items()}, overlap=overlap)
    assert got == {rid: want for rid, (_, want) in CASES.items()}
    if overlap:
        assert loop.chained > 0  # the steps that cannot be forced still chain


def test_a_lone_budget_row_chains_except_around_its_forced_steps():
    _, loop = serve({"r": ([W] * 12, 4, True)}, max_new=12)
    # positions 0 (the prefill) .. 11, and one chained past the end: launched as without a
    # budget, the prefill and position 1; besides, those forced: CLOSE[0] (4) and CLOSE[1] (5)
    assert loop.launched == 4 and loop.chained == 9


def test_budgets_are_refused_with_a_grammar_or_without_a_vocab_size():
    out = ListOutbox()
    budget = ReasoningBudget(2, OPEN, CLOSE)
    for vocab, grammar in ((VOCAB, GrammarSpec(GrammarKind.REGEX, "a")), (0, None), (8, None)):
        sched = Scheduler(
            out, max_running_requests=2, max_prefill_tokens=64, detokenizers=1, vocab_size=vocab, grammar=object()
        )
        sched.add_request(
            GenerateReq("r", [3], 4, SamplingParams(), DetokParams(), [EOS], grammar=grammar, reasoning_budget=budget)
        )
        err = out.tokenizer.pop()
        assert isinstance(err, ReqError) and err.status == 400 and not sched.reqs
    assert "structured output" in out.sent[0][2].message
