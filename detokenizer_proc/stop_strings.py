"""Stop strings over a stream of text deltas.

Text that could still become the start of a stop string is held back until it cannot; a
stop string that spans deltas (tokens) or ends inside one is found in the joined text.
Only the held text is kept: text already sent can never begin a match (had it been the
start of a stop string, it would have been held), so the cost of a delta does not grow
with the length of the output.

A stop string never cuts a tool call: from where a call begins (one of the parser family's
call markers is complete, or, for a family whose calls begin the output, the first
non-blank character is ``{``), no stop string matches for the rest of the output. A stop
string completed before that still ends the output. vLLM and SGLang match stop strings
everywhere, so a stop string that occurs in a call's arguments ends the request with a
broken call (half its arguments, finish_reason ``stop``); here the call is written whole.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopMatcher:
    """Feed text deltas; get back what is safe to send, and the stop string once one matches.

    The match is the stop string whose end comes first in the text (what a client reading
    character by character would see first), so the result never depends on chunking.

    stops: the stop strings (empty ones are ignored); include: keep the matched stop
    string at the end of the output (vLLM's include_stop_str_in_output); markers: texts
    that begin a tool call anywhere; at_start: an output whose first non-blank character
    is ``{`` is a tool call. Once a call has begun (`in_call`), no stop string matches
    (see the module docstring); a stop string and a marker completed by the same
    character: the stop string wins.
    """

    def __init__(
        self, stops: list[str], include: bool = False, markers: Sequence[str] = (), at_start: bool = False
    ) -> None:
        self.stops = [s for s in stops if s]
        self.include = include
        self.held = ""
        self.matched: str | None = None
        # A held tail ends with a character that some stop string has before its last one.
        self._prefix_chars = frozenset("".join(s[:-1] for s in self.stops))
        self.markers = [m for m in markers if m]
        self.at_start = at_start
        self.in_call = False
        self._blank = True  # nothing but whitespace so far (for at_start)
        self._tail = ""  # the last characters fed, where a marker completed by the next delta may begin
        self._tail_len = max((len(m) for m in self.markers), default=1) - 1

    def _held_suffix(self, text: str) -> int:
        """Length of the longest tail of `text` that is a proper prefix of a stop string."""
        if text[-1] not in self._prefix_chars:
            return 0
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best

    def feed(self, delta: str, match: bool = True) -> str:
        """Add `delta`; return the text now safe to send. After a match, `matched` is set and
        the return value ends at the stop string (or after it when include).

        A match must end inside `delta` (it may begin in the held text). match=False adds
        text in which no stop string may end (vLLM's min_tokens) but that a later stop string
        may begin in: its possible stop prefix is held back as usual."""
        if self.matched is not None or not delta:
            return ""
        if not self.stops or self.in_call:
            return delta
        text = self.held + delta
        hit, end, matched = None, None, None
        for s in self.stops if match else ():  # the stop that completes first wins, however the text was chunked
            i = text.find(s, max(0, len(self.held) - len(s) + 1))
            if i >= 0 and (end is None or (i + len(s), i) < (end, hit)):
                hit, end, matched = i, i + len(s), s
        call = self._call_end(delta)
        if call is not None and (end is None or len(self.held) + call < end):
            self.in_call, self.held = True, ""
            return text
        self.matched = matched
        if hit is not None:
            self.held = ""
            return text[: end if self.include else hit]
        keep = self._held_suffix(text)
        self.held = text[len(text) - keep :]
        return text[: len(text) - keep]

    def _call_end(self, delta: str) -> int | None:
        """Where in `delta` the first tool call that it completes the start of ends (its
        marker's end, or just after the ``{`` that begins the output), or None."""
        ends = []
        if self.at_start and self._blank:
            k = len(delta) - len(delta.lstrip())
            if k < len(delta):
                self._blank = False
                if delta[k] == "{":
                    ends.append(k + 1)
        if self.markers:
            text = self._tail + delta
            for m in self.markers:
                i = text.find(m, max(0, len(self._tail) - len(m) + 1))
                if i >= 0:
                    ends.append(i + len(m) - len(self._tail))
            self._tail = text[max(0, len(text) - self._tail_len) :] if self._tail_len else ""
        return min(ends, default=None)

    def flush(self) -> str:
        """At the end of the request: release the held text (no stop matched)."""
        if self.matched is not None:
            return ""
        out, self.held = self.held, ""
        return out
