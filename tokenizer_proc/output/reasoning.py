"""Reasoning parsers (``--reasoning-parser``): the ``<think>…</think>`` family.

Qwen3, DeepSeek-R1 distills and SmolLM3 write their reasoning between ``<think>`` and
``</think>``; `ReasoningParser` splits the output, piece by piece as it streams, into
reasoning text and content (what the response shows as ``reasoning_content`` and
``content``). Tag text that may be the start of a tag is held back until it is known, so a
tag split across pieces never leaks. Streamed and non-streamed responses run the same
parser, so both split alike.

Where the output starts: a chat template that opens the think block in the prompt (R1
distills, Qwen3 thinking models) leaves the output inside it, with only ``</think>`` to come;
one that closes an empty block in the prompt (``enable_thinking: false``) leaves it outside.
`starts_in_reasoning` reads that from the rendered prompt; ``deepseek_r1`` also starts
inside when the prompt shows no tag (older R1 templates add none).
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN, CLOSE = "<think>", "</think>"

REASONING_PARSERS: dict[str, bool] = {"qwen3": False, "smollm3": False, "deepseek_r1": True, "think": False}
"""Parser name -> whether the output starts inside the reasoning when the prompt shows no tag."""


@dataclass
class ReasoningDelta:
    """What one piece of output adds: reasoning text and content text."""

    reasoning: str = ""
    content: str = ""


def starts_in_reasoning(name: str, prompt: str) -> bool:
    """Whether the output of parser `name` begins inside a think block, given the rendered
    prompt text (the last tag in it decides; with no tag, the parser's default).
    Raises `KeyError` for an unknown name."""
    default = REASONING_PARSERS[name]
    opened, closed = prompt.rfind(OPEN), prompt.rfind(CLOSE)
    if opened < 0 and closed < 0:
        return default
    return opened > closed


def _held(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningParser:
    """One choice's splitter. in_reasoning: the output starts inside a think block (see
    `starts_in_reasoning`). Only the first block counts: a ``<think>`` after the first
    ``</think>`` is content, as is everything once the reasoning has ended."""

    def __init__(self, in_reasoning: bool = False) -> None:
        self.in_reasoning = in_reasoning
        self.opened = in_reasoning  # the output has (had) a think block
        self.done = False  # the think block has closed: the rest is content
        self._buf = ""
        self._lead = False  # just after </think>: leading whitespace is dropped

    def feed(self, text: str) -> ReasoningDelta:
        """Split the next piece of output (a tag's possible start is held back)."""
        self._buf += text
        out = ReasoningDelta()
        while self._buf:
            if self.done:
                if self._lead:  # the whitespace between </think> and the answer is neither
                    self._buf = self._buf.lstrip()
                    self._lead = not self._buf
                out.content += self._buf
                self._buf = ""
            elif self.in_reasoning:
                i = self._buf.find(CLOSE)
                if i < 0:
                    keep = _held(self._buf, CLOSE)
                    out.reasoning += self._buf[: len(self._buf) - keep]
                    self._buf = self._buf[len(self._buf) - keep :]
                    break
                out.reasoning += self._buf[:i]
                self._buf, self.in_reasoning, self.done = self._buf[i + len(CLOSE) :], False, True
                self._lead = True
            else:
                stripped = self._buf.lstrip()
                if stripped.startswith(OPEN):
                    self._buf, self.in_reasoning, self.opened = stripped[len(OPEN) :], True, True
                elif not stripped or OPEN.startswith(stripped):
                    break  # leading whitespace, or the start of <think>
                else:
                    self.done = True  # the output does not open with a think block
        return out

    def finish(self) -> ReasoningDelta:
        """The output has ended: what was held back (unclosed reasoning stays reasoning),
        except the start of a ``</think>`` that never completed (``</``, ``</thi``...): markup
        cut short, by the token limit or a stop string, most often inside the tag a reasoning
        budget forces (its tokens ``</``, ``think``, ``>``), is not reasoning text. A lone
        ``<`` stays text."""
        out = ReasoningDelta()
        if self.in_reasoning:
            out.reasoning = "" if len(self._buf) >= 2 else self._buf  # held: a proper prefix of CLOSE
        elif not self._lead:
            out.content = self._buf
        self._buf = ""
        return out
