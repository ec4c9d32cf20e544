"""Running `worker_proc.model.runner.ModelRunner` in this process on the loaded model:
greedy parameters, the prompts of the worker tests and their ids (`prompt_ids`, a fixture
registered by tests/e2e/real/conftest.py), batches prefilled and decoded to EOS (`run_batch`),
launches collected rid by rid (`Collector`, `decode_all`), rows run with their
logprobs and grammar masks (`run`), and rows decoded by TARGET_VERIFY launches with the
drafts a test chooses (`spec_run`)."""

from __future__ import annotations

import pytest

from protocol.enums import ForwardMode
from protocol.messages import ForwardBatch, SamplingParams
from worker_proc.model.runner import ModelRunner

EOS = 2
GREEDY = SamplingParams(temperature=0.0)
PROMPTS = [
    "What is the capital of France?",
    "Explain why the sky is blue in three sentences.",
    "Write a haiku about the sea.",
]


@pytest.fixture(scope="module")
def prompt_ids(tokenizer):
    return [
        tokenizer.encode(
            tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True),
            add_special_tokens=False,
        )
        for p in PROMPTS
    ]


def extend(rids: list[str], prompts: list[list[int]], params: list[SamplingParams] | None = None) -> ForwardBatch:
    """An EXTEND batch of whole prompts."""
    return ForwardBatch(rids, prompts, params or [GREEDY] * len(rids), [True] * len(rids))


def run_batch(
    runner: ModelRunner,
    rids: list[str],
    prompts: list[list[int]],
    max_tokens: int,
    params: list[SamplingParams] | None = None,
    launch_id: int = 1,
) -> dict[str, list[int]]:
    """Prefill `prompts` together, then decode until each hits EOS or max_tokens (dropping
    finished rows as the scheduler does)."""
    params = params or [GREEDY] * len(rids)
    runner.launch(launch_id, ForwardMode.EXTEND, extend(rids, prompts, params))
    got, toks = runner.finalize(launch_id)
    out = {r: [t] for r, t in zip(got, toks)}
    while True:
        done = [r for r in runner.batch.rids if out[r][-1] == EOS or len(out[r]) >= max_tokens]
        runner.abort(done)
        if not runner.batch.rids:
            return out
        launch_id += 1
        runner.launch(launch_id, ForwardMode.DECODE, ForwardBatch(list(runner.batch.rids)))
        got, toks = runner.finalize(launch_id)
        for r, t in zip(got, toks):
            out[r].append(t)


class Collector:
    """Runs launches on `runner` with fresh launch ids, finalizes each, and collects every
    rid's tokens in `out` (rid -> tokens in order; a non-final chunk's -1 left out) and,
    for rows that ask for logprobs, each token's logprob in `lps`."""

    def __init__(self, runner: ModelRunner) -> None:
        self.runner, self.out, self.lps, self.lid = runner, {}, {}, 0

    def __call__(self, mode: ForwardMode, batch: ForwardBatch) -> None:
        self.lid += 1
        self.runner.launch(self.lid, mode, batch)
        rids, tokens = self.runner.finalize(self.lid)
        logprobs = self.runner.last_logprobs[0] or [None] * len(rids)
        for r, t, lp in zip(rids, tokens, logprobs):
            if t >= 0:
                self.out.setdefault(r, []).append(t)
                if lp is not None:
                    self.lps.setdefault(r, []).append(lp.logprobs[0])


def decode_all(runner: ModelRunner, out: dict[str, list[int]], until: int, launch_id: int) -> int:
    while any(len(v) < until for v in out.values()):
        runner.launch(launch_id, ForwardMode.DECODE, ForwardBatch(list(runner.batch.rids)))
        for r, t in zip(*runner.finalize(launch_id)):
            out[r].append(t)
        launch_id += 1
    return launch_id


def run(
    runner: ModelRunner,
    rows: dict[str, list[int]],
    params: dict[str, SamplingParams],
    steps: int,
    grammar: dict[str, bytes] | None = None,
):
    """Prefill `rows` together then decode `steps` times; returns (tokens, output logprobs)
    per rid (rows are never dropped)."""
    rids = list(rows)
    g = grammar or {}
    g_rows = [i for i, r in enumerate(rids) if r in g]
    runner.launch(
        1,
        ForwardMode.EXTEND,
        ForwardBatch(
            rids,
            [rows[r] for r in rids],
            [params[r] for r in rids],
            [True] * len(rids),
            grammar_rows=g_rows,
            grammar_masks=[g[rids[i]] for i in g_rows],
        ),
    )
    toks = {r: [] for r in rids}
    lps = {r: [] for r in rids}
    for lid in range(1, steps + 1):
        if lid > 1:
            runner.launch(
                lid,
                ForwardMode.DECODE,
                ForwardBatch(rids, grammar_rows=g_rows, grammar_masks=[g[rids[i]] for i in g_rows]),
            )
        got, ids = runner.finalize(lid)
        out_lp = runner.last_logprobs[0]
        for i, (r, t) in enumerate(zip(got, ids)):
            toks[r].append(t)
            lps[r].append(out_lp[i] if out_lp else None)
    return toks, lps


SEEDED = SamplingParams(temperature=0.8, top_p=0.9, seed=7)


def drive(runner: ModelRunner, prompts: list[list[int]], steps: int) -> dict[str, list[int]]:
    """a prefills; b and c join after 3 steps (c seeded); a leaves after 8 steps; then d
    prefills in a MIXED launch beside b and c; decode `steps` in all."""
    launch = Collector(runner)
    launch(ForwardMode.EXTEND, extend(["a"], [prompts[0]]))
    for step in range(steps):
        if step == 3:
            launch(ForwardMode.EXTEND, extend(["b", "c"], prompts[1:3], [GREEDY, SEEDED]))
        if step == 8:
            runner.abort(["a"])
        if step == 10:
            rids = list(runner.batch.rids)
            launch(
                ForwardMode.MIXED,
                ForwardBatch(
                    rids + ["d"],
                    [[]] * len(rids) + [prompts[0][:20]],
                    [None] * len(rids) + [GREEDY],
                    [True] * (len(rids) + 1),
                ),
            )
        launch(ForwardMode.DECODE, ForwardBatch(list(runner.batch.rids)))
    return launch.out


LOGPROB_GREEDY = SamplingParams(temperature=0.0, top_logprobs=0)
"""Greedy, with each token's logprob (to compare closely with the reference loop)."""


def leave_and_join(
    runner: ModelRunner, prompts: tuple[list[int], list[int], list[int]], cuts: list[int], steps: int, after_step=None
) -> tuple[dict[str, list[int]], dict[str, list[float]]]:
    """The flow the architecture tests run against mlx-lm's own loop: a and b (`prompts`,
    unequal) prefilled together (right-padded), three decodes, the last two chained; a leaves; c comes in
    chunks cut at positions `cuts` (each a non-final EXTEND), its last chunk in a MIXED launch
    beside b's decode, taking a's free row; then `steps` decodes, calling ``after_step()``
    after each. Returns (tokens, logprobs) by rid. Asserts that c took a's row."""
    launch = Collector(runner)
    a, b, c = prompts
    launch(ForwardMode.EXTEND, ForwardBatch(["a", "b"], [a, b], [LOGPROB_GREEDY] * 2, [True, True]))
    launch(ForwardMode.DECODE, ForwardBatch(["a", "b"]))
    runner.launch(launch.lid + 1, ForwardMode.DECODE, ForwardBatch(["a", "b"]))
    runner.chain_decode(launch.lid + 2, launch.lid + 1)
    for lid in (launch.lid + 1, launch.lid + 2):
        rids, tokens = runner.finalize(lid)
        for r, t, lp in zip(rids, tokens, runner.last_logprobs[0]):
            launch.out[r].append(t)
            launch.lps[r].append(lp.logprobs[0])
    launch.lid += 2
    runner.abort(["a"])
    start = 0
    for cut in cuts:
        launch(ForwardMode.EXTEND, ForwardBatch(["c"], [c[start:cut]], [LOGPROB_GREEDY], [False]))
        start = cut
    launch(ForwardMode.MIXED, ForwardBatch(["b", "c"], [[], c[start:]], [None, None], [True, True]))
    assert runner.batch.slots == [1, 0]  # c was written into a's row
    for _ in range(steps):
        launch(ForwardMode.DECODE, ForwardBatch(list(runner.batch.rids)))
        if after_step is not None:
            after_step()
    assert len(launch.out["a"]) == 4 and len(launch.out["c"]) == steps + 1
    return launch.out, launch.lps


def assert_reference(
    model, out: dict[str, list[int]], lps: dict[str, list[float]], prompts: dict[str, list[int]], tol: float
) -> None:
    """Each rid's tokens equal mlx-lm's own greedy loop over its prompt, and its logprobs
    within `tol` of that loop's."""
    from tests.support.hybrid_reference import reference

    for rid, ids in prompts.items():
        ref_lps: list[float] = []
        assert out[rid] == reference(model, ids, len(out[rid]), ref_lps), rid
        assert lps[rid] == pytest.approx(ref_lps, abs=tol), rid


def assert_captured_as_uncompiled(loaded, tokenizer) -> None:
    """`drive` with a `DecodeGraph` (batches up to 8) gives the uncompiled runner's tokens
    through joins, a leave and a MIXED launch (greedy and seeded rows), 16 captured steps."""
    from worker_proc.model.decode_graph import DecodeGraph

    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    plain = drive(ModelRunner(loaded), prompts, 16)
    graph = DecodeGraph(loaded.model, 8)
    assert drive(ModelRunner(loaded, graph=graph), prompts, 16) == plain
    assert graph.replays == 16 and len(plain["a"]) == 9 and len(plain["d"]) == 7


def spec_run(runner, rids, prompts, params, max_tokens, draft):
    """Prefill, then TARGET_VERIFY launches until every row has `max_tokens` or an EOS;
    draft(rid, tokens so far, step) -> its draft. Rows are dropped as they end."""
    runner.launch(1, ForwardMode.EXTEND, extend(rids, prompts, params))
    got, toks = runner.finalize(1)
    out = {r: [t] for r, t in zip(got, toks)}
    lid = 1
    while True:
        runner.abort([r for r in runner.batch.rids if EOS in out[r] or len(out[r]) >= max_tokens])
        if not runner.batch.rids:
            break
        lid += 1
        live = list(runner.batch.rids)
        runner.launch(
            lid, ForwardMode.TARGET_VERIFY, ForwardBatch(live, draft_ids=[draft(r, out[r], lid) for r in live])
        )
        got, toks = runner.finalize(lid)
        more = runner.last_more or [[] for _ in got]
        for r, t, m in zip(got, toks, more):
            out[r] += [t, *m]
    return {r: _cut(v, max_tokens) for r, v in out.items()}


def _cut(tokens, n):
    tokens = tokens[:n]
    return tokens[: tokens.index(EOS) + 1] if EOS in tokens else tokens
