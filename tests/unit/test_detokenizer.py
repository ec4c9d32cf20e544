"""Unit tests of the detokenizer replica's pieces (DESIGN.md §7): UTF-8-safe incremental
decoding with the real SmolLM2 tokenizer, stop strings over text deltas, the
`DetokenizerManager` that turns `BatchTokenOut` rows into `BatchStrOut` rows, and the
re-seed after a lost replica (the new replica skips exactly the characters sent, and the
tokenizer's `Receipt` passes each character on once)."""

from __future__ import annotations

import random

import pytest

from detokenizer_proc.manager import DetokenizerManager
from detokenizer_proc.stop_strings import StopMatcher
from protocol.enums import FinishReason
from protocol.messages import AbortReq, BatchStrOut, BatchTokenOut, DetokAbort, DetokParams, DetokSeed, TokenLogprobs
from text.incremental import REPLACEMENT, IncrementalDecoder, decoder_for
from tokenizer_proc.link.receipt import Receipt, TextGap

IM_END = 2  # <|im_end|>, the SmolLM2 chat EOS


@pytest.fixture(scope="session")
def tok():
    from protocol.model_source import resolve_model
    from text.hf_tokenizer import load_tokenizer

    return load_tokenizer(resolve_model(None))


def enc(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def stream(tok, ids: list[int], tail: list[int] | None = None, **kw) -> tuple[list[str], str]:
    """Feed `ids` one at a time; return the deltas and the final flush."""
    dec = IncrementalDecoder(tok, tail or [], **kw)
    deltas = [dec.push([i]) for i in ids]
    return deltas, dec.flush()


# ---------------------------------------------------------------- IncrementalDecoder
SPLIT_TEXTS = ["🌶️🍣", "👍🏽", "日本語", "한국어", "café ✓", "Hi 🌶️🍣 and 日本語, 한국어 — café ✓ 👍🏽!"]


@pytest.mark.parametrize("text", SPLIT_TEXTS)
def test_multibyte_characters_split_across_tokens(tok, text):
    ids = enc(tok, text)
    # the case under test really happens: some single token is half a character
    assert any(REPLACEMENT in tok.decode([i]) for i in ids), "text not split mid-character"
    assert len(ids) > 1
    deltas, tail = stream(tok, ids)
    for d in deltas + [tail]:
        assert REPLACEMENT not in d
    assert "".join(deltas) + tail == tok.decode(ids) == text
    assert tail == ""  # nothing held once the text is complete
    # some token completes no character, so at least one delta is empty
    assert "" in deltas


def test_emoji_deltas_are_whole_characters(tok):
    ids = enc(tok, "🌶️🍣")
    deltas, _ = stream(tok, ids)
    assert [d for d in deltas if d] == ["🌶", "\ufe0f", "🍣"]
    ids = enc(tok, "日本語")
    assert [d for d in stream(tok, ids)[0] if d] == ["日", "本", "語"]


def test_push_several_ids_at_once(tok):
    ids = enc(tok, "한국어 café ✓")
    dec = IncrementalDecoder(tok, [])
    out = dec.push(ids[:2]) + dec.push(ids[2:5]) + dec.push([]) + dec.push(ids[5:])
    assert out + dec.flush() == "한국어 café ✓"
    assert dec.push([]) == ""


def test_flush_releases_unfinished_character_as_replacement(tok):
    ids = enc(tok, "ok 🍣")
    dec = IncrementalDecoder(tok, [])
    text = "".join(dec.push([i]) for i in ids[:-1])  # last byte of the emoji missing
    assert text == "ok"
    rest = dec.flush()
    assert rest.endswith(REPLACEMENT) and rest.startswith(" ")
    assert dec.flush() == ""


def test_leading_space_with_prompt_tail(tok):
    prompt = enc(tok, "The capital of France is")
    gen = enc(tok, " Paris. It is big.")
    deltas, tail = stream(tok, gen, prompt[-6:])
    assert deltas[0] == " Paris"
    assert "".join(deltas) + tail == " Paris. It is big."
    # the prompt tail is context only: never part of the output
    assert "capital" not in "".join(deltas)


def test_prompt_tail_with_chat_template_and_special_tokens(tok):
    prompt = enc(tok, "<|im_start|>assistant\n")
    assert prompt[0] == 1  # <|im_start|> is a special token
    gen = enc(tok, "Hello there")
    for skip in (True, False):
        deltas, tail = stream(tok, gen, prompt, skip_special_tokens=skip)
        assert "".join(deltas) + tail == "Hello there"
        assert deltas[0] == "Hello"


def test_prompt_tail_starting_mid_character(tok):
    prompt = enc(tok, "say 🍣")
    # the tail begins with the last byte of the emoji, a lone continuation byte
    deltas, tail = stream(tok, enc(tok, " ok 日本"), prompt[-1:])
    assert "".join(deltas) + tail == " ok 日本"
    assert all(REPLACEMENT not in d for d in deltas)


@pytest.mark.parametrize(("skip", "expected"), [(True, "Hi there"), (False, "Hi there<|im_end|>")])
def test_skip_special_tokens(tok, skip, expected):
    ids = enc(tok, "Hi there") + [IM_END]
    deltas, tail = stream(tok, ids, skip_special_tokens=skip)
    assert "".join(deltas) + tail == expected
    assert deltas[-1] == ("" if skip else "<|im_end|>")


def test_special_token_between_text(tok):
    ids = enc(tok, "a") + [IM_END] + enc(tok, " b")
    deltas, tail = stream(tok, ids, skip_special_tokens=False)
    assert "".join(deltas) + tail == tok.decode(ids, skip_special_tokens=False) == "a<|im_end|> b"
    deltas, tail = stream(tok, ids, skip_special_tokens=True)
    assert "".join(deltas) + tail == tok.decode(ids, skip_special_tokens=True) == "a b"


def test_long_random_text_matches_decode(tok):
    text = ("Ünïcödé ☃ snow, 雪, 눈, ❄️; emoji 🧑‍🚀 astronaut, flags 🇯🇵 🇰🇷. " * 3).strip()
    ids = enc(tok, text)
    deltas, tail = stream(tok, ids)
    assert all(REPLACEMENT not in d for d in deltas)
    assert "".join(deltas) + tail == tok.decode(ids) == text


def test_random_token_ids_match_decode(tok):
    """Random ids, many of them byte fragments that make invalid UTF-8, plus special
    tokens and a prompt tail: the streamed text always equals a one-shot decode."""
    rng = random.Random(1)
    frag = [i for i in range(len(tok)) if REPLACEMENT in tok.decode([i])]
    assert len(frag) > 100
    prompt = enc(tok, "some prompt text 🍣")
    for _ in range(400):
        ids = [
            rng.choice(frag)
            if rng.random() < 0.5
            else rng.randrange(0, 17)
            if rng.random() < 0.2
            else rng.randrange(17, len(tok))
            for _ in range(rng.randint(1, 12))
        ]
        tail = prompt[-rng.randint(1, 6) :] if rng.random() < 0.5 else []
        for skip in (True, False):
            deltas, rest = stream(tok, ids, tail, skip_special_tokens=skip)
            head = tok.decode(tail, skip_special_tokens=skip)
            full = tok.decode(tail + ids, skip_special_tokens=skip)
            assert full.startswith(head)
            assert "".join(deltas) + rest == full[len(head) :], (tail, ids, skip)


def test_decoder_for_takes_the_backend_only_where_it_equals_decode(tok):
    """The default tokenizer (byte-level BPE, no clean-up) decodes through the `tokenizers`
    backend directly; with clean-up on, or a class that overrides `_decode`, through
    transformers. Either way the text equals
    ``tok.decode`` for random ids (byte fragments, special tokens)."""
    import copy

    fast = decoder_for(tok, skip_special_tokens=True)
    assert fast.func == tok.backend_tokenizer.decode
    cleaning = copy.deepcopy(tok)
    cleaning.clean_up_tokenization_spaces = True
    slow = decoder_for(cleaning, skip_special_tokens=False)
    assert slow.func == cleaning.decode
    overriding = copy.deepcopy(tok)
    overriding.__class__ = type("Overriding", (type(tok),), {"_decode": lambda self, token_ids, **kw: "x"})
    assert decoder_for(overriding, skip_special_tokens=True)([5, 6]) == "x"  # the override is honoured
    rng = random.Random(2)
    for _ in range(300):
        ids = [
            rng.randrange(0, 17) if rng.random() < 0.2 else rng.randrange(17, len(tok))
            for _ in range(rng.randint(1, 10))
        ]
        for skip in (True, False):
            assert decoder_for(tok, skip)(ids) == tok.decode(ids, skip_special_tokens=skip)
            assert decoder_for(cleaning, skip)(ids) == cleaning.decode(ids, skip_special_tokens=skip)


# ---------------------------------------------------------------- StopMatcher
def feed_all(matcher: StopMatcher, deltas: list[str]) -> list[str]:
    return [matcher.feed(d) for d in deltas]


def test_stop_spanning_deltas_is_held_back_and_cut():
    sm = StopMatcher(["STOP"])
    before = "Hello world! "
    outs = []
    for d in ["Hello wo", "rld! S", "T", "O", "P and more"]:
        outs.append(sm.feed(d))
        # no character of the stop string is ever released
        assert before.startswith("".join(outs))
    assert outs == ["Hello wo", "rld! ", "", "", ""]
    assert "".join(outs) == before
    assert sm.matched == "STOP"
    # after the match nothing more comes out
    assert sm.feed("xyz") == ""
    assert sm.flush() == ""


def test_stop_include_in_output():
    sm = StopMatcher(["STOP"], include=True)
    outs = feed_all(sm, ["Hello wo", "rld! S", "TO", "P and more"])
    assert "".join(outs) == "Hello world! STOP"
    assert outs[-1] == "STOP"
    assert sm.matched == "STOP"
    assert sm.flush() == ""


def test_stop_ending_inside_a_delta():
    sm = StopMatcher(["</answer>"])
    assert sm.feed("The answer is 4</ans") == "The answer is 4"
    assert sm.feed("wer> trailing text") == ""
    assert sm.matched == "</answer>"
    sm = StopMatcher(["</answer>"], include=True)
    assert sm.feed("The answer is 4</ans") == "The answer is 4"
    assert sm.feed("wer> trailing text") == "</answer>"


def test_stop_wholly_inside_one_delta():
    sm = StopMatcher(["\n\n"])
    assert sm.feed("line one\n\nline two") == "line one"
    assert sm.matched == "\n\n"


def test_several_stops_earliest_wins():
    sm = StopMatcher(["world", "lo"])
    assert sm.feed("hello world") == "hel"
    assert sm.matched == "lo"
    sm = StopMatcher(["lo", "hello"])  # "hello" starts earlier than "lo"
    assert sm.feed("say hello") == "say "
    assert sm.matched == "hello"
    # across deltas: the stop that completes first wins even when listed last
    sm = StopMatcher(["xyz", "cd"])
    assert feed_all(sm, ["ab", "c", "dxyz"]) == ["ab", "", ""]
    assert sm.matched == "cd"


def test_several_stops_earliest_wins_across_deltas():
    sm = StopMatcher(["END", "<stop>"])
    outs = feed_all(sm, ["a <st", "op> b END"])
    assert "".join(outs) == "a "
    assert sm.matched == "<stop>"


def test_false_prefix_is_released_when_it_diverges():
    sm = StopMatcher(["</end>"])
    assert sm.feed("a </e") == "a "
    assert sm.feed("x more") == "</ex more"
    assert sm.matched is None
    sm = StopMatcher(["aab"])
    assert feed_all(sm, ["a", "a", "a", "c"]) == ["", "", "a", "aac"]
    assert sm.matched is None


def test_overlapping_self_prefix_stop():
    sm = StopMatcher(["aab"])
    outs = feed_all(sm, ["a", "a", "a", "b", "zzz"])
    assert "".join(outs) == "a"
    assert sm.matched == "aab"


def test_flush_releases_held_text():
    sm = StopMatcher(["###"])
    assert sm.feed("done #") == "done "
    assert sm.feed("#") == ""
    assert sm.flush() == "##"
    assert sm.matched is None
    assert sm.flush() == ""


def test_no_stops_passes_everything_and_ignores_empty_stop():
    sm = StopMatcher([])
    assert feed_all(sm, ["a", "", "bc"]) == ["a", "", "bc"]
    assert sm.flush() == ""
    sm = StopMatcher(["", "x"])
    assert sm.feed("abc") == "abc"
    assert sm.feed("dxe") == "d"
    assert sm.matched == "x"


def test_stop_over_unicode_deltas():
    sm = StopMatcher(["日本"])
    outs = feed_all(sm, ["今日は", "日", "本語"])
    assert outs == ["今日は", "", ""]
    assert sm.matched == "日本"


def test_stop_randomized_against_reference():
    """Random texts in random chunks: the output is the text up to the stop string that
    completes first (stops here are not substrings of each other), never more."""
    rng = random.Random(7)
    alphabet = "ab<>/ "
    stops = ["</a>", "bb", "<<a", "aab", "ab<"]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        include = rng.random() < 0.5
        sm = StopMatcher(stops, include)
        out, pos = "", 0
        while pos < len(text):
            n = rng.randint(1, 4)
            got = sm.feed(text[pos : pos + n])
            out += got
            pos += n
            assert text.startswith(out)
        out += sm.flush()
        found = sorted((text.find(s) + len(s), text.find(s), s) for s in stops if s in text)
        if found:
            end, start, stop = found[0]
            assert sm.matched == stop, (text, stops)
            assert out == (text[:end] if include else text[:start]), (text, include)
        else:
            assert sm.matched is None
            assert out == text


def test_nested_stops_do_not_depend_on_delta_chunking():
    stops = ["lo wor", "o"]
    whole = StopMatcher(stops)
    out_whole = whole.feed("hello world") + whole.flush()
    chars = StopMatcher(stops)
    out_chars = "".join(chars.feed(c) for c in "hello world") + chars.flush()
    assert (out_whole, whole.matched) == (out_chars, chars.matched)


def test_no_stop_string_matches_once_a_tool_call_began():
    """A stop string that occurs in a tool call's arguments ended the output there, with
    half a call; from a call marker on (or a ``{`` that begins the output, for Llama 3
    JSON), no stop string matches. One completed before the marker still ends the output."""
    sm = StopMatcher(["city", "END"], markers=["<tool_call>"])
    call = '<tool_call>\n{"name": "w", "arguments": {"city": "Paris END"}}\n</tool_call>'
    assert (
        "".join(feed_all(sm, ["Let me check. <tool_", "call>\n{", call[13:40], call[40:]])) + sm.flush()
        == "Let me check. " + call
    )
    assert (sm.matched, sm.in_call) == (None, True)
    sm = StopMatcher(["city"], markers=["<tool_call>"])
    assert sm.feed("the city <tool_call>") == "the " and sm.matched == "city"  # text before the call
    sm = StopMatcher(["call>"], markers=["<tool_call>"])
    assert sm.feed("a <tool_call>") == "a <tool_" and sm.matched == "call>"  # completed with the marker: it wins
    sm = StopMatcher(["x"], markers=["<tool_call>"])
    assert sm.feed("<tool_call>x") == "<tool_call>x" and sm.matched is None  # the marker completes first
    for at_start, text, out in (
        (True, ' \n{"name": "x"}', ' \n{"name": "x"}'),
        (True, 'ok {"name": "x"}', 'ok {"name": "'),
        (False, '{"name": "x"}', '{"name": "'),
    ):
        sm = StopMatcher(["x"], at_start=at_start)
        assert "".join(feed_all(sm, [text[:2], text[2:]])) + sm.flush() == out, (at_start, text)


def test_a_call_marker_is_seen_however_its_pieces_split_it():
    """The held tail of the text, where a marker may begin, was cut to the wrong characters
    while the text was shorter than the marker: SmolLM2 writes ``<tool_call>`` as five tokens
    (``<``, ``tool``, ``_``, ``call``, ``>``), the marker was never seen, and a stop string in
    the call's arguments cut it. Every split of the marker, after text or at the start."""
    marker = "<tool_call>"
    for cuts in range(1 << (len(marker) - 1)):
        pieces, start = [], 0
        for i in range(1, len(marker)):
            if cuts >> (i - 1) & 1:
                pieces.append(marker[start:i])
                start = i
        pieces.append(marker[start:])
        for before in ([], ["Ok."]):
            sm = StopMatcher(["Paris"], markers=[marker])
            out = "".join(feed_all(sm, [*before, *pieces, '{"city": "Paris"}'])) + sm.flush()
            assert (out, sm.in_call, sm.matched) == ("".join(before) + marker + '{"city": "Paris"}', True, None), pieces


def test_stops_and_call_markers_randomized_against_reference():
    """Random texts in random chunks: the output ends at the stop string that completes
    first, unless a call began before it completed (a marker completed, or the first
    non-blank character is ``{``), when the whole text comes out."""
    rng = random.Random(11)
    alphabet = "ab<>t{ "
    stops, markers = ["bb", "a<", "ta", "{a"], ["<t>"]
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        include, at_start = rng.random() < 0.5, rng.random() < 0.5
        sm = StopMatcher(stops, include, markers, at_start)
        out, pos = "", 0
        while pos < len(text):
            n = rng.randint(1, 4)
            out += sm.feed(text[pos : pos + n])
            pos += n
            assert text.startswith(out)
        out += sm.flush()
        calls = [text.find(m) + len(m) for m in markers if m in text]
        if at_start and text.lstrip().startswith("{"):
            calls.append(len(text) - len(text.lstrip()) + 1)
        call = min(calls, default=len(text) + 1)
        found = sorted((text.find(s) + len(s), text.find(s), s) for s in stops if s in text)
        if found and found[0][0] <= call:
            end, start, stop = found[0]
            assert (sm.matched, out) == (stop, text[:end] if include else text[:start]), (text, include, at_start)
        else:
            assert (sm.matched, out, sm.in_call) == (None, text, bool(calls)), (text, at_start)


# ---------------------------------------------------------------- DetokenizerManager
def seed(mgr: DetokenizerManager, rid: str, **params) -> None:
    mgr.seed(DetokSeed(rid, DetokParams(**params), 5))


def test_manager_renders_rows(tok):
    mgr = DetokenizerManager(tok)
    prompt = enc(tok, "Tell me:")
    seed(mgr, "a", prompt_tail_ids=prompt)
    seed(mgr, "b")
    a_ids, b_ids = enc(tok, " café 🍣"), enc(tok, "日本語")
    texts = {"a": "", "b": ""}
    n = max(len(a_ids), len(b_ids))
    for step in range(n):
        rids, new, counts, reasons = [], [], [], []
        for rid, ids in (("a", a_ids), ("b", b_ids)):
            if step < len(ids):
                rids.append(rid)
                new.append([ids[step]])
                counts.append(step + 1)
                reasons.append(FinishReason.LENGTH if step == len(ids) - 1 else None)
        out, stops = mgr.tokens(BatchTokenOut(rids, new, counts, reasons))
        assert stops == []
        assert isinstance(out, BatchStrOut)
        assert out.rids == rids
        assert out.completion_tokens == counts
        assert out.finish_reasons == reasons
        assert out.matched_stop == [None] * len(rids)
        for rid, delta in zip(out.rids, out.text_deltas):
            assert REPLACEMENT not in delta
            texts[rid] += delta
    assert texts == {"a": " café 🍣", "b": "日本語"}
    assert mgr.states == {}  # finished rows are forgotten


def test_manager_stop_string_ends_request_and_asks_scheduler(tok):
    mgr = DetokenizerManager(tok)
    seed(mgr, "a", stop=["o ENDth"])  # spans the tokens " two", " END", "three"
    seed(mgr, "b")
    ids = enc(tok, "one two ENDthree")
    assert len(ids) == 4
    text, seen_stop = "", None
    for k, i in enumerate(ids):
        out, stops = mgr.tokens(BatchTokenOut(["a", "b"], [[i], [i]], [k + 1, k + 1], [None, None]))
        assert out is not None
        row = out.rids.index("a") if "a" in out.rids else None
        if row is None:
            assert seen_stop is not None  # a is forgotten after its stop
            assert out.rids == ["b"]
            assert stops == []
            continue
        text += out.text_deltas[row]
        if out.finish_reasons[row] is not None:
            assert seen_stop is None, "finished twice"
            seen_stop = k
            assert out.finish_reasons[row] == FinishReason.STOP
            assert out.matched_stop[row] == "o ENDth"
            assert out.completion_tokens[row] == k + 1
            assert stops == [AbortReq("a", FinishReason.STOP)]
        else:
            assert stops == []
            assert "one tw".startswith(text)  # nothing of the stop string leaks
    assert seen_stop == 3
    assert text == "one tw"
    assert "a" not in mgr.states and "b" in mgr.states


def test_manager_stop_include(tok):
    mgr = DetokenizerManager(tok)
    seed(mgr, "a", stop=["two"], include_stop_str_in_output=True)
    ids = enc(tok, "one two three")
    text = ""
    for k, i in enumerate(ids):
        out, stops = mgr.tokens(BatchTokenOut(["a"], [[i]], [k + 1], [None]))
        if out is None:
            break
        text += out.text_deltas[0]
        if out.finish_reasons[0] is not None:
            assert stops == [AbortReq("a", FinishReason.STOP)]
    assert text == "one two"


def test_manager_stop_when_scheduler_already_finished(tok):
    mgr = DetokenizerManager(tok)
    seed(mgr, "a", stop=["END"])
    ids = enc(tok, "xx END")
    out, stops = mgr.tokens(BatchTokenOut(["a"], [ids[:-1]], [len(ids) - 1], [None]))
    assert out.text_deltas == ["xx"] and stops == []
    # the last token completes the stop string in the same step the scheduler hit LENGTH
    out, stops = mgr.tokens(BatchTokenOut(["a"], [ids[-1:]], [len(ids)], [FinishReason.LENGTH]))
    assert out.text_deltas == [" "]
    assert out.finish_reasons == [FinishReason.STOP]
    assert out.matched_stop == ["END"]
    assert stops == []  # the scheduler already ended it: no AbortReq
    assert mgr.states == {}


def test_manager_unknown_rows_are_skipped(tok):
    mgr = DetokenizerManager(tok)
    seed(mgr, "a")
    ids = enc(tok, "hi")
    out, stops = mgr.tokens(
        BatchTokenOut(["ghost", "a", "gone"], [[5], ids, [6]], [1, 1, 1], [None, None, FinishReason.LENGTH])
    )
    assert out.rids == ["a"]
    assert out.text_deltas == ["hi"]
    assert out.completion_tokens == [1]
    assert out.finish_reasons == [None]
    assert stops == []
    out, stops = mgr.tokens(BatchTokenOut(["ghost"], [[5]], [2], [None]))
    assert out is None and stops == []


def test_manager_abort_forgets(tok):
    mgr = DetokenizerManager(tok)
    seed(mgr, "a")
    mgr.abort(DetokAbort("a"))
    mgr.abort(DetokAbort("a"))  # idempotent
    assert mgr.states == {}
    out, stops = mgr.tokens(BatchTokenOut(["a"], [[5]], [1], [None]))
    assert out is None and stops == []


def test_manager_finish_releases_held_text(tok):
    mgr = DetokenizerManager(tok)
    seed(mgr, "a", stop=["###"])
    ids = enc(tok, "done ##")
    out, _ = mgr.tokens(BatchTokenOut(["a"], [ids], [len(ids)], [None]))
    assert out.text_deltas == ["done "]  # "##" might still become "###"
    # the scheduler ends it on EOS: EOS not rendered, counted, held text released
    out, stops = mgr.tokens(BatchTokenOut(["a"], [[]], [len(ids) + 1], [FinishReason.STOP], [IM_END]))
    assert out.text_deltas == ["##"]
    assert out.finish_reasons == [FinishReason.STOP]
    assert out.matched_stop == [IM_END]
    assert out.completion_tokens == [len(ids) + 1]
    assert stops == []
    assert mgr.states == {}


def test_manager_finish_releases_unfinished_character(tok):
    mgr = DetokenizerManager(tok)
    seed(mgr, "a")
    ids = enc(tok, "ok 🍣")
    text = ""
    for k, i in enumerate(ids[:-1]):  # the emoji's last byte never comes
        out, _ = mgr.tokens(BatchTokenOut(["a"], [[i]], [k + 1], [None]))
        text += out.text_deltas[0]
    assert text == "ok"
    out, _ = mgr.tokens(BatchTokenOut(["a"], [[]], [len(ids) - 1], [FinishReason.LENGTH]))
    assert out.text_deltas[0].startswith(" ") and out.text_deltas[0].endswith(REPLACEMENT)
    assert out.finish_reasons == [FinishReason.LENGTH]


def test_manager_abort_reason_passes_through(tok):
    mgr = DetokenizerManager(tok)
    seed(mgr, "a")
    out, stops = mgr.tokens(BatchTokenOut(["a"], [[]], [0], [FinishReason.ABORT]))
    assert out == BatchStrOut(["a"], [""], [0], [FinishReason.ABORT], [None], [0], [0])
    assert stops == []


def test_manager_skip_special_tokens_param(tok):
    mgr = DetokenizerManager(tok)
    seed(mgr, "keep", skip_special_tokens=False)
    seed(mgr, "skip")
    ids = enc(tok, "Hi") + [IM_END]
    out, _ = mgr.tokens(BatchTokenOut(["keep", "skip"], [ids, ids], [3, 3], [None, None]))
    assert out.text_deltas == ["Hi<|im_end|>", "Hi"]


def test_manager_spaces_between_special_tokens_param(tok):
    mgr = DetokenizerManager(tok)
    seed(mgr, "a", skip_special_tokens=False, spaces_between_special_tokens=False)
    ids = [IM_END, IM_END] + enc(tok, "x")
    out, _ = mgr.tokens(BatchTokenOut(["a"], [[i] for i in ids][:1], [1], [None]))
    text = out.text_deltas[0]
    for k, i in enumerate(ids[1:], start=2):
        out, _ = mgr.tokens(BatchTokenOut(["a"], [[i]], [k], [FinishReason.LENGTH if k == len(ids) else None]))
        text += out.text_deltas[0]
    assert text == tok.decode(ids, skip_special_tokens=False, spaces_between_special_tokens=False)
    assert text.startswith("<|im_end|><|im_end|>")


# ---------------------------------------------------------------- re-seed after a lost replica
RESEED_CASES = [
    ("Hi 🌶️🍣 and 日本語, 한국어 — café ✓ 👍🏽!", []),  # characters split across tokens
    ("one two ENDthree four", ["o ENDth"]),  # a stop string spanning tokens, held back
    ("done ## then ### more", ["###"]),  # a false prefix held, released, then the real stop
    ("ok 🍣🍣 sushi 🍣🍣 END", ["🍣 E"]),  # a stop string that starts inside an emoji's tokens
]


def render(mgr: DetokenizerManager, rid: str, ids: list[int], start: int, replay: int | None = None):
    """Feed ids[start:] (the first `replay` of them as one row, as a re-seed replays them),
    then one at a time, the last with LENGTH; returns the rows (text, offset, reason, match)."""
    rows, k = [], start
    steps = ([ids[start:replay]] if replay is not None else []) + [[i] for i in ids[replay or start :]]
    for step in steps:
        k += len(step)
        out, _ = mgr.tokens(BatchTokenOut([rid], [step], [k], [FinishReason.LENGTH if k == len(ids) else None]))
        if out is None:
            break
        rows.append((out.text_deltas[0], out.text_offsets[0], out.finish_reasons[0], out.matched_stop[0]))
        if out.finish_reasons[0] is not None:
            break
    return rows


@pytest.mark.parametrize("text,stop", RESEED_CASES, ids=["emoji-cjk", "stop-spanning", "false-prefix", "stop-in-emoji"])
def test_reseed_skips_exactly_the_characters_sent(tok, text, stop):
    """Replica A renders the first k tokens and dies; the client has A's text so far (held-back
    stop prefixes and unfinished characters were never sent). Replica B, re-seeded with that
    count and replayed the first k + lag tokens, sends exactly the rest, whatever k and lag."""
    ids = enc(tok, text)
    params = dict(stop=stop, prompt_tail_ids=enc(tok, "Say:"))
    ref_mgr = DetokenizerManager(tok)
    seed(ref_mgr, "r", **params)
    ref = render(ref_mgr, "r", ids, 0)
    full = "".join(t for t, *_ in ref)
    assert ref[-1][2] is not None
    if stop:
        assert ref[-1][2] == FinishReason.STOP and ref[-1][3] == stop[0]
    held_somewhere = False
    for k in range(len(ref)):  # A sent its rows for ids[:k]; its stream had not ended
        got = "".join(t for t, *_ in ref[:k])
        assert [o for _, o, *_ in ref[: k + 1]] == [len("".join(t for t, *_ in ref[:i])) for i in range(k + 1)]
        if ref[k - 1][2] is not None if k else False:
            continue
        rendered_a = tok.decode(ids[:k]) if k else ""
        held_somewhere |= len(got) < len(rendered_a)
        for lag in (0, 1, 2):
            replay = min(k + lag, len(ids))
            b = DetokenizerManager(tok)
            b.seed(DetokSeed("r", DetokParams(**params), 5, 0, len(got)))
            rows = render(b, "r", ids, 0, replay=replay)
            pos = len(got)
            for t, offset, _, _ in rows:
                assert offset == pos, (k, lag)
                pos += len(t)
            assert got + "".join(t for t, *_ in rows) == full, (k, lag)
            assert rows[-1][2:] == ref[-1][2:]
    if stop:
        assert held_somewhere, "the case under test (text held back when the replica died) never happened"


def test_reseed_of_a_finished_request_sends_the_rest_and_the_finish(tok):
    ids = enc(tok, "the end 🍣")
    b = DetokenizerManager(tok)
    b.seed(DetokSeed("r", DetokParams(), 5, 0, 4))
    out, stops = b.tokens(BatchTokenOut(["r"], [ids], [len(ids) + 1], [FinishReason.STOP], [IM_END]))
    assert out.text_deltas == ["end 🍣"] and out.text_offsets == [4]
    assert out.finish_reasons == [FinishReason.STOP] and out.matched_stop == [IM_END] and stops == []
    assert b.states == {}


def test_reseed_finds_a_stop_the_lost_replica_matched_and_asks_to_end(tok):
    """The lost replica matched a stop string, but its AbortReq died with it: the new one
    matches it again from the replay and asks the scheduler to end the request."""
    ids = enc(tok, "one two ENDthree")
    b = DetokenizerManager(tok)
    b.seed(DetokSeed("r", DetokParams(stop=["END"]), 5, 0, 3))
    out, stops = b.tokens(BatchTokenOut(["r"], [ids], [len(ids)], [None]))
    assert out.text_deltas == [" two "] and out.text_offsets == [3]
    assert out.finish_reasons == [FinishReason.STOP] and out.matched_stop == ["END"]
    assert stops == [AbortReq("r", FinishReason.STOP)]


@pytest.mark.parametrize("finish", [None, FinishReason.LENGTH, FinishReason.STOP])
def test_reseed_replay_past_a_stop_counts_and_scores_only_the_tokens_up_to_it(tok, finish):
    """The scheduler generated tokens past a stop string before the lost replica's AbortReq
    (or its final row) got through: the new replica, replayed every token in one row, ends
    the request at the token that completed the stop, as one token per row does. Its usage
    counts that token's position, not every token generated (a stream's usage equals the
    non-streamed one's), and its logprob entries stop there too. finish: how the scheduler
    had ended the request meanwhile (STOP: at an EOS, counted but not replayed)."""
    text = "one 🍣🍣 two END three four five six"
    ids = enc(tok, text)
    params = DetokParams(stop=["🍣 t", "END"], prompt_tail_ids=enc(tok, "Say:"))
    ref = DetokenizerManager(tok)
    ref.seed(DetokSeed("r", params, 5))
    ref_text, ref_count = "", None
    for k, token in enumerate(ids):
        out, _ = ref.tokens(BatchTokenOut(["r"], [[token]], [k + 1], [None]))
        if out is not None:
            ref_text += out.text_deltas[0]
            if out.finish_reasons[0] is not None:
                ref_count = out.completion_tokens[0]
                break
    assert ref_text == "one 🍣" and ref_count is not None and ref_count < len(ids)
    lp = TokenLogprobs(list(ids), [-0.5] * len(ids), [[t] for t in ids], [[-0.5]] * len(ids))
    b = DetokenizerManager(tok)
    b.seed(DetokSeed("r", params, 5, 0, 2))
    generated = len(ids) + (finish == FinishReason.STOP)
    out, stops = b.tokens(BatchTokenOut(["r"], [list(ids)], [generated], [finish], [None], [lp], [None], [0]))
    assert out.text_deltas == [ref_text[2:]] and out.finish_reasons == [FinishReason.STOP]
    assert out.matched_stop == ["🍣 t"]
    assert out.completion_tokens == [ref_count]
    assert out.logprobs[0].token_ids == ids[:ref_count]
    assert "".join(out.logprobs[0].tokens) == tok.decode(ids[:ref_count])  # whole tokens, to the stop's last
    assert stops == ([AbortReq("r", FinishReason.STOP)] if finish is None else [])


def test_receipt_passes_each_character_once(tok):
    """Rows of the lost replica still in flight arrive after the new replica's: the client
    text is the reference, in order, with nothing repeated."""
    ids = enc(tok, "Hi 🌶️🍣 and 日本語 — café ✓ 👍🏽 END more text here")
    mgr = DetokenizerManager(tok)
    seed(mgr, "r", stop=["END"])
    ref = render(mgr, "r", ids, 0)
    full = "".join(t for t, *_ in ref)
    k = len(ref) // 3
    got = "".join(t for t, *_ in ref[:k])
    b = DetokenizerManager(tok)
    b.seed(DetokSeed("r", DetokParams(stop=["END"]), 5, 0, len(got)))
    b_rows = render(b, "r", ids, 0, replay=k + 1)
    late_a = ref[k : k + 4]  # A's text that was still in its socket when it died
    receipt, client = Receipt(), []
    assert all(reason is None for _, _, reason, _ in late_a)
    for t, offset, reason, _ in ref[:k] + b_rows[:2] + late_a + b_rows[2:]:
        new = receipt.accept(t, offset, 0, reason is not None)
        if new:
            client.append(new)
        if receipt.ended:
            break
    assert "".join(client) == full and receipt.chars == len(full)


def test_receipt_rules():
    r = Receipt()
    assert r.accept("abc", 0, 1, False) == "abc"
    assert r.accept("", 3, 2, False) == ""  # an empty row at the end passes (it carries a count)
    assert r.accept("bc", 1, 2, False) is None  # a repeat adds nothing
    assert r.accept("cdef", 2, 4, False) == "def"  # overlap: only the new part
    assert (r.chars, r.completion_tokens) == (6, 4)
    assert r.accept("", 0, 3, True) == "" and r.ended and r.completion_tokens == 4  # a final row always passes
    with pytest.raises(TextGap, match="text from character 9 arrived, but only 6 characters came before it"):
        Receipt(chars=6).accept("x", 9, 1, False)


@pytest.mark.parametrize(
    "chunks", [[1, 1, 1, 1, 1, 1], [6], [1, 3, 2], [2, 4]], ids=["one-by-one", "one-row", "1-3-2", "2-4"]
)
@pytest.mark.parametrize(
    "min_tokens,text",
    [
        (0, "one"),
        (1, "one"),
        (2, "one END two"),
        (3, "one END two"),
        (4, "one END two END three"),
        (6, "one END two END three END"),
    ],
)
def test_stop_strings_are_matched_after_min_tokens_only(tok, chunks, min_tokens, text):
    """A stop string is not matched in the text of the first min_tokens tokens (vLLM's
    min_tokens: at least that many tokens, stop strings included; the request once ended at
    its first token); however the tokens arrive in rows, the text and the finish agree."""
    mgr = DetokenizerManager(tok)
    seed(mgr, "a", stop=[" END"], min_tokens=min_tokens)
    ids = enc(tok, "one END two END three END")
    got, reason, start = "", None, 0
    for size in chunks:
        last = start + size == len(ids)
        out, _ = mgr.tokens(
            BatchTokenOut(["a"], [ids[start : start + size]], [start + size], [FinishReason.LENGTH if last else None])
        )
        start += size
        if out is None:
            break
        got += out.text_deltas[0]
        reason = out.finish_reasons[0]
    assert got == text
    assert reason == (FinishReason.LENGTH if min_tokens == 6 else FinishReason.STOP)


def vllm_min_tokens_stop(pieces: list[str], stop: str, min_tokens: int) -> str:
    """Reference: vLLM's rule, token by token: once more than min_tokens tokens are out, a
    stop string matches where it ends in the newest token's text (it may begin before)."""
    text = ""
    for n, piece in enumerate(pieces, 1):
        text += piece
        if n > min_tokens:
            i = text.find(stop, max(0, len(text) - len(piece) - len(stop) + 1))
            if i >= 0:
                return text[:i]
    return text


@pytest.mark.parametrize(
    "chunks", [[1] * 12, [12], [5, 7], [4, 1, 7], [3, 3, 3, 3]], ids=["one-by-one", "one-row", "5-7", "4-1-7", "3s"]
)
@pytest.mark.parametrize("stop", [" 1", " 14", "4 1"])
@pytest.mark.parametrize("min_tokens", [2, 4, 5, 7, 10])
def test_a_stop_string_that_begins_within_min_tokens_and_ends_after_matches(tok, chunks, stop, min_tokens):
    """A stop string whose text begins in the first min_tokens tokens and ends after them
    ends the request, as in vLLM (it once had to begin after them: with min_tokens 10 and
    stop " 1", " 12 13 14 15 16" ran on to " 12 13 14 15", where vLLM gives " 12 13 14")."""
    ids = enc(tok, " 12 13 14 15 16")
    assert len(ids) == 15 and sum(chunks) == 12  # one token per character
    pieces = [tok.decode([i]) for i in ids]
    want = vllm_min_tokens_stop(pieces[:12], stop, min_tokens)
    mgr = DetokenizerManager(tok)
    seed(mgr, "a", stop=[stop], min_tokens=min_tokens)
    got, start = "", 0
    for size in chunks:
        start += size
        out, _ = mgr.tokens(
            BatchTokenOut(["a"], [ids[start - size : start]], [start], [FinishReason.LENGTH if start == 12 else None])
        )
        if out is None:
            break
        got += out.text_deltas[0]
    assert got == want


RESOLVED = """
import json, sys
from protocol.config import ModelSource
from text.hf_tokenizer import load_resolved_tokenizer
kind, path, run_dir, ids = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
tok = load_resolved_tokenizer(ModelSource(kind, path, "m"), run_dir, wait_s=0)
print(json.dumps({"class": type(tok).__qualname__, "torch": "torch" in sys.modules, "template": tok.chat_template,
                  "special": tok.all_special_ids, "text": [tok.decode(ids), tok.decode(ids, skip_special_tokens=True)],
                  "ids": tok.encode("Hi there, café 日本語", add_special_tokens=False)}))
"""


@pytest.mark.parametrize("model", ["default", "model dir"])
def test_a_replica_loads_the_tokenizer_class_the_tokenizer_process_chose_without_torch(
    model, tok, default_source, tiny_model_dir, tmp_path
):
    """A replica loaded its tokenizer through ``AutoTokenizer``, whose import pulls in torch
    (4.1 s and 312 MB against 1.3 s and 125 MB): it now loads the class the tokenizer process's
    ``AutoTokenizer`` chose (`write_tokenizer_class`), with the same vocabulary, specials, chat
    template and text; without the file, or with a class it cannot import, it falls back to
    ``AutoTokenizer``."""
    import json
    import subprocess
    import sys

    from protocol.config import ModelSource
    from tests.support.launcher import ROOT
    from text.hf_tokenizer import load_tokenizer, write_tokenizer_class

    source = default_source if model == "default" else ModelSource("hf", str(tiny_model_dir), "tiny")
    want_tok = tok if model == "default" else load_tokenizer(source)
    ids = [1, *enc(want_tok, "Hi there, café 日本語"), 2, 0]
    want = {
        "class": type(want_tok).__qualname__,
        "template": want_tok.chat_template,
        "special": want_tok.all_special_ids,
        "text": [want_tok.decode(ids), want_tok.decode(ids, skip_special_tokens=True)],
        "ids": ids[1:-2],
    }

    def resolved() -> dict:
        out = subprocess.run(
            [sys.executable, "-c", RESOLVED, source.kind, source.path, str(tmp_path), json.dumps(ids)],
            capture_output=True,
            text=True,
            cwd=str(ROOT),
            timeout=120,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout)

    write_tokenizer_class(tmp_path, want_tok)
    got = resolved()
    assert got.pop("torch") is False
    assert got == want
    (tmp_path / "tokenizer_class.json").write_text(json.dumps({"module": "transformers", "name": "NoSuchTokenizer"}))
    got = resolved()
    assert got.pop("torch") is True and got == want  # through AutoTokenizer
