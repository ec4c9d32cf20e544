"""Prompt lookup (n-gram) drafts: the tokens that followed the latest earlier occurrence of
a request's last n tokens, in its own prompt and output (model-free; Saxena's "prompt lookup
decoding", vLLM's and SGLang's NGRAM). Text that repeats its input (code edits, quotes,
summaries, tool arguments) gets long agreeing drafts; free text mostly none."""

from __future__ import annotations

import numpy as np

MAX_NGRAM = 4
MIN_NGRAM = 1
"""The n-gram lengths tried, longest first: a longer match predicts better, a 1-gram
always finds something in a long prompt."""


class TokenHistory:
    """A request's tokens (prompt, then output) in a growing int32 buffer."""

    def __init__(self, tokens: list[int]) -> None:
        self.buf = np.zeros(max(64, 2 * len(tokens)), dtype=np.int32)
        self.n = 0
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        """Append `tokens` (doubling the buffer when full)."""
        if self.n + len(tokens) > len(self.buf):
            grown = np.zeros(2 * (self.n + len(tokens)), dtype=np.int32)
            grown[: self.n] = self.buf[: self.n]
            self.buf = grown
        self.buf[self.n : self.n + len(tokens)] = tokens
        self.n += len(tokens)

    def propose(self, k: int, max_n: int = MAX_NGRAM, min_n: int = MIN_NGRAM) -> list[int]:
        """Up to `k` draft tokens: for n from `max_n` down to `min_n`, the latest earlier
        position where the last n tokens occur and k tokens follow (else the earliest, whose
        continuation is the longest), and the tokens after it; [] when none matches (or
        k <= 0)."""
        toks, n_tok = self.buf, self.n
        if k <= 0 or n_tok < 2:
            return []
        ends = np.flatnonzero(toks[: n_tok - 1] == toks[n_tok - 1])  # earlier ends of a 1-gram match
        for n in range(min(max_n, n_tok - 1), min_n - 1, -1):
            keep = ends[ends >= n - 1]
            for j in range(1, n):
                keep = keep[toks[keep - j] == toks[n_tok - 1 - j]]
            if len(keep):
                full = keep[keep + k < n_tok]  # a match whose continuation holds k tokens, if any
                e = int(full[-1] if len(full) else keep[0])
                return toks[e + 1 : min(e + 1 + k, n_tok)].tolist()
        return []
