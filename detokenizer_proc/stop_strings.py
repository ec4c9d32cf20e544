"""Stop strings over a stream of text deltas.

Text that could still become the start of a stop string is held back until it cannot; a
stop string that spans deltas (tokens) or ends inside one is found in the joined text.
"""

from __future__ import annotations


class StopMatcher:
    """Feed text deltas; get back what is safe to send, and the stop string once one matches.

    The match is the stop string whose end comes first in the text (what a client reading
    character by character would see first), so the result never depends on chunking.

    stops: the stop strings (empty ones are ignored); include: keep the matched stop
    string at the end of the output (vLLM's include_stop_str_in_output).
    """

    def __init__(self, stops: list[str], include: bool = False) -> None:
        self.stops = [s for s in stops if s]
        self.include = include
        self.text = ""
        self.sent = 0
        self.matched: str | None = None

    def _held_suffix(self) -> int:
        """Length of the longest tail of the unsent text that is a proper prefix of a stop."""
        tail = self.text[self.sent :]
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(tail)), best, -1):
                if tail.endswith(s[:n]):
                    best = n
                    break
        return best

    def feed(self, delta: str) -> str:
        """Add `delta`; return the text now safe to send. After a match, `matched` is set and
        the return value ends at the stop string (or after it when include)."""
        if self.matched is not None or not delta:
            return ""
        start = max(self.sent, len(self.text) - max((len(s) for s in self.stops), default=0) + 1)
        self.text += delta
        if not self.stops:
            out, self.sent = self.text[self.sent :], len(self.text)
            return out
        hit, end = None, None
        for s in self.stops:  # the stop that completes first wins, however the text was chunked
            i = self.text.find(s, max(0, start))
            if i >= 0 and (end is None or (i + len(s), i) < (end, hit)):
                hit, end, self.matched = i, i + len(s), s
        if hit is not None:
            cut = end if self.include else hit
            out = self.text[self.sent : cut]
            self.sent = cut
            return out
        safe = len(self.text) - self._held_suffix()
        out, self.sent = self.text[self.sent : safe], max(self.sent, safe)
        return out

    def flush(self) -> str:
        """At the end of the request: release the held text (no stop matched)."""
        if self.matched is not None:
            return ""
        out, self.sent = self.text[self.sent :], len(self.text)
        return out
