"""The scheduler's side of per-request output control (issue: logprobs, n > 1, grammars,
penalties): prompt-logprob prefix limits, held requests (grammar compiling, n > 1 groups),
grammar masks and finishes, no chaining under a grammar, and logprob columns to the
detokenizer. Driven without sockets or MLX."""

from __future__ import annotations

from concurrent.futures import Future

from protocol.enums import FinishReason, ForwardMode, GrammarKind, ReqField
from protocol.messages import (
    BatchTokenOut,
    DetokParams,
    Finalize,
    GenerateReq,
    GrammarSpec,
    LaunchResult,
    ReqError,
    SamplingParams,
    StoreKV,
    TokenLogprobs,
)
from scheduler_proc.mem.kv_memory import KVMemory
from scheduler_proc.scheduler import Scheduler
from tests.support.sim_worker import FakeWorker, ListOutbox

EOS = 2
PROMPT = list(range(10, 30))


class FakeMatcher:
    """Allows only token 5 then 6, then terminates; records what it accepted. dead_end:
    `next_mask` allows nothing once it accepted a token of `dead_after` (none by default)."""

    dead_after: tuple[int, ...] = ()

    def __init__(self) -> None:
        self.accepted: list[int] = []
        self.dead_end = False

    def accept(self, token: int) -> bool:
        self.accepted.append(token)
        return token in (5, 6)

    @property
    def terminated(self) -> bool:
        return self.accepted[-2:] == [5, 6]

    def next_mask(self) -> bytes:
        self.dead_end = bool(set(self.accepted) & set(self.dead_after))
        return bytes(4) if self.dead_end else bytes([len(self.accepted)]) * 4


class FakeGrammar:
    """A backend whose compiles finish when the test says so (or fail)."""

    def __init__(self) -> None:
        self.futures: list[Future] = []

    def submit(self, spec: GrammarSpec) -> Future:
        fut: Future = Future()
        self.futures.append(fut)
        return fut

    def matcher(self, compiled) -> FakeMatcher:
        assert compiled == "compiled"
        return FakeMatcher()


class CachingWorker(FakeWorker):
    """The fake worker, also taking the StoreKV messages a radix cache sends."""

    def handle(self, msg):
        return None if isinstance(msg, StoreKV) else super().handle(msg)


def make(radix=False, grammar=None, manual=False):
    out = ListOutbox()
    worker = CachingWorker()
    if not manual:
        out.fake_worker = worker
    mem = KVMemory(4096, 9, 1024, radix=radix)
    sched = Scheduler(out, max_running_requests=8, max_prefill_tokens=1024, detokenizers=1, memory=mem, grammar=grammar)
    return sched, out


def gen(rid, prompt=PROMPT, max_new=4, group="", grammar=None, **sampling) -> GenerateReq:
    return GenerateReq(
        rid,
        list(prompt),
        max_new,
        SamplingParams(temperature=0.0, **sampling),
        DetokParams(),
        [EOS],
        [],
        grammar,
        group,
    )


def run(sched, out, limit=100):
    for _ in range(limit):
        batch = sched.next_batch()
        if batch is None:
            return
        out.to_worker(sched.launch(batch))
        out.to_worker(Finalize(batch.launch_id))
        sched.process_result(batch, out.results.popleft())
    raise AssertionError("never idle")


def test_prompt_logprobs_limit_the_cached_prefix():
    sched, out = make(radix=True)
    sched.add_request(gen("warm"))
    run(sched, out)
    sched.add_request(gen("hit"))
    sched.add_request(gen("asks", logprob_start_len=5))
    sched.add_request(gen("asks0", logprob_start_len=0))
    batch = sched.next_batch()
    prefix = {r.rid: r.kv.prefix_len for r in batch.reqs}
    assert prefix == {"hit": len(PROMPT) - 1, "asks": 4, "asks0": 0}


def test_group_choices_wait_for_the_leaders_prefill_then_hit_the_cache():
    sched, out = make(radix=True)
    sched.add_request(gen("r-0"))
    sched.add_request(gen("r-1", group="r-0"))
    sched.add_request(gen("r-2", group="r-0"))
    first = sched.next_batch()
    assert [r.rid for r in first.reqs] == ["r-0"] and [r.rid for r in sched.held] == ["r-1", "r-2"]
    out.to_worker(sched.launch(first))
    out.to_worker(Finalize(first.launch_id))
    sched.process_result(first, out.results.popleft())
    second = sched.next_batch()
    assert second.mode == ForwardMode.EXTEND and [r.rid for r in second.reqs] == ["r-1", "r-2"]
    assert [r.kv.prefix_len for r in second.reqs] == [len(PROMPT) - 1] * 2


def test_a_group_whose_leader_is_gone_is_not_held():
    sched, out = make()
    sched.add_request(gen("r-1", group="r-0"))
    assert [r.rid for r in sched.next_batch().reqs] == ["r-1"]


def test_grammar_requests_wait_for_their_compile_without_blocking_others():
    backend = FakeGrammar()
    sched, out = make(grammar=backend)
    sched.add_request(gen("g", grammar=GrammarSpec(GrammarKind.REGEX, "56")))
    sched.add_request(gen("plain"))
    batch = sched.next_batch()
    assert [r.rid for r in batch.reqs] == ["plain"]
    assert batch.to_forward_batch().grammar_rows == []


def test_grammar_masks_go_with_each_step_finish_on_termination_and_never_chain():
    backend = FakeGrammar()
    sched, out = make(grammar=backend, manual=True)
    sched.add_request(gen("g", max_new=10, grammar=GrammarSpec(GrammarKind.REGEX, "56")))
    assert sched.next_batch() is None
    backend.futures[0].set_result("compiled")
    batch = sched.next_batch()
    fb = batch.to_forward_batch()
    assert fb.grammar_rows == [0] and fb.grammar_masks == [bytes([0]) * 4]
    sched.launch(batch)
    sched.process_result(batch, LaunchResult(batch.launch_id, ["g"], [5]))
    assert not sched.can_chain(batch)
    dec = sched.next_batch()
    assert dec.mode == ForwardMode.DECODE
    assert dec.to_forward_batch().grammar_rows == [0] and dec.to_forward_batch().grammar_masks == [bytes([1]) * 4]
    sched.launch(dec)
    assert not sched.can_chain(dec)
    sched.process_result(dec, LaunchResult(dec.launch_id, ["g"], [6]))
    rows = [m for m in out.detok[0] if isinstance(m, BatchTokenOut)]
    assert rows[-1].finish_reasons == [FinishReason.STOP] and rows[-1].new_token_ids == [[6]]


def test_a_grammar_at_a_dead_end_fails_its_request_with_a_400(monkeypatch):
    """A mask that allows no token (the grammar can neither go on nor end: a part of it
    matches no text) fails the request with a 400 about the grammar field; the token sampled
    under it is not shown. The request ended "stop" with its output cut there."""
    monkeypatch.setattr(FakeMatcher, "dead_after", (5,))
    backend = FakeGrammar()
    sched, out = make(grammar=backend, manual=True)
    sched.add_request(gen("g", max_new=10, grammar=GrammarSpec(GrammarKind.REGEX, "5[^\\s\\S]")))
    sched.add_request(gen("plain", max_new=10))
    for rid, token in (("plain", 40), ("g", 5)):  # each one's prefill
        if rid == "g":
            backend.futures[0].set_result("compiled")
        batch = sched.next_batch()
        assert [r.rid for r in batch.reqs] == [rid]
        sched.launch(batch)
        sched.process_result(batch, LaunchResult(batch.launch_id, [rid], [token]))
    dec = sched.next_batch()
    assert [r.rid for r in dec.reqs] == ["plain", "g"] and dec.to_forward_batch().grammar_masks == [bytes(4)]
    sched.launch(dec)
    sched.process_result(
        dec, LaunchResult(dec.launch_id, [r.rid for r in dec.reqs], [0 if r.rid == "g" else 40 for r in dec.reqs])
    )
    errs = [m for m in out.tokenizer if isinstance(m, ReqError)]
    assert [(e.rid, e.status, e.field) for e in errs] == [("g", 400, ReqField.GRAMMAR)]
    assert errs[0].message.startswith(
        "structured output cannot go on: after 1 output tokens the grammar allows no "
        "next token and the output is not complete"
    )
    shown = [
        (rid, ids) for m in out.detok[0] if isinstance(m, BatchTokenOut) for rid, ids in zip(m.rids, m.new_token_ids)
    ]
    assert ("g", [0]) not in shown and ("g", [5]) in shown
    assert [r.rid for r in sched.running] == ["plain"] and "g" not in sched.reqs
    sched.mem.check()


def test_a_failed_compile_is_a_400_and_the_request_ends():
    backend = FakeGrammar()
    sched, out = make(grammar=backend)
    sched.add_request(gen("g", grammar=GrammarSpec(GrammarKind.EBNF, "bad")))
    backend.futures[0].set_exception(ValueError("no root rule"))
    assert sched.next_batch() is None
    err = [m for m in out.tokenizer if isinstance(m, ReqError)]
    assert err and err[0].status == 400 and "no root rule" in err[0].message
    assert not sched.reqs and not sched.held


def test_without_a_backend_grammar_requests_get_a_400():
    sched, out = make()
    sched.add_request(gen("g", grammar=GrammarSpec(GrammarKind.JSON_OBJECT)))
    assert [m.status for m in out.tokenizer if isinstance(m, ReqError)] == [400]


def lp(token: int, value: float) -> TokenLogprobs:
    return TokenLogprobs([token], [value], [[token]], [[value]])


def test_logprob_columns_reach_the_detokenizer_and_carry_the_eos():
    """The ending EOS is not rendered (no id in the row) but counts in usage, so its logprob
    entry goes out (issue 44: entries == completion_tokens at every finish)."""
    sched, out = make(manual=True)
    sched.add_request(gen("a", max_new=5, top_logprobs=1, logprob_start_len=1))
    sched.add_request(gen("b", max_new=5))
    batch = sched.next_batch()
    sched.launch(batch)
    prompt_lp = TokenLogprobs(PROMPT[1:], [-1.0] * (len(PROMPT) - 1))
    sched.process_result(
        batch, LaunchResult(batch.launch_id, ["a", "b"], [40, 41], "", [lp(40, -0.5), None], [prompt_lp, None])
    )
    dec = sched.next_batch()
    sched.launch(dec)
    sched.process_result(dec, LaunchResult(dec.launch_id, ["a", "b"], [EOS, 42], "", [lp(EOS, -0.1), None]))
    msgs = [m for m in out.detok[0] if isinstance(m, BatchTokenOut)]
    first, second = msgs[0], msgs[1]
    assert first.rids == ["a", "b"] and first.logprobs == [lp(40, -0.5), None]
    assert first.prompt_logprobs == [prompt_lp, None] and first.logprob_starts == [0, 0]
    assert second.new_token_ids == [[], [42]] and second.logprobs == [lp(EOS, -0.1), None]
    assert (
        second.logprob_starts == [1, 0] and second.completion_tokens[0] == 2 and second.prompt_logprobs == [None, None]
    )
    assert second.finish_reasons[0] == FinishReason.STOP


def test_a_reseeded_replica_gets_every_logprob_again():
    sched, out = make(manual=True)
    sched.add_request(gen("a", max_new=5, top_logprobs=0))
    batch = sched.next_batch()
    sched.launch(batch)
    sched.process_result(batch, LaunchResult(batch.launch_id, ["a"], [40], "", [lp(40, -0.5)]))
    dec = sched.next_batch()
    sched.launch(dec)
    sched.process_result(dec, LaunchResult(dec.launch_id, ["a"], [41], "", [lp(41, -0.25)]))
    out.detok[0].clear()
    rec = sched.detok.records["a"]
    sched.detok._place(rec, sched.detok.replicas.get(0))
    replay = [m for m in out.detok[0] if isinstance(m, BatchTokenOut)][0]
    assert replay.new_token_ids == [[40, 41]] and replay.logprob_starts == [0]
    assert replay.logprobs[0].token_ids == [40, 41] and replay.logprobs[0].logprobs == [-0.5, -0.25]


def test_penalized_rows_send_their_cached_prefix_ids_and_retracted_rows_their_output_count():
    sched, out = make(radix=True)
    sched.add_request(gen("warm"))
    run(sched, out)
    sched.add_request(gen("pen", frequency_penalty=0.5))
    fb = sched.next_batch().to_forward_batch()
    assert fb.prefix_ids == [PROMPT[:-1]] and fb.num_generated == []


def test_custom_processor_rows_are_checked_by_name_and_never_chain():
    out = ListOutbox()
    out.fake_worker = CachingWorker()
    sched = Scheduler(
        out, max_running_requests=8, max_prefill_tokens=1024, detokenizers=1, logit_processors=frozenset({"no_digits"})
    )
    sched.add_request(gen("bad", logit_processor="nope"))
    assert [(m.rid, m.status) for m in out.tokenizer if isinstance(m, ReqError)] == [("bad", 400)]
    sched.add_request(gen("p", max_new=6, logit_processor="no_digits", logit_processor_args='{"x": 1}'))
    batch = sched.next_batch()
    out.to_worker(sched.launch(batch))
    out.to_worker(Finalize(batch.launch_id))
    sched.process_result(batch, out.results.popleft())
    dec = sched.next_batch()
    sched.launch(dec)
    assert dec.mode == ForwardMode.DECODE and not sched.can_chain(dec)


def test_an_unknown_custom_processor_is_a_400_naming_the_field(tmp_path):
    """The scheduler, which alone knows the loaded processors, names the field it refuses
    (`ReqField`), and the tokenizer hands that on for the route to name (it was null)."""
    import asyncio

    from tokenizer_proc.errors import FieldError
    from tokenizer_proc.link.receipt import Receipt
    from tokenizer_proc.link.tokenizer_manager import TokenizerManager

    out = ListOutbox()
    sched = Scheduler(
        out, max_running_requests=8, max_prefill_tokens=1024, detokenizers=1, logit_processors=frozenset({"no_digits"})
    )
    sched.add_request(gen("bad", logit_processor="nope"))
    (err,) = [m for m in out.tokenizer if isinstance(m, ReqError)]
    assert (err.status, err.field) == (400, ReqField.LOGIT_PROCESSOR) and "['no_digits']" in err.message

    async def answer() -> object:
        mgr = TokenizerManager(str(tmp_path), log=None)
        try:
            q: asyncio.Queue = asyncio.Queue()
            mgr.queues["bad"], mgr.receipts["bad"] = q, Receipt()
            mgr._error(err)
            return q.get_nowait()
        finally:
            mgr.close()

    api_error = asyncio.run(answer())
    assert isinstance(api_error, FieldError) and (api_error.status, api_error.field) == (400, ReqField.LOGIT_PROCESSOR)
    named = api_error.named("custom_logit_processor")
    assert (named.param, named.message) == ("custom_logit_processor", f"custom_logit_processor: {err.message}")


def test_a_prompt_scoring_request_with_no_output_tokens_prefills_then_ends_and_caches_its_prompt():
    sched, out = make(radix=True)
    sched.add_request(gen("echo", max_new=0, top_logprobs=1, logprob_start_len=0))
    run(sched, out)
    rows = [m for m in out.detok[0] if isinstance(m, BatchTokenOut)]
    assert rows[-1].new_token_ids == [[]] and rows[-1].completion_tokens == [0]
    assert rows[-1].finish_reasons == [FinishReason.LENGTH]
    assert sched.mem.radix.total_size == len(PROMPT)
    sched.mem.check()


def test_a_row_error_fails_only_its_request():
    """A row whose custom processor failed (the request chose it) is a 400 about the
    ``custom_logit_processor`` field, carrying the worker's message; the other row goes on."""
    sched, out = make(manual=True)
    sched.add_request(gen("bad", max_new=5))
    sched.add_request(gen("ok", max_new=5))
    batch = sched.next_batch()
    sched.launch(batch)
    message = "custom logit processor 'boom' failed: RuntimeError: x"
    sched.process_result(batch, LaunchResult(batch.launch_id, ["bad", "ok"], [40, 41], "", [], [], [message, ""]))
    errs = [m for m in out.tokenizer if isinstance(m, ReqError)]
    assert [(e.rid, e.status, e.field, e.message) for e in errs] == [("bad", 400, ReqField.LOGIT_PROCESSOR, message)]
    assert [r.rid for r in sched.running] == ["ok"]
    sched.mem.check()
