"""How far a growing text is the beginning of a JSON object or array, read once.

A tool call's argument text arrives a few characters at a time; the Anthropic route
(`tokenizer_proc.anthropic.render`) streams it only as far as it begins a JSON value that the SDK's stream accumulator can read (it re-parses all
the text after each delta with ``jiter``'s partial mode and raises on text that is not
JSON). `JsonPrefix` follows the text character by character (a state machine over RFC 8259's
grammar), so a call of N characters costs O(N); re-parsing the text on each delta cost
O(N^2) (a 20 KB argument of small objects: 0.5 s of the tokenizer's loop).

It is stricter than ``jiter``'s partial mode, never laxer, so every prefix it gives parses
there (and in ``pydantic_core.from_json(allow_partial=True)``) to a value that also
serializes as JSON: the text begins with the ``{`` or ``[`` of its top-level object or array
(a tool call's arguments, as the tool parsers give them, begin with their ``{``), with
nothing after it but whitespace; ``NaN`` and ``Infinity`` are not JSON, nor is a number
whose value overflows a double (``1e400``) or an integer of more than `MAX_INT_DIGITS`
digits; a surrogate escape must be half of a pair; at most `MAX_DEPTH` nested containers.
``jiter`` reads on past some faults (``[true false]`` as ``[true]``); the text stops at them.

A number is given only once it has ended (the character after it is read): partial JSON
reads ``{"n": 12`` as ``{"n": 12}``, which the next digit could make 123 or an overflow,
while an unfinished string or literal is left out of the value.
"""

from __future__ import annotations

import math

import pydantic_core

MAX_DEPTH = 200
"""Nested containers allowed (``jiter``'s recursion limit is 200: deeper is an error there)."""
MAX_INT_DIGITS = 4300
"""Digits an integer may have (Python's int/str conversion limit: ``jiter`` refuses more)."""
_WS = frozenset(" \t\n\r")
_ESCAPES = frozenset('"\\/bfnrtu')
_HEX = frozenset("0123456789abcdefABCDEF")
_DIGITS = frozenset("0123456789")
_LITERALS = {"t": "true", "f": "false", "n": "null"}
_CLOSER = {"{": "}", "[": "]"}
_NUMBER = {  # a number's part -> {character class: the part it leads to}, by JSON's grammar
    "sign": {"0": "zero", "1": "int"},
    "zero": {".": "point", "e": "e"},
    "int": {"0": "int", "1": "int", ".": "point", "e": "e"},
    "point": {"0": "frac", "1": "frac"},
    "frac": {"0": "frac", "1": "frac", "e": "e"},
    "e": {"+": "esign", "0": "exp", "1": "exp"},
    "esign": {"0": "exp", "1": "exp"},
    "exp": {"0": "exp", "1": "exp"},
}
_NUMBER_END = frozenset({"zero", "int", "frac", "exp"})
"""The parts a number may end in ("-", "1.", "1e", "1e+" are unfinished)."""
_NUMBER_CLASS = {**{d: "1" for d in "123456789"}, "0": "0", ".": ".", "e": "e", "E": "e", "+": "+", "-": "+"}
"""A number's character -> its class in `_NUMBER` (0, 1 for 1-9, ., e for e/E, + for +/-)."""


class JsonPrefix:
    """The longest prefix of a text, fed in pieces, that begins a JSON object or array, less
    a number still being written (see the module docstring). Once a character cannot
    continue JSON nothing after it is read: no text that begins so is JSON."""

    def __init__(self) -> None:
        self._broken = False
        self._pending = ""  # the number being written: read, not given yet
        self._stack: list[str] = []  # the open containers, "{" or "["
        # start, key_or_end, key, colon, value_or_end, value, after, done, string, escape, hex, number, literal
        self._state = "start"
        self._key = False  # the open string is an object's key
        self._hex = ""  # the digits of a \\u escape so far
        self._high = False  # the last escape was a high surrogate: its low half must follow
        self._token = ""  # the number or literal being read
        self._part = ""  # the number's part (`_NUMBER`)

    @property
    def broken(self) -> bool:
        """A character read so far cannot continue JSON (nothing after it is read)."""
        return self._broken

    def feed(self, text: str) -> str:
        """Read `text`, the next piece of the text; returns what the whole text so far adds
        to the prefix (the texts returned, joined, are the prefix): ``""`` once it has
        stopped being JSON."""
        taken = 0
        for ch in text:
            if self._broken or not self._step(ch):
                self._broken = True
                break
            taken += 1
        read = self._pending + text[:taken]
        held = len(self._token) if self._state == "number" else 0
        self._pending = read[len(read) - held :]
        return read[: len(read) - held]

    def _step(self, ch: str) -> bool:
        """Read one character; False: it cannot continue JSON."""
        state = self._state
        if state == "string":
            return self._in_string(ch)
        if state == "escape":
            if ch not in _ESCAPES or (self._high and ch != "u"):
                return False
            self._state, self._hex = ("hex" if ch == "u" else "string"), ""
            return True
        if state == "hex":
            return self._in_hex(ch)
        if state == "number":
            return self._in_number(ch)
        if state == "literal":
            word = _LITERALS[self._token[0]]
            if ch != word[len(self._token)]:
                return False
            self._token += ch
            if self._token == word:
                self._state = "after"
            return True
        if ch in _WS:
            return state != "start"  # whitespace alone is no JSON to jiter
        if state in ("start", "value", "value_or_end"):
            if state == "value_or_end" and ch == "]":
                return self._close()
            return self._value(ch, top=state == "start")
        if state in ("key_or_end", "key"):
            if ch == '"':
                self._state, self._key = "string", True
                return True
            return state == "key_or_end" and ch == "}" and self._close()
        if state == "colon":
            self._state = "value"
            return ch == ":"
        if state == "after":
            return self._after_value(ch)
        return False  # done: nothing but whitespace after the top-level value

    def _value(self, ch: str, top: bool) -> bool:
        if ch in _CLOSER:
            if len(self._stack) >= MAX_DEPTH:
                return False
            self._stack.append(ch)
            self._state = "key_or_end" if ch == "{" else "value_or_end"
            return True
        if top:
            return False  # arguments are an object: a top-level scalar is no input
        if ch == '"':
            self._state, self._key = "string", False
            return True
        if ch == "-" or ch in _DIGITS:
            self._state, self._token = "number", ch
            self._part = "sign" if ch == "-" else _NUMBER["sign"][_NUMBER_CLASS[ch]]
            return True
        if ch in _LITERALS:
            self._state, self._token = "literal", ch
            return True
        return False

    def _after_value(self, ch: str) -> bool:
        self._state = "after"
        if ch in _WS:
            return True
        if ch == ",":
            self._state = "key" if self._stack[-1] == "{" else "value"
            return True
        return ch == _CLOSER[self._stack[-1]] and self._close()

    def _close(self) -> bool:
        self._stack.pop()
        self._state = "after" if self._stack else "done"
        return True

    def _in_string(self, ch: str) -> bool:
        if ch == "\\":
            self._state = "escape"
            return True
        if self._high:
            return False  # a high surrogate's escape not followed by its low half's
        if ch == '"':
            self._state = "colon" if self._key else "after"
            return True
        return ch >= " "

    def _in_hex(self, ch: str) -> bool:
        if ch not in _HEX:
            return False
        self._hex += ch
        if len(self._hex) < 4:
            return True
        code = int(self._hex, 16)
        if self._high != (0xDC00 <= code <= 0xDFFF):  # a low half exactly after a high one
            return False
        self._high = 0xD800 <= code <= 0xDBFF
        self._state = "string"
        return True

    def _in_number(self, ch: str) -> bool:
        kind = _NUMBER_CLASS.get(ch)
        if kind is None:  # the number has ended
            return self._part in _NUMBER_END and self._after_value(ch)
        part = _NUMBER[self._part].get(kind)
        token = self._token + ch
        if part is None:  # 01, 1.., 1e5.: not JSON
            return False
        if part in ("zero", "int") and len(token) - token.startswith("-") > MAX_INT_DIGITS:
            return False
        overflows = part == "exp" or (part == "frac" and token.index(".") > 300)  # else below 1e301
        if overflows and math.isinf(float(token)):
            return False  # 1e400: a double's infinity, not JSON
        self._token, self._part = token, part
        return True


def prefix_object(text: str) -> tuple[dict, bool]:
    """The object that `text` begins, read as the SDKs read partial JSON: its members as far as
    the text is JSON (`JsonPrefix`; an unfinished member is left out, so a call cut by the token
    limit keeps its finished members), {} when the text does not begin an object; and whether
    all of the text is the beginning of one (True for ``""``)."""
    prefix = JsonPrefix()
    read = prefix.feed(text)
    value = pydantic_core.from_json(read, allow_partial=True) if read else {}
    return (value if isinstance(value, dict) else {}), not prefix.broken
