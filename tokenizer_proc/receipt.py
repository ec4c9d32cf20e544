"""`Receipt`: how much of one request's text the HTTP process has received, so that text is
passed on exactly once even when a detokenizer replica is lost mid-stream (DESIGN.md §7).

Every text row carries its offset in the request's text (`BatchStrOut.text_offsets`). After
a replica is lost, its replacement renders the text again from the start and sends what
follows the count the tokenizer reported, while text the lost replica had in flight may
still arrive; both are the same text at the same offsets, so keeping only what lies past
what was received gives the client every character once, in order.
"""

from __future__ import annotations

from dataclasses import dataclass


class TextGap(ValueError):
    """A row starts past the text received so far: text was lost (a bug, never expected)."""


@dataclass
class Receipt:
    """chars: characters (code points) received; completion_tokens: the highest count seen;
    ended: the final row or an error arrived (later rows are ignored)."""

    chars: int = 0
    completion_tokens: int = 0
    ended: bool = False

    def accept(self, text: str, offset: int, completion_tokens: int, final: bool) -> str | None:
        """Take a row whose `text` starts at character `offset`; return the part not yet
        received, or None when the row adds nothing (a repeat that does not end the request).
        Raises `TextGap` when offset lies past the text received."""
        if offset > self.chars:
            raise TextGap(f"text from character {offset} arrived, but only {self.chars} characters came before it")
        new = text[self.chars - offset:] if offset < self.chars else text
        if not new and offset < self.chars and not final:
            return None
        self.chars += len(new)
        self.completion_tokens = max(self.completion_tokens, completion_tokens)
        self.ended = self.ended or final
        return new
