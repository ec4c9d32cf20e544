"""`DetokenizerManager`: per-request text state of one replica, without sockets."""

from __future__ import annotations

from dataclasses import dataclass

from msgspec.structs import replace

from detokenizer_proc.stop_strings import StopMatcher
from protocol.enums import FinishReason
from protocol.messages import (
    AbortReq,
    BatchStrOut,
    BatchTokenOut,
    DetokAbort,
    DetokParams,
    DetokSeed,
    LogprobEntries,
    TokenLogprobs,
)
from text.incremental import IncrementalDecoder
from text.logprob_render import LogprobRenderer
from text.token_pieces import TokenPieces


@dataclass
class DetokState:
    """One request: its decoder and stop matcher. pos: characters of its text rendered so
    far; skip: characters the client already has (a re-seed), rendered but not sent.
    tokens: its output tokens rendered so far. logprobs: the renderer of its output logprob
    entries, made when the first arrive."""

    decoder: IncrementalDecoder
    stops: StopMatcher
    params: DetokParams
    cached_tokens: int = 0
    pos: int = 0
    skip: int = 0
    tokens: int = 0
    logprobs: LogprobRenderer | None = None

    def push(self, ids: list[int]) -> tuple[str, int]:
        """Render `ids`; returns the text safe to send and how many of `ids` it renders: all,
        unless a stop string matched, then those up to the one that completed the match (the
        rest are past the request's end). Several ids at once (a re-seed's replay) are
        rendered one at a time while a stop string could match, so that the request ends at
        the same token, and so counts as many tokens, as when they came one per row."""
        if len(ids) > 1 and self.stops.stops:
            text = ""
            for k, token in enumerate(ids):
                text += self._push([token])
                if self.stops.matched is not None:
                    return text, k + 1
            return text, len(ids)
        return self._push(ids), len(ids)

    def _push(self, ids: list[int]) -> str:
        """Render `ids`; returns the text safe to send. No stop string ends in the text of the
        first ``params.min_tokens`` tokens, but one may begin there and end after it (vLLM's
        min_tokens)."""
        free = max(0, self.params.min_tokens - self.tokens)
        self.tokens += len(ids)
        text = self.stops.feed(self.decoder.push(ids[:free]), match=False) if free else ""
        return text + (self.stops.feed(self.decoder.push(ids[free:])) if len(ids) > free else "")

    def flush(self) -> str:
        """At the end: the text the decoder still held, through the matcher (where no stop
        string may end while the request is still within its min_tokens)."""
        return self.stops.feed(self.decoder.flush(), match=self.tokens > self.params.min_tokens)


class DetokenizerManager:
    """Renders token batches into text batches; rebuilt from token ids alone if lost."""

    def __init__(self, tokenizer) -> None:
        self.tok = tokenizer
        self.states: dict[str, DetokState] = {}
        self._pieces: TokenPieces | None = None

    @property
    def pieces(self) -> TokenPieces:
        """The tokenizer's `TokenPieces`, built when a request first asks for logprobs."""
        if self._pieces is None:
            self._pieces = TokenPieces(self.tok)
        return self._pieces

    def seed(self, msg: DetokSeed) -> None:
        """Start a request (a re-seed replaces any state kept for it). After a re-seed with
        chars_sent = n, the first n characters of its text are rendered but not sent."""
        p = msg.params
        self.states[msg.rid] = DetokState(
            IncrementalDecoder(self.tok, p.prompt_tail_ids, p.skip_special_tokens, p.spaces_between_special_tokens),
            StopMatcher(p.stop, p.include_stop_str_in_output, p.call_markers, p.call_at_start),
            p,
            msg.cached_tokens,
            skip=msg.chars_sent,
        )

    def abort(self, msg: DetokAbort) -> None:
        """Forget a request (no output)."""
        self.states.pop(msg.rid, None)

    def describe(self, rid: str) -> dict:
        """What this replica holds for `rid`, for a log line (no text): whether it knows it,
        characters rendered and skipped (a re-seed), the decoder's token count and offsets,
        and characters held back for a possible stop string."""
        st = self.states.get(rid)
        if st is None:
            return dict(rid=rid, known=False)
        d = st.decoder
        return dict(
            rid=rid,
            known=True,
            chars_rendered=st.pos,
            chars_skipped=st.skip,
            cached_tokens=st.cached_tokens,
            decoder_ids=len(d.ids),
            prefix_offset=d.prefix,
            read_offset=d.read,
            stop_held_chars=len(st.stops.held),
        )

    def tokens(self, msg: BatchTokenOut) -> tuple[BatchStrOut | None, list[AbortReq]]:
        """Render one batch. Returns the text batch (None when no row is known) and the
        `AbortReq(reason=STOP)` messages for requests a stop string just ended. Each row's
        text_offsets entry is where its delta starts in the request's text. Rows with logprob
        columns get their rendered entries (see `_logprobs`); a batch without any costs
        nothing more."""
        rids, deltas, counts, reasons, matched, cached, offsets, timings = [], [], [], [], [], [], [], []
        with_logprobs = bool(msg.logprobs or msg.prompt_logprobs)
        entries: list[LogprobEntries | None] = []
        prompt_entries: list[LogprobEntries | None] = []
        stops: list[AbortReq] = []
        for i, rid in enumerate(msg.rids):
            st = self.states.get(rid)
            if st is None:  # finished by a stop string already, or aborted
                continue
            reason = msg.finish_reasons[i]
            ids = msg.new_token_ids[i]
            text, used = st.push(ids)
            count = msg.completion_tokens[i]
            match: str | int | None = msg.matched_stop[i] if i < len(msg.matched_stop) else None
            if st.stops.matched is not None:
                reason, match = FinishReason.STOP, st.stops.matched
                count = min(count, st.tokens)  # the tokens up to the match (not those generated after it)
                if msg.finish_reasons[i] is None:
                    stops.append(AbortReq(rid, FinishReason.STOP))
            elif reason is not None:
                text += st.flush()
                if st.stops.matched is not None:
                    reason, match = FinishReason.STOP, st.stops.matched
                else:
                    text += st.stops.flush()
            if reason is not None:
                del self.states[rid]
            if with_logprobs:
                out, prompt_out = self._logprobs(st, msg, i, reason is not None, used)
                entries.append(out)
                prompt_entries.append(prompt_out)
            text, offset = _unsent(st, text)
            rids.append(rid)
            deltas.append(text)
            counts.append(count)
            reasons.append(reason)
            matched.append(match)
            cached.append(st.cached_tokens)
            offsets.append(offset)
            timings.append(msg.timings[i] if i < len(msg.timings) else None)
        if not rids:
            return None, stops
        return BatchStrOut(
            rids,
            deltas,
            counts,
            reasons,
            matched,
            cached,
            offsets,
            _column(entries),
            _column(prompt_entries),
            _column(timings),
        ), stops

    def _logprobs(
        self, st: DetokState, msg: BatchTokenOut, i: int, final: bool, used: int
    ) -> tuple[LogprobEntries | None, LogprobEntries | None]:
        """Row i's output entries: all of them (an ending EOS or stop token, not rendered, has
        one after the row's ids), or those of its first `used` ids when a stop string ended
        the request inside them; from its `logprob_starts` entry on; a final row also flushes an unfinished
        character) and its prompt entries (rendered in the context of
        `DetokParams.logprob_context_ids`; the last flushes a character the prompt leaves
        unfinished), each None when the row has no such column."""
        p = st.params
        lp = msg.logprobs[i] if i < len(msg.logprobs) else None
        out = None
        if lp is not None:
            if used < len(msg.new_token_ids[i]):  # a stop string ended it: no entries past its end
                lp = _first(lp, used)
            if st.logprobs is None:
                st.logprobs = LogprobRenderer(
                    self.tok, self.pieces, p.prompt_tail_ids, p.skip_special_tokens, p.spaces_between_special_tokens
                )
            start = msg.logprob_starts[i] if i < len(msg.logprob_starts) else 0
            out = st.logprobs.render(lp, start, final)
            if len(lp.token_ids) > len(msg.new_token_ids[i]) and not out.tokens[-1]:
                out = self._spelled_end(out)
        plp = msg.prompt_logprobs[i] if i < len(msg.prompt_logprobs) else None
        prompt = None
        if plp is not None:
            prompt = LogprobRenderer(
                self.tok,
                self.pieces,
                p.logprob_context_ids,
                p.skip_special_tokens,
                p.spaces_between_special_tokens,
                complete_context=True,
            ).render(plp, 0, True)
        return out, prompt

    def _spelled_end(self, out: LogprobEntries) -> LogprobEntries:
        """`out` with its last entry, an ending EOS or stop token that the text does not
        show (it rendered ""), spelled as its token (``<|im_end|>``), as its top
        alternatives spell it and as vLLM shows it."""
        last = out.token_ids[-1]
        return replace(
            out,
            tokens=[*out.tokens[:-1], self.pieces.text(last)],
            token_bytes=[*out.token_bytes[:-1], self.pieces.raw(last)],
        )


def _first(lp: TokenLogprobs, n: int) -> TokenLogprobs:
    """`lp` for its first `n` positions only (every column is per position)."""
    return replace(lp, **{f: getattr(lp, f)[:n] for f in lp.__struct_fields__})


def _column(rows: list) -> list:
    """`rows`, or [] when every row is None (the wire form of an unused column)."""
    return rows if any(r is not None for r in rows) else []


def _unsent(st: DetokState, text: str) -> tuple[str, int]:
    """Advance `st` past `text`, the next part of its rendered text; return the part the
    client lacks (what lies past `st.skip`) and the offset where that part starts (never
    below `st.skip`)."""
    offset = st.pos
    st.pos += len(text)
    if offset < st.skip:
        text, offset = text[st.skip - offset :], st.skip
    return text, offset
