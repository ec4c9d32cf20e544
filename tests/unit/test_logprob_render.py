"""Unit tests of logprob rendering in the detokenizer (`LogprobRenderer`, `TokenPieces`, the
`DetokenizerManager` rows) and of their receipt in the HTTP process (`Receipt`,
`TokenizerManager._text`), with the real SmolLM2 tokenizer."""

from __future__ import annotations

import asyncio

import pytest

from detokenizer_proc.manager import DetokenizerManager
from protocol.enums import FinishReason
from protocol.messages import BatchStrOut, BatchTokenOut, DetokParams, DetokSeed, LogprobEntries, TokenLogprobs
from text.logprob_render import LogprobRenderer
from text.token_pieces import TokenPieces
from tokenizer_proc.link.receipt import Receipt, TextGap

IM_END = 2
TEXT = "Hi 🌶️🍣 and 日本語, café ✓ 👍🏽!"


@pytest.fixture(scope="module")
def tok():
    from protocol.model_source import resolve_model
    from text.hf_tokenizer import load_tokenizer

    return load_tokenizer(resolve_model(None))


@pytest.fixture(scope="module")
def pieces(tok):
    return TokenPieces(tok)


def enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def columns(ids: list[int], k: int = 0) -> TokenLogprobs:
    """Logprob columns for `ids`: logprob -(j+1)/10 at j; top k = the token then ids 5, 6, ..."""
    lps = [-(j + 1) / 10 for j in range(len(ids))]
    if not k:
        return TokenLogprobs(ids, lps)
    top = [[t] + list(range(5, 4 + k)) for t in ids]
    return TokenLogprobs(ids, lps, top, [[lp] + [float("-inf")] * (k - 1) for lp in lps])


# ---------------------------------------------------------------- TokenPieces
def test_pieces_bytes_of_split_emoji(tok, pieces):
    ids = enc(tok, "🍣")
    assert len(ids) > 1 and tok.decode(ids[:1]) == "\ufffd"
    assert b"".join(pieces.raw(i) for i in ids) == "🍣".encode()
    assert pieces.text(ids[0]) == "\ufffd"
    assert pieces.raw(IM_END) == b"<|im_end|>" and pieces.text(IM_END) == "<|im_end|>"
    assert pieces.raw(enc(tok, " café")[0]) == " café".encode()[: len(pieces.raw(enc(tok, " café")[0]))]


# ---------------------------------------------------------------- LogprobRenderer
@pytest.mark.parametrize("step", [1, 3, 100])
def test_entries_concatenate_to_text_and_bytes(tok, pieces, step):
    """Emoji and CJK split across tokens: tokens join to the text, bytes to its UTF-8, "" for
    a token that ends inside a character and the whole character on the one that completes it,
    however the scheduler batches the tokens."""
    ids = enc(tok, TEXT)
    r = LogprobRenderer(tok, pieces, enc(tok, "Say:"))
    full = columns(ids)
    got = [r.render(TokenLogprobs(ids[i : i + step], full.logprobs[i : i + step]), i) for i in range(0, len(ids), step)]
    assert [e.start for e in got] == list(range(0, len(ids), step))
    tokens = [t for e in got for t in e.tokens]
    assert "".join(tokens) == TEXT
    assert b"".join(b for e in got for b in e.token_bytes) == TEXT.encode()
    assert "" in tokens and "🍣" in tokens and "\ufffd" not in "".join(tokens)
    assert [lp for e in got for lp in e.logprobs] == columns(ids).logprobs
    assert [t for e in got for t in e.token_ids] == ids


def test_top_alternatives_decoded_alone(tok, pieces):
    ids = enc(tok, "🍣 ok")
    e = LogprobRenderer(tok, pieces, []).render(columns(ids, k=2), 0)
    assert e.top_ids == [[t, 5] for t in ids]
    assert e.top_tokens[0] == ["\ufffd", "<file_sep>"]
    assert e.top_bytes[0] == [pieces.raw(ids[0]), b"<file_sep>"]
    assert e.top_logprobs[0] == [-0.1, float("-inf")]


@pytest.mark.parametrize(("skip", "last"), [(True, ("", b"")), (False, ("<|im_end|>", b"<|im_end|>"))])
def test_special_tokens_follow_skip_special_tokens(tok, pieces, skip, last):
    ids = enc(tok, "Hi") + [IM_END]
    e = LogprobRenderer(tok, pieces, [], skip_special_tokens=skip).render(columns(ids), 0)
    assert (e.tokens[-1], e.token_bytes[-1]) == last


def test_final_flush_goes_to_the_last_entry(tok, pieces):
    ids = enc(tok, "ok 🍣")[:-1]  # the emoji's last byte never comes
    e = LogprobRenderer(tok, pieces, []).render(columns(ids), 0, final=True)
    assert e.tokens[-1].endswith("\ufffd") and "".join(e.tokens).startswith("ok ")


def test_prompt_entries_complete_a_character_the_context_began(tok, pieces):
    """Prompt entries from position 1 when token 0 is half an emoji: the HTTP side's head entry
    (rendered alone) is "", the first scored token carries the whole emoji."""
    ids = enc(tok, "🍣 sushi")
    head = LogprobRenderer(tok, pieces, []).render(columns(ids[:1]), 0)
    rest = LogprobRenderer(tok, pieces, ids[:1], complete_context=True).render(columns(ids[1:]), 0)
    assert head.tokens == [""]
    assert "".join(head.tokens + rest.tokens) == "🍣 sushi"
    assert b"".join(head.token_bytes + rest.token_bytes) == "🍣 sushi".encode()


# ---------------------------------------------------------------- DetokenizerManager rows
def seeded(tok, rid: str = "r", chars_sent: int = 0, **params) -> DetokenizerManager:
    mgr = DetokenizerManager(tok)
    mgr.seed(DetokSeed(rid, DetokParams(**params), 5, 0, chars_sent))
    return mgr


def test_manager_sends_entries_with_their_text(tok):
    """Entries travel in the row of the text their tokens made; the prompt's come once, in
    the context of logprob_context_ids; the EOS that ends the request has none."""
    ids = enc(tok, "one 🍣 two")
    prompt = enc(tok, "Count:")
    mgr = seeded(tok, prompt_tail_ids=prompt, logprob_context_ids=prompt[:1])
    first, _ = mgr.tokens(
        BatchTokenOut(["r"], [ids[:3]], [3], [None], [None], [columns(ids[:3], 1)], [columns(prompt[1:])], [0])
    )
    assert first.logprobs[0].start == 0 and first.logprobs[0].token_ids == ids[:3]
    assert "".join(first.prompt_logprobs[0].tokens) == tok.decode(prompt[1:])
    last, _ = mgr.tokens(
        BatchTokenOut(["r"], [ids[3:]], [len(ids) + 1], [FinishReason.STOP], [IM_END], [columns(ids[3:], 1)], [], [3])
    )
    assert last.logprobs[0].start == 3 and last.prompt_logprobs == []
    text = first.text_deltas[0] + last.text_deltas[0]
    assert text == "one 🍣 two" == "".join(tokens_of([first.logprobs[0], last.logprobs[0]]))


def tokens_of(entries: list[LogprobEntries]) -> list[str]:
    return [t for e in entries for t in e.tokens]


def test_manager_without_logprobs_sends_no_columns(tok):
    mgr = seeded(tok)
    out, _ = mgr.tokens(BatchTokenOut(["r"], [enc(tok, "hi")], [1], [None]))
    assert out.logprobs == [] and out.prompt_logprobs == []
    assert mgr.states["r"].logprobs is None


def test_manager_mixed_batch_has_none_for_rows_without(tok):
    mgr = seeded(tok, "a")
    mgr.seed(DetokSeed("b", DetokParams(), 5))
    ids = enc(tok, "hi there")
    out, _ = mgr.tokens(
        BatchTokenOut(["a", "b"], [ids, ids], [2, 2], [None, None], [], [None, columns(ids)], [], [0, 0])
    )
    assert out.logprobs[0] is None
    assert "".join(out.logprobs[1].tokens) == "hi there"


def test_reseed_resends_entries_and_receipt_takes_each_once(tok):
    """Replica A sent entries 0..k-1 and died; B is re-seeded and sent every token and entry
    from 0 again; the HTTP side keeps only the entries past those it has, in order."""
    ids = enc(tok, TEXT)
    receipt, got = Receipt(), []
    a = seeded(tok)
    k = 5
    for j in range(k):
        out, _ = a.tokens(BatchTokenOut(["r"], [[ids[j]]], [j + 1], [None], [], [columns([ids[j]])], [], [j]))
        got.append(receipt.accept_entries(out.logprobs[0]))
    chars = len("".join(e.tokens[0] for e in got))
    b = seeded(tok, chars_sent=chars)
    out, _ = b.tokens(BatchTokenOut(["r"], [ids], [len(ids)], [FinishReason.LENGTH], [], [columns(ids)], [], [0]))
    assert out.logprobs[0].start == 0
    late = receipt.accept_entries(got[2])  # a late row of the lost replica
    assert late is None
    rest = receipt.accept_entries(out.logprobs[0])
    assert rest.start == k and rest.token_ids == ids[k:] and rest.logprobs == columns(ids).logprobs[k:]
    assert "".join(tokens_of(got + [rest])) == TEXT
    assert receipt.entries == len(ids)
    assert receipt.accept_entries(out.logprobs[0]) is None


def test_receipt_entry_gap_is_an_error():
    receipt = Receipt()
    with pytest.raises(TextGap):
        receipt.accept_entries(LogprobEntries(3, [1], ["x"], [b"x"], [-1.0]))


def test_receipt_prompt_entries_once():
    receipt = Receipt()
    e = LogprobEntries(0, [1], ["x"], [b"x"], [-1.0])
    assert receipt.accept_prompt_entries(e) is e
    assert receipt.accept_prompt_entries(e) is None


def test_tokenizer_manager_passes_entries_to_the_delta(tmp_path):
    """`BatchStrOut` rows with entries become Deltas; a repeated row (re-seed) adds only the
    new entries; a row whose text and entries are all repeats yields nothing."""
    from tokenizer_proc.link.tokenizer_manager import TokenizerManager

    async def run() -> list:
        mgr = TokenizerManager(str(tmp_path), log=None)
        try:
            q: asyncio.Queue = asyncio.Queue()
            mgr.queues["r"], mgr.receipts["r"] = q, Receipt()
            e1 = LogprobEntries(0, [10, 11], ["a", "b"], [b"a", b"b"], [-0.5, -1.0])
            prompt = LogprobEntries(0, [7], ["p"], [b"p"], [-2.0])
            e2 = LogprobEntries(0, [10, 11, 12], ["a", "b", "c"], [b"a", b"b", b"c"], [-0.5, -1.0, -0.25])
            mgr._text(BatchStrOut(["r"], ["ab"], [2], [None], [None], [0], [0], [e1], [prompt]))
            mgr._text(BatchStrOut(["r"], ["ab"], [2], [None], [None], [0], [0], [e1], [prompt]))
            mgr._text(BatchStrOut(["r"], ["abc"], [3], [FinishReason.LENGTH], [None], [0], [0], [e2], []))
            return [q.get_nowait() for _ in range(q.qsize())]
        finally:
            mgr.close()

    deltas = asyncio.run(run())
    assert [d.text for d in deltas] == ["ab", "c"]
    assert deltas[0].logprobs.token_ids == [10, 11] and deltas[0].prompt_logprobs.tokens == ["p"]
    assert deltas[1].logprobs.start == 2 and deltas[1].logprobs.tokens == ["c"] and deltas[1].prompt_logprobs is None
    assert deltas[1].finish_reason == FinishReason.LENGTH
