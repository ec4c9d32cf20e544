"""`Receipt`: how much of one request's text the HTTP process has received, so that text is
passed on exactly once even when a detokenizer replica is lost mid-stream (DESIGN.md §7).

Every text row carries its offset in the request's text (`BatchStrOut.text_offsets`). After
a replica is lost, its replacement renders the text again from the start and sends what
follows the count the tokenizer reported, while text the lost replica had in flight may
still arrive; both are the same text at the same offsets, so keeping only what lies past
what was received gives the client every character once, in order. Logprob entries work
the same way, counted in entries (`LogprobEntries.start`); the prompt's entries come once.
"""

from __future__ import annotations

from dataclasses import dataclass

from msgspec.structs import replace

from protocol.messages import LogprobEntries


class TextGap(ValueError):
    """A row starts past the text (or logprob entries) received so far: output was lost (a
    bug, never expected)."""


@dataclass
class Receipt:
    """chars: characters (code points) received; completion_tokens: the highest count seen;
    ended: the final row or an error arrived (later rows are ignored); entries: output
    logprob entries received; prompt_entries: the prompt's logprob entries arrived."""

    chars: int = 0
    completion_tokens: int = 0
    ended: bool = False
    entries: int = 0
    prompt_entries: bool = False

    def accept(self, text: str, offset: int, completion_tokens: int, final: bool) -> str | None:
        """Take a row whose `text` starts at character `offset`; return the part not yet
        received, or None when the row adds nothing (a repeat that does not end the request).
        Raises `TextGap` when offset lies past the text received."""
        if offset > self.chars:
            raise TextGap(f"text from character {offset} arrived, but only {self.chars} characters came before it")
        self.completion_tokens = max(self.completion_tokens, completion_tokens)
        new = text[self.chars - offset :] if offset < self.chars else text
        if not new and offset < self.chars and not final:
            return None
        self.chars += len(new)
        self.ended = self.ended or final
        return new

    def accept_entries(self, entries: LogprobEntries | None) -> LogprobEntries | None:
        """Take a row's output logprob entries; return those not yet received (their start
        moved past the ones dropped), or None when there are none. Raises `TextGap` when
        they start past the entries received."""
        if entries is None:
            return None
        if entries.start > self.entries:
            raise TextGap(f"logprob entries from {entries.start} arrived, but only {self.entries} came before them")
        skip = self.entries - entries.start
        if skip >= len(entries.token_ids):
            return None
        self.entries = entries.start + len(entries.token_ids)
        return entries if not skip else _entries_from(entries, skip)

    def accept_prompt_entries(self, entries: LogprobEntries | None) -> LogprobEntries | None:
        """Take the prompt's logprob entries the first time they arrive (None after)."""
        if entries is None or self.prompt_entries:
            return None
        self.prompt_entries = True
        return entries


def _entries_from(entries: LogprobEntries, skip: int) -> LogprobEntries:
    """`entries` less its first `skip` (every column is per entry)."""
    columns = {f: getattr(entries, f)[skip:] for f in entries.__struct_fields__ if f != "start"}
    return replace(entries, start=entries.start + skip, **columns)
