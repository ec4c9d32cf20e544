"""`RowGrammar`: one request's grammar matcher, advanced on its finalized tokens."""

from __future__ import annotations

import numpy as np

from protocol.token_mask import mask_words


class RowGrammar:
    """The matcher of one request under `compiled` (an ``xgrammar.CompiledGrammar`` from
    `GrammarBackend.submit`).

    Per step: `next_mask` for the launch that samples the request's next token, then
    `accept` with the token it sampled. Once the grammar is complete, only the stop tokens
    of the hand-off (the model's EOS ids) are allowed; accepting one terminates the matcher
    (`terminated`), which ends the request. `dead_end`: the last mask allowed no token, so
    the output so far can neither go on nor end (xgrammar accepts a prefix that only a part
    of the grammar matching no text could continue, such as an empty character class:
    ``ab`` for the regex ``ab[^\\s\\S]``); the token sampled under it
    is not the grammar's. Not thread-safe: one thread drives a row.
    """

    def __init__(self, compiled) -> None:
        import xgrammar  # already imported by the compile that made `compiled`

        self._matcher = xgrammar.GrammarMatcher(compiled)
        self.vocab_size: int = compiled.tokenizer_info.vocab_size
        self._mask = np.zeros(mask_words(self.vocab_size), dtype="<i4")
        self.dead_end = False

    def accept(self, token_id: int) -> bool:
        """Advance by `token_id`; False (state unchanged) when the grammar does not allow it,
        the id is out of range, or the matcher has terminated."""
        return self._matcher.accept_token(token_id)

    @property
    def terminated(self) -> bool:
        """True once a stop token was accepted at the end of the grammar."""
        return self._matcher.is_terminated()

    def next_mask(self) -> bytes:
        """The tokens allowed next, packed: ``4 * ceil(vocab_size / 32)`` bytes, int32 words
        little-endian, bit ``j % 32`` of word ``j // 32`` set = token ``j`` allowed
        (`protocol.token_mask`); sets `dead_end`. Raises `RuntimeError` once `terminated`."""
        if self._matcher.is_terminated():
            raise RuntimeError("the grammar has terminated; no token comes next")
        self._matcher.fill_next_token_bitmask(self._mask)
        self.dead_end = not self._mask.any()
        return self._mask.tobytes()
