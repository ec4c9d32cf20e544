"""The incremental tool-call parser shared by the JSON-call families.

A model writes a tool call as a JSON object ``{"name": ..., "arguments": {...}}`` (Llama
says ``"parameters"``) inside family markup: ``<tool_call>...</tool_call>`` (Hermes, Qwen),
``[TOOL_CALLS][...]`` (Mistral), a bare object at the start of the output (Llama 3 JSON).
`ToolParser` reads the output text piece by piece, as it streams, and says what each piece
adds: content text, a call's start (its index, id and name) and its arguments in pieces.

Streamed and non-streamed responses run the same parser over the same text deltas
(`chat_output.ChatOutput`), so both give the same calls; `parse_text` reads a whole text. Text that may be the start of markup is held back
until it is known; markup whose call header (``{"name": "...", "arguments": {``) does not
parse is given back as content, as is a section that the output ends in before its header
completed; when the token limit cut the output there (``finish(cut=True)``), that section and
a held-back start of markup are dropped instead: the model was writing markup (a forced call
always is), and half a marker is no text the model meant (the cut-off end of a section whose
calls completed is dropped either way: it is markup). Once
a call's name is out, its arguments are the model's JSON text as written (a string); their
end is found by counting brackets outside strings, so no argument text is held back.
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass, field
from typing import ClassVar

import regex

JSON_HEADER = r'\s*\{\s*"name"\s*:\s*"(?P<name>(?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*\{'
"""A JSON call's header, up to and including the ``{`` that opens its arguments; group
``name``: the function name as JSON string text (escapes undecoded)."""


def new_call_id() -> str:
    """A fresh OpenAI-style tool call id, ``call_`` and 24 hex digits."""
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class CallDelta:
    """What one piece adds to call `index` (0-based, in output order): its id and name the
    first time (None after), then argument text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass
class ParsedDelta:
    """What one piece of output adds: content text and call deltas, as `parts` in the order
    the model wrote them (a call may end and text follow it in one piece; adjacent text is
    one part)."""

    parts: list[str | CallDelta] = field(default_factory=list)

    def add_text(self, text: str) -> None:
        """Append content `text` (nothing for "")."""
        if text and self.parts and isinstance(self.parts[-1], str):
            self.parts[-1] += text
        elif text:
            self.parts.append(text)

    def add_call(self, delta: CallDelta) -> None:
        """Append call delta `delta`."""
        self.parts.append(delta)

    def extend(self, other: ParsedDelta) -> None:
        """Append `other`'s parts to this one's."""
        for part in other.parts:
            if isinstance(part, str):
                self.add_text(part)
            else:
                self.add_call(part)

    @property
    def content(self) -> str:
        """All the content text, joined."""
        return "".join(p for p in self.parts if isinstance(p, str))

    @property
    def calls(self) -> list[CallDelta]:
        """All the call deltas, in order."""
        return [p for p in self.parts if not isinstance(p, str)]


@dataclass
class ToolCall:
    """A parsed call: id, function name, arguments as JSON text; complete: its arguments
    object closed and JSON (False for a call cut off by the token limit, and for arguments
    that are not JSON, NaN or 1e400 in them included)."""

    id: str
    name: str
    arguments: str = ""
    complete: bool = False

    def openai(self) -> dict:
        """The call in OpenAI's ``message.tool_calls`` shape."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _not_json(constant: str) -> float:
    """``json.loads``'s hook for NaN and Infinity: Python reads them, JSON has no such value.
    Raises ValueError."""
    raise ValueError(f"{constant} is not JSON")


def _finite(number: str) -> float:
    """``json.loads``'s hook for a number with a fraction or exponent: its value, ValueError
    when it overflows a double (``1e400``: JSON parsers differ on it, none can send it back)."""
    value = float(number)
    if math.isinf(value):
        raise ValueError(f"{number} overflows a double")
    return value


def is_call_object(arguments: str) -> bool:
    """Whether a call's `arguments` text is a whole JSON object (no NaN or Infinity, no number
    that overflows a double): False for arguments cut short or not JSON."""
    try:
        return isinstance(json.loads(arguments, parse_constant=_not_json, parse_float=_finite), dict)
    except (ValueError, RecursionError):
        return False


def _prefix_len(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ToolParser:
    """One choice's tool-call parser (one instance per choice; see the module docstring).

    A family sets: `OPEN` (markers that start a tool section in text; the first one found
    wins), `OPEN_AT_START` (a call may begin the output with no marker), `FIRST` (regex
    before the first call of a section), `HEADER` (a call up to the ``{`` of its arguments,
    the name in group ``name``), `NEXT` (between calls), `CLOSE` (ending the section; what
    follows is text again, which may open another section). `SPECIAL_MARKERS` are markers
    that tokenizers may hold as special tokens (the detokenizer must keep them). `GRAMMAR`
    (before the calls, between two, after them) and `ARGUMENTS_KEY` spell the calls a
    grammar writes, `TRIGGER` where a strict ``auto`` grammar starts.
    """

    OPEN: ClassVar[tuple[str, ...]] = ()
    OPEN_AT_START: ClassVar[bool] = False
    FIRST: ClassVar[str] = r"\s*"
    HEADER: ClassVar[str] = JSON_HEADER
    NEXT: ClassVar[str] = r"(?!)"
    CLOSE: ClassVar[str] = r""
    SPECIAL_MARKERS: ClassVar[tuple[str, ...]] = ()
    TRIGGER: ClassVar[str | None] = None
    """The text that starts a call anywhere in the output, a prefix of ``GRAMMAR[0]``: where
    a strict ``auto`` grammar starts enforcing (`tools.grammar.auto_calls`); None: a call only
    begins the output (`OPEN_AT_START`)."""

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []
        self._buf = ""  # unconsumed text
        self._raw = ""  # the current section's text so far (given back as content if it fails)
        self._state = "start" if self.OPEN_AT_START else "text"
        self._depth = 0  # bracket depth inside the current arguments
        self._in_string = False
        self._escape = False
        self._first, self._header, self._next, self._close = (
            regex.compile(p) for p in (self.FIRST, self.HEADER, self.NEXT, self.CLOSE)
        )

    # ------------------------------------------------------------------ public
    def feed(self, text: str) -> ParsedDelta:
        """Parse the next piece of output; returns what it adds (some of it may be held back)."""
        self._buf += text
        out = ParsedDelta()
        while self._step(out, final=False):
            pass
        return out

    def finish(self, cut: bool = False) -> ParsedDelta:
        """The output has ended: return what was held back (an unfinished section's text as
        content, unless its call had started). cut: the token limit ended it, so a section
        whose call header had not completed, or held-back text that may begin a marker, is
        markup cut short: dropped, not content."""
        out = ParsedDelta()
        if cut and self._state in ("first", "header"):
            self._buf, self._raw, self._state = "", "", "text"  # feed left only a partial header here
        elif cut and self._state == "text":
            hold = max((_prefix_len(self._buf, m) for m in self.OPEN), default=0)
            self._buf = self._buf[: len(self._buf) - hold]
        elif cut and self._state == "after" and self._next.fullmatch(self._buf, partial=True):
            self._buf = ""  # the markup between two calls, cut before the next one's header
        while self._step(out, final=True):
            pass
        if self._state != "args":
            out.add_text(self._raw + self._buf)
        self._buf, self._raw = "", ""
        return out

    @property
    def complete(self) -> bool:
        """Every call parsed so far has closed arguments holding a JSON object."""
        return all(c.complete for c in self.calls)

    # ------------------------------------------------------------------ states
    def _step(self, out: ParsedDelta, final: bool) -> bool:
        """Advance once; False when the buffer needs more text (or is exhausted)."""
        return getattr(self, f"_in_{self._state}")(out, final)

    def _match(self, pattern: regex.Pattern, final: bool) -> int | None:
        """Where `pattern` ends when it matches at the buffer's start; -1: wait for more text
        (a partial match, or a full one at the buffer's end that may go on); None: no match."""
        m = pattern.match(self._buf, partial=True)
        if m is None or (m.partial and final):
            return None
        if not final and (m.partial or m.end() == len(self._buf)):
            return -1
        return m.end()

    def _in_start(self, out: ParsedDelta, final: bool) -> bool:
        stripped = self._buf.lstrip()
        if not stripped:
            return False
        self._state = "header" if stripped[0] == "{" else "text"  # a bare call may begin the output
        return True

    def _in_text(self, out: ParsedDelta, final: bool) -> bool:
        hits = [(i, m) for m in self.OPEN if (i := self._buf.find(m)) >= 0]
        if hits:
            i, marker = min(hits)
            out.add_text(self._buf[:i])
            self._raw, self._buf, self._state = marker, self._buf[i + len(marker) :], "first"
            return True
        hold = 0 if final else max((_prefix_len(self._buf, m) for m in self.OPEN), default=0)
        out.add_text(self._buf[: len(self._buf) - hold])
        self._buf = self._buf[len(self._buf) - hold :]
        return False

    def _in_first(self, out: ParsedDelta, final: bool) -> bool:
        end = self._match(self._first, final)
        if end is None:
            return self._fail(out)
        if end < 0:
            return False
        self._raw += self._buf[:end]
        self._buf, self._state = self._buf[end:], "header"
        return True

    def _in_header(self, out: ParsedDelta, final: bool) -> bool:
        if not self._buf and not final:
            return False
        m = self._header.match(self._buf, partial=True)
        if m is None or (m.partial and final):
            return self._fail(out)
        if m.partial:
            return False
        try:
            name = json.loads(f'"{m.group("name")}"')
        except ValueError:
            return self._fail(out)
        call = ToolCall(new_call_id(), name, "{")
        self.calls.append(call)
        out.add_call(CallDelta(len(self.calls) - 1, call.id, name, "{"))
        self._buf, self._raw, self._state = self._buf[m.end() :], "", "args"
        self._depth, self._in_string, self._escape = 1, False, False
        return True

    def _in_args(self, out: ParsedDelta, final: bool) -> bool:
        end = self._scan()
        piece, self._buf = self._buf[:end], self._buf[end:]
        call = self.calls[-1]
        if piece:
            call.arguments += piece
            out.add_call(CallDelta(len(self.calls) - 1, arguments=piece))
        if self._depth:
            return False
        call.complete = is_call_object(call.arguments)
        self._state = "outer"
        return True

    def _in_outer(self, out: ParsedDelta, final: bool) -> bool:
        """After the arguments: the ``}`` that closes the call object (skipped if absent;
        keys after the arguments, such as Mistral's ``"id"``, are skipped with it)."""
        stripped = self._buf.lstrip()
        if not stripped and not final:
            return False
        if stripped.startswith(","):
            self._buf, self._state = stripped, "rest"
            self._depth, self._in_string, self._escape = 1, False, False
            return True
        if stripped.startswith("}"):
            self._buf = stripped[1:]
        self._state = "after"
        return True

    def _in_rest(self, out: ParsedDelta, final: bool) -> bool:
        """The call object's keys after its arguments, up to its closing ``}``."""
        end = self._scan()
        self._buf = self._buf[end:]
        if self._depth and not final:
            return False
        self._state = "after"
        return True

    def _in_after(self, out: ParsedDelta, final: bool) -> bool:
        """Between calls: another call of the section, the section's end, or text."""
        for pattern, state in ((self._next, "header"), (self._close, "text")):
            end = self._match(pattern, final)
            if end is not None and end < 0:
                return False
            if end is not None:
                self._raw = self._buf[:end] if state == "header" else ""
                self._buf, self._state = self._buf[end:], state
                return True
        if final and self._close.fullmatch(self._buf, partial=True):
            self._buf = ""  # the section's end, cut off by the token limit: markup, not content
            return False
        self._state = "text"
        return True

    def _fail(self, out: ParsedDelta) -> bool:
        """The section is not a call: its text so far is content, and what broke the markup;
        the rest is parsed as text again."""
        out.add_text(self._raw)
        self._raw, self._state = "", "text"
        if not self._buf:
            return False
        out.add_text(self._buf[0])
        self._buf = self._buf[1:]
        return True

    def _scan(self) -> int:
        """Index just past the end of the arguments object in the buffer, or the buffer's
        length while it goes on (tracks depth, strings and escapes across pieces)."""
        for i, ch in enumerate(self._buf):
            if self._in_string:
                if self._escape:
                    self._escape = False
                elif ch == "\\":
                    self._escape = True
                elif ch == '"':
                    self._in_string = False
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    return i + 1
        return len(self._buf)


def parse_text(parser: ToolParser, text: str) -> ParsedDelta:
    """The whole of `text` through a fresh `parser`: all its content and call deltas."""
    out = parser.feed(text)
    out.extend(parser.finish())
    return out
