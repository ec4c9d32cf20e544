"""UTF-8-safe incremental detokenization with prefix/read offsets.

Byte-level BPE splits one character over several tokens (a 4-byte emoji is 2-3 tokens
here), so decoding each token alone is wrong. Each step decodes a short window twice:
``ids[prefix:read]`` (text already emitted) and ``ids[prefix:]``; the difference is new
text, emitted only when it does not end in U+FFFD (an unfinished character). The window
starts a few prompt tokens back so the first token decodes with its leading space.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from transformers import PreTrainedTokenizerFast

REPLACEMENT = "\ufffd"


def decoder_for(
    tokenizer, skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True
) -> Callable[[list[int]], str]:
    """A function from token ids to text, equal to ``tokenizer.decode(ids, ...)``.

    For a transformers tokenizer backed by the `tokenizers` library that does no clean-up
    of the decoded text (``clean_up_tokenization_spaces`` off, as for byte-level BPE
    models), it is the backend's own ``decode``: transformers' ``decode`` calls exactly
    that, after converting and checking its input in Python, which took most of a
    detokenizer's time (two calls per token per request). Any other tokenizer (slow ones,
    clean-up on, or a class that overrides ``decode`` / ``_decode``, as Whisper's and
    CodeGen's do) goes through transformers.
    """
    cls = type(tokenizer)
    if (
        isinstance(tokenizer, PreTrainedTokenizerFast)
        and not tokenizer.clean_up_tokenization_spaces
        and cls.decode is PreTrainedTokenizerFast.decode
        and cls._decode is PreTrainedTokenizerFast._decode
    ):
        return partial(tokenizer.backend_tokenizer.decode, skip_special_tokens=skip_special_tokens)
    kwargs = {"skip_special_tokens": skip_special_tokens}
    if not spaces_between_special_tokens:
        kwargs["spaces_between_special_tokens"] = False
    return partial(tokenizer.decode, **kwargs)


class IncrementalDecoder:
    """Turns a growing list of token ids into text deltas.

    tokenizer: a transformers tokenizer; prompt_tail_ids: the last prompt tokens (context
    only, never emitted); skip_special_tokens / spaces_between_special_tokens: as in
    transformers' ``decode``. complete_context: the context is followed by the tokens that
    finish a character it leaves unfinished (it is the prompt, and the pushed tokens are the
    prompt's next ones): such a character is emitted whole by the token that completes it.
    Otherwise (the default, output text) an unfinished character at the end of the context
    counts as text already emitted.
    """

    def __init__(
        self,
        tokenizer,
        prompt_tail_ids: list[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        complete_context: bool = False,
    ) -> None:
        self.ids = list(prompt_tail_ids)
        self.prefix = 0
        self.read = len(self.ids)
        self._decode = decoder_for(tokenizer, skip_special_tokens, spaces_between_special_tokens)
        if complete_context:
            while self.read and self._decode(self.ids[: self.read]).endswith(REPLACEMENT):
                self.read -= 1

    def push(self, new_ids: list[int]) -> str:
        """Add token ids; return the text they complete ("" while a character is unfinished)."""
        if not new_ids:
            return ""
        self.ids.extend(new_ids)
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith(REPLACEMENT):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """At the end of the request: whatever is still held, unfinished characters as U+FFFD."""
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return after[len(before) :] if len(after) > len(before) else ""
