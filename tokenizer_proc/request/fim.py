"""Fill-in-the-middle prompts for completions ``suffix``: the model writes what goes between
the prompt and the suffix.

A model supports it when its tokenizer has one of `FAMILIES`' three special tokens, each a
single token id; the prompt is then laid out prefix-suffix-middle (PSM):
``<prefix token> prompt <suffix token> suffix <middle token>``, and the model continues
after the middle token. Otherwise a suffix is a 400 (`openai.convert.build_completion`).
"""

from __future__ import annotations

from dataclasses import dataclass

FAMILIES = (
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder, StarCoder2, SantaCoder
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, CodeGemma-style
    ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),  # DeepSeek-Coder
)
"""(prefix, suffix, middle) token texts of the FIM families recognized."""


@dataclass(frozen=True)
class FimTokens:
    """The token ids of one family's prefix, suffix and middle markers."""

    prefix: int
    suffix: int
    middle: int

    def prompt(self, prefix_ids: list[int], suffix_ids: list[int]) -> list[int]:
        """The PSM prompt of `prefix_ids` (before the hole) and `suffix_ids` (after it)."""
        return [self.prefix, *prefix_ids, self.suffix, *suffix_ids, self.middle]


def fim_tokens(tokenizer) -> FimTokens | None:
    """The first family of `FAMILIES` whose three markers are single tokens of `tokenizer`, or None."""
    vocab = tokenizer.get_vocab()
    for names in FAMILIES:
        if all(n in vocab for n in names):
            return FimTokens(*(vocab[n] for n in names))
    return None
