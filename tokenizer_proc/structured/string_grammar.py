"""The grammar of JSON-schema strings that xgrammar gets wrong, written by us: string
``pattern``s (and ``patternProperties`` keys, ``propertyNames`` patterns), ``minLength`` /
``maxLength``, and the ``format``s in `FORMAT_PATTERNS`.

What xgrammar 0.2.9 does with them, measured with its matcher:

- A pattern goes to one of two regex engines, and the value is written raw between the
  quotes. The byte automaton (taken when the pattern is printable ASCII that it parses)
  leaves out ``"``, ``\\`` and control characters, so ``[^"]*"`` or ``.*\\\\`` can then
  match nothing and fall to the other engine, as does any pattern with another character
  (``[а-я]+``, ``é.*``): that one converts the regex as is, so ``.``, negated classes and
  ``\\S`` write a raw ``"`` (the string ends early: invalid JSON), a raw ``\\`` or control
  character. The byte automaton also skips lookaheads (``(?!a)[a-z]+`` let ``"a"``
  through), and an anchor inside the pattern is dropped (``a^b`` wrote ``"ab"``, though
  the pattern matches no string).
- ``minLength`` / ``maxLength`` become ``[^"\\\\\\r\\n]{m,n}``: raw tabs and other control
  characters (invalid JSON), and no escapes.
- ``format``: ``date`` and ``date-time`` allow the 31st of every month, the 30th of
  February and the year 0000 (Python refuses it), ``time`` a 60th second at any minute, ``ipv4`` leading zeros (``01.2.3.4``,
  which Python's ``ipaddress`` refuses), ``json-pointer`` raw control characters, ``"`` and
  ``\\``.

`schema_ebnf` hands xgrammar the schema with each of those replaced by a placeholder
pattern (a plain word, which xgrammar prints as its ``Regex(...)`` rule), and then puts our
rule in the placeholder's place in the grammar xgrammar printed. Our rule matches the JSON
text of the strings the pattern matches in full (as xgrammar reads a pattern: an implicit
``^...$``): each character the pattern allows is written raw when JSON allows that, else
as its JSON escape (``\\"``, ``\\\\``, ``\\n``, ``\\u0001``). Characters are Unicode code
points (``.{3}`` is three characters however many bytes); a character is allowed only when
it matches under both ECMA-262 (the schema's dialect) and Python's ``re`` (which
``jsonschema`` and pydantic's checks use): ``\\d`` is ``[0-9]``, ``.`` excludes line
terminators, ``\\W`` excludes non-ASCII letters. Surrogates are never written.

Patterns are parsed here (ECMA-262 syntax, the subset both dialects read alike); what the
grammar cannot enforce is refused (`PatternError`): lookarounds, backreferences, word
boundaries, inline flags, an anchor that is not at the start or end of the pattern (or of
an alternative there), a ``{`` that is not a quantifier, a pattern that matches no string.
"""

from __future__ import annotations

import functools
import json
import re
import secrets
from dataclasses import dataclass

import xgrammar

from protocol.grammar import JSON_SCHEMA_OPTIONS, canonical_json

MAX_CHAR = 0x10FFFF
_SURROGATES = ((0xD800, 0xDFFF),)
_JSON_ESCAPED = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C))
"""Characters a JSON string must escape: control characters, ``"`` and ``\\``."""

_YEAR = r"(?:[1-9]\d{3}|0[1-9]\d\d|00[1-9]\d|000[1-9])"  # 0000 is not a year to Python
_LEAP_YEAR = r"(?:\d\d(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_DATE = (
    rf"(?:{_YEAR}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\d|30)"
    rf"|02-(?:0[1-9]|1\d|2[0-8]))|{_LEAP_YEAR}-02-29)"
)
_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:\.\d{1,9})?(?:Z|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_POINTER = r"(?:/(?:[^/~]|~[01])*)*"
FORMAT_PATTERNS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": f"{_DATE}T{_TIME}",
    "ipv4": rf"{_OCTET}(?:\.{_OCTET}){{3}}",
    "json-pointer": _POINTER,
    "relative-json-pointer": rf"(?:0|[1-9]+0?)(?:#|{_POINTER})",
}
"""Formats whose values xgrammar writes wrong, as our patterns: real dates only (and
February 29th of leap years), no leap second (it is valid only at 23:59:60 UTC), no
leading zeros in an IPv4 octet, JSON pointers with any character escaped as JSON needs.
A relative JSON pointer's number has no 0 before another digit: ``jsonschema``'s check
refuses ``105`` (it reads any such 0 as a leading zero)."""

_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_ONE = (
    "items",
    "additionalProperties",
    "propertyNames",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedItems",
    "unevaluatedProperties",
    "additionalItems",
)
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
"""Where a schema holds subschemas: under a map's values, a key, or a list's items."""


class PatternError(ValueError):
    """A string pattern the grammar cannot enforce; the message says why, for the client."""


# ------------------------------------------------------------------ character sets
def _normal(ranges) -> tuple[tuple[int, int], ...]:
    """`ranges` ((lo, hi) code point pairs, inclusive) sorted and merged."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def _complement(ranges) -> tuple[tuple[int, int], ...]:
    """The code points 0..`MAX_CHAR` not in `ranges` (normal)."""
    out, start = [], 0
    for lo, hi in ranges:
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CHAR:
        out.append((start, MAX_CHAR))
    return tuple(out)


def _intersect(a, b) -> tuple[tuple[int, int], ...]:
    """The code points in both `a` and `b` (normal)."""
    return _complement(_normal(_complement(a) + _complement(b)))


@functools.cache
def _python_classes() -> dict[str, tuple[tuple[int, int], ...]]:
    """The code points Python's ``re`` matches with ``\\d``, ``\\w`` and ``\\s`` in a str pattern
    (Unicode classes), by letter: found once, by searching all code points (~0.2 s)."""
    text = "".join(map(chr, range(MAX_CHAR + 1)))  # a character's index is its code point
    return {letter: tuple((m.start(), m.end() - 1) for m in re.finditer(f"\\{letter}+", text)) for letter in "dws"}


@dataclass(frozen=True)
class _Chars:
    """One character of a pattern: the code points it matches under ECMA-262 and under
    Python's ``re`` (normal ranges); a negated class negates each."""

    ecma: tuple[tuple[int, int], ...]
    python: tuple[tuple[int, int], ...]

    @staticmethod
    def of(*ranges) -> _Chars:
        same = _normal(ranges)
        return _Chars(same, same)

    def negated(self) -> _Chars:
        return _Chars(_complement(self.ecma), _complement(self.python))

    def __or__(self, other: _Chars) -> _Chars:
        return _Chars(_normal(self.ecma + other.ecma), _normal(self.python + other.python))

    def allowed(self) -> tuple[tuple[int, int], ...]:
        """What the grammar writes: the code points both dialects match, less surrogates."""
        return _intersect(_intersect(self.ecma, self.python), _complement(_SURROGATES))


_ECMA_SPACE = (
    (0x09, 0x0D),
    (0x20, 0x20),
    (0xA0, 0xA0),
    (0x1680, 0x1680),
    (0x2000, 0x200A),
    (0x2028, 0x2029),
    (0x202F, 0x202F),
    (0x205F, 0x205F),
    (0x3000, 0x3000),
    (0xFEFF, 0xFEFF),
)


def _class_escape(letter: str) -> _Chars:
    """``\\d``, ``\\w``, ``\\s`` and their negations (upper case)."""
    lower = letter.lower()
    ecma = {"d": ((0x30, 0x39),), "w": ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)), "s": _ECMA_SPACE}[
        lower
    ]
    chars = _Chars(ecma, _python_classes()[lower])
    return chars.negated() if letter.isupper() else chars


_DOT = _Chars(_complement(((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029))), _complement(((0x0A, 0x0A),)))
ANY_CHAR = _Chars.of((0, MAX_CHAR))


# ------------------------------------------------------------------ parsing
@dataclass(frozen=True)
class _Term:
    """An atom and its repetition: node is `_Chars`, a group (a list of alternatives, each
    a list of terms), or an anchor (``"^"`` / ``"$"``); high None is unbounded."""

    node: object
    low: int = 1
    high: int | None = 1


_QUANTIFIER = re.compile(r"\{(\d+)(,(\d*))?\}")
_CONTROL_ESCAPES = {"t": 0x09, "n": 0x0A, "v": 0x0B, "f": 0x0C, "r": 0x0D}


class _Parser:
    """A recursive-descent reader of one pattern (ECMA-262 syntax) into alternatives of
    `_Term`s; raises `PatternError` for what the grammar cannot enforce or the two dialects
    read differently."""

    def __init__(self, pattern: str) -> None:
        self.text, self.at = pattern, 0

    def fail(self, problem: str) -> PatternError:
        return PatternError(f"{problem} (at character {self.at + 1})")

    def peek(self, n: int = 1) -> str:
        return self.text[self.at : self.at + n]

    def parse(self) -> list[list[_Term]]:
        alternatives = self.disjunction()
        if self.at < len(self.text):  # only an unmatched ")" stops a disjunction early
            raise self.fail("unmatched `)`")
        return alternatives

    def disjunction(self) -> list[list[_Term]]:
        alternatives = [self.alternative()]
        while self.peek() == "|":
            self.at += 1
            alternatives.append(self.alternative())
        return alternatives

    def alternative(self) -> list[_Term]:
        terms: list[_Term] = []
        while self.at < len(self.text) and self.peek() not in "|)":
            node = self.atom()
            low, high = self.quantifier()
            if (low, high) != (1, 1) and node in ("^", "$"):
                raise self.fail("an anchor cannot be repeated")
            terms.append(_Term(node, low, high))
        return terms

    def quantifier(self) -> tuple[int, int | None]:
        c = self.peek()
        if c in ("*", "+", "?"):
            self.at += 1
            bounds = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        elif c == "{" and (m := _QUANTIFIER.match(self.text, self.at)):
            self.at = m.end()
            low = int(m.group(1))
            bounds = (low, low if m.group(2) is None else int(m.group(3)) if m.group(3) else None)
            if bounds[1] is not None and bounds[1] < low:
                raise self.fail("a repetition's upper bound is below its lower bound")
        else:
            return 1, 1
        if self.peek() == "?":  # lazy: the same strings
            self.at += 1
        if self.peek() and self.peek() in "*+?{":
            raise self.fail("nothing to repeat")
        return bounds

    def atom(self) -> object:
        c = self.peek()
        self.at += 1
        if c in ("^", "$"):
            return c
        if c == ".":
            return _DOT
        if c == "[":
            return self.char_class()
        if c == "(":
            return self.group()
        if c == "\\":
            found = self.escape()
            return _Chars.of((found, found)) if isinstance(found, int) else found
        if c in "*+?":
            self.at -= 1
            raise self.fail("nothing to repeat")
        if c == "{":
            self.at -= 1
            raise self.fail(
                "a `{` that does not start a repetition such as {2,5} is read differently by "
                "ECMA-262 and Python; write a literal { as \\{"
            )
        return _Chars.of((ord(c), ord(c)))

    def group(self) -> list[list[_Term]]:
        if self.peek() == "?":
            named = re.compile(r"\?<[A-Za-z_][A-Za-z0-9_]*>").match(self.text, self.at)  # ECMA's, not (?P<
            if self.peek(2) == "?:":
                self.at += 2
            elif named:
                self.at = named.end()
            elif self.peek(2) in ("?=", "?!") or self.peek(3) in ("?<=", "?<!"):
                raise self.fail("a lookahead or lookbehind cannot be enforced")
            else:
                raise self.fail("inline flags and other `(?` groups cannot be enforced")
        alternatives = self.disjunction()
        if self.peek() != ")":
            raise self.fail("missing `)`")
        self.at += 1
        return alternatives

    def char_class(self) -> _Chars:
        negated = self.peek() == "^"
        self.at += negated
        if self.peek() == "]":
            raise self.fail(
                "a `]` first in a class is read differently by ECMA-262 (an empty class) and Python "
                "(a literal ]); write \\]"
            )
        chars = _Chars.of()
        while self.peek() != "]":
            if not self.peek():
                raise self.fail("missing `]`")
            first = self.class_atom()
            if self.peek() == "-" and self.peek(2)[1:] not in ("]", ""):
                self.at += 1
                last = self.class_atom()
                if not (isinstance(first, int) and isinstance(last, int)) or last < first:
                    raise self.fail("invalid range in a character class")
                chars |= _Chars.of((first, last))
            else:
                chars |= first if isinstance(first, _Chars) else _Chars.of((first, first))
        self.at += 1
        return chars.negated() if negated else chars

    def class_atom(self) -> int | _Chars:
        """One member of a class: a code point, or a set (``\\d``)."""
        c = self.peek()
        self.at += 1
        if c != "\\":
            return ord(c)
        if self.peek() == "b":  # backspace inside a class
            self.at += 1
            return 0x08
        return self.escape()

    def escape(self) -> int | _Chars:
        """The escape after a backslash (already read): a code point, or a set (``\\d``)."""
        c = self.peek()
        if not c:
            raise self.fail("the pattern ends with a lone backslash")
        self.at += 1
        if c in "dDwWsS":
            return _class_escape(c)
        if c in _CONTROL_ESCAPES:
            return _CONTROL_ESCAPES[c]
        if c == "0" and not self.peek().isdigit():
            return 0
        if c in "xu":
            digits = 2 if c == "x" else 4
            hex_digits = self.peek(digits)
            if len(hex_digits) != digits or not all(h in "0123456789abcdefABCDEF" for h in hex_digits):
                raise self.fail(f"\\{c} needs {digits} hex digits")
            self.at += digits
            return int(hex_digits, 16)
        if c.isdigit() or c == "k":
            raise self.fail("a backreference (or an octal escape) cannot be enforced")
        if c in "bB":
            raise self.fail("a word boundary (\\b, \\B) cannot be enforced")
        if c.isalnum() or c == "_":
            raise self.fail(f"the escape \\{c} is not one both ECMA-262 and Python read alike")
        return ord(c)


# ------------------------------------------------------------------ EBNF
def _literal(text: str) -> str:
    """`text` as an EBNF string literal."""
    return json.dumps(text, ensure_ascii=False)


def _class_char(point: int) -> str:
    if chr(point).isascii() and chr(point).isalnum():
        return chr(point)
    return f"\\u{point:04x}" if point <= 0xFFFF else f"\\U{point:08x}"


class _Rules:
    """The EBNF rules of the strings of one grammar: one per pattern, one per character set
    used in them (shared); each matches JSON text, the string's escapes written out."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.lines: list[str] = []
        self._sets: dict[tuple, str] = {}

    def add(self, name: str, alternatives: list[list[_Term]]) -> None:
        """Rule `name` for the JSON text of the strings `alternatives` match in full."""
        body = self._alternatives(alternatives, True, True)
        if body is None:
            raise PatternError("it matches no string")
        self.lines.append(f"{name} ::= {body}")

    def _alternatives(self, alternatives: list[list[_Term]], at_start: bool, at_end: bool) -> str | None:
        """An EBNF expression for the alternatives, None when none matches a string. at_start /
        at_end: whether the group can sit at the pattern's start / end (where anchors hold)."""
        bodies = [b for terms in alternatives if (b := self._sequence(terms, at_start, at_end)) is not None]
        if not bodies:
            return None
        return bodies[0] if len(bodies) == 1 else "(" + " | ".join(bodies) + ")"

    def _sequence(self, terms: list[_Term], at_start: bool, at_end: bool) -> str | None:
        parts = []
        for i, term in enumerate(terms):
            start = at_start and all(t.node in ("^", "$") for t in terms[:i])
            end = at_end and all(t.node in ("^", "$") for t in terms[i + 1 :])
            if term.node in ("^", "$"):
                if not (start if term.node == "^" else end):
                    raise PatternError(
                        f"`{term.node}` can only stand at the {'start' if term.node == '^' else 'end'} "
                        f"of the pattern or of one of its alternatives there (inside it, it matches "
                        f"no string, and the grammar cannot enforce that)"
                    )
                continue
            once = (term.low, term.high) == (1, 1)
            if isinstance(term.node, _Chars):
                expr = self._chars(term.node)
            else:
                expr = self._alternatives(term.node, start and once, end and once)
            repeated = self._repeat(expr, term.low, term.high)
            if repeated is None:
                return None
            if repeated:
                parts.append(repeated)
        return " ".join(parts) if parts else '""'

    @staticmethod
    def _repeat(expr: str | None, low: int, high: int | None) -> str | None:
        """`expr` repeated low..high times ("" for none at all), None when it must match and cannot."""
        if expr is None:
            return "" if low == 0 else None
        if high == 0 or expr == '""':
            return expr if expr == '""' else ""
        if (low, high) == (1, 1):
            return expr
        suffix = {(0, None): "*", (1, None): "+", (0, 1): "?"}.get((low, high))
        if suffix is None:
            suffix = f"{{{low},{'' if high is None else high}}}"
        return f"({expr}){suffix}"

    def _chars(self, chars: _Chars) -> str | None:
        """The expression for one character of `chars`, as JSON writes it; None when empty."""
        allowed = chars.allowed()
        if not allowed:
            return None
        if len(allowed) == 1 and allowed[0][0] == allowed[0][1]:
            return _literal(json.dumps(chr(allowed[0][0]), ensure_ascii=False)[1:-1])
        raw = _intersect(allowed, _complement(_JSON_ESCAPED))
        parts = (
            ["[" + "".join(_class_char(lo) + (f"-{_class_char(hi)}" if hi > lo else "") for lo, hi in raw) + "]"]
            if raw
            else []
        )
        parts += [
            _literal(json.dumps(chr(p))[1:-1])
            for lo, hi in _intersect(allowed, _JSON_ESCAPED)
            for p in range(lo, hi + 1)
        ]
        if len(parts) == 1 and len(parts[0]) <= 64:
            return parts[0]
        name = self._sets.get(allowed)
        if name is None:  # a rule of its own, shared by each use
            name = self._sets[allowed] = f"{self.prefix}_chars_{len(self._sets)}"
            self.lines.append(f"{name} ::= " + " | ".join(parts))
        return name


# ------------------------------------------------------------------ schemas
RULE_PREFIX = "string"
"""How our rules' names start (``string_pattern_0``, ``string_chars_0``)."""


class _Found:
    """The strings of one schema whose grammar is ours: a placeholder pattern and a rule
    (`_Rules`) for each, by key (a pattern, or a (min, max) length pair)."""

    def __init__(self) -> None:
        self.nonce = secrets.token_hex(6)
        self.rules = _Rules(RULE_PREFIX)
        self.names: dict[str, str] = {}  # placeholder -> rule name
        self._placeholders: dict[object, str] = {}

    def placeholder(self, key, where: str, alternatives: list[list[_Term]] | None = None) -> str:
        """The placeholder of `key`, its rule made on first use: for `alternatives`, else for
        the pattern `key` (parsed here). Raises `PatternError` naming the pattern and `where`."""
        if key not in self._placeholders:
            placeholder = f"s{self.nonce}{len(self.names)}"
            name = f"{RULE_PREFIX}_pattern_{len(self.names)}"
            try:
                self.rules.add(name, _Parser(key).parse() if alternatives is None else alternatives)
            except PatternError as e:
                raise PatternError(f"the pattern {key!r} at {where} cannot be enforced: {e}") from None
            self._placeholders[key], self.names[placeholder] = placeholder, name
        return self._placeholders[key]


def schema_ebnf(schema: dict) -> str | None:
    """The EBNF text (start rule ``root``) of `schema` (a valid JSON schema, checked for what
    xgrammar does not enforce) under `JSON_SCHEMA_OPTIONS`, with our rules for its string
    patterns, lengths and `FORMAT_PATTERNS` formats; None when it has none of them (xgrammar's
    own conversion is then right as it is). Raises `PatternError` for a pattern the grammar
    cannot enforce (the message names where), and xgrammar's RuntimeError for a schema it
    refuses."""
    found = _Found()
    shown = _placeholders(schema, "$", found)
    if not found.names:
        return None
    text = str(xgrammar.Grammar.from_json_schema(canonical_json(shown), **JSON_SCHEMA_OPTIONS))
    if re.search(rf"^{RULE_PREFIX}_\w+ ::=", text, re.M):
        raise PatternError(f"the schema's own rule names clash with the server's ({RULE_PREFIX}_...)")
    text = re.sub(rf'Regex\("(s{found.nonce}\d+)", json_string=true\)', lambda m: found.names[m.group(1)], text)
    if found.nonce in text:  # xgrammar printed a placeholder otherwise: its own rule would stay
        raise RuntimeError("xgrammar printed a string pattern in a form the server does not know")
    return text + "\n" + "\n".join(found.rules.lines) + "\n"


def json_schema_ebnf(schema: dict) -> str:
    """The EBNF text (start rule ``root``) of `schema` as structured output enforces it:
    `schema_ebnf`'s, or xgrammar's own conversion when that is None. Raises as `schema_ebnf`."""
    ours = schema_ebnf(schema)
    if ours is not None:
        return ours
    return str(xgrammar.Grammar.from_json_schema(canonical_json(schema), **JSON_SCHEMA_OPTIONS))


def _placeholders(node, path: str, found: _Found):
    """A copy of schema `node` in which each string pattern (of a string, a
    ``patternProperties`` key), length bound and `FORMAT_PATTERNS` format of a string is a
    placeholder pattern recorded in `found`; `path` names `node` in errors."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    types = node.get("type") if isinstance(node.get("type"), list) else [node.get("type")]
    values = "enum" in node or "const" in node  # written as listed: the string keywords are not read
    if isinstance(node.get("pattern"), str) and not values:
        out["pattern"] = found.placeholder(node["pattern"], f"{path}.pattern")
    elif "string" in types and not values and out.get("format") in FORMAT_PATTERNS:
        out["pattern"] = found.placeholder(FORMAT_PATTERNS[out.pop("format")], f"{path}.format")
    elif "string" in types and not values and ("minLength" in node or "maxLength" in node):
        low, high = int(out.pop("minLength", 0)), out.pop("maxLength", None)
        high = None if high is None else int(high)
        if high is not None and high < low:
            raise PatternError(f"minLength {low} is above maxLength {high} at {path}: no string fits")
        out["pattern"] = found.placeholder((low, high), path, [[_Term(ANY_CHAR, low, high)]])
    for key in _SCHEMA_MAPS:
        if isinstance(node.get(key), dict):
            out[key] = {
                (found.placeholder(k, f"{path}.{key}") if key == "patternProperties" else k): _placeholders(
                    v, f"{path}.{key}.{k}", found
                )
                for k, v in node[key].items()
            }
    for key in _SCHEMA_ONE:
        if isinstance(node.get(key), dict):
            out[key] = _placeholders(node[key], f"{path}.{key}", found)
    for key in _SCHEMA_LISTS:
        if isinstance(node.get(key), list):
            out[key] = [_placeholders(v, f"{path}.{key}[{i}]", found) for i, v in enumerate(node[key])]
    return out
