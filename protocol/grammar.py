"""How lazyserve turns a `GrammarSpec` into an xgrammar grammar: the options both sides use.

The HTTP process validates a spec with ``xgrammar.Grammar.from_*`` and the scheduler
compiles it later; both pass the options below, so a spec that validates also compiles to
the same grammar. Plain data and string helpers only: this module does not import xgrammar
(which imports torch and transformers).

JSON schema options (`JSON_SCHEMA_OPTIONS`), for both values of OpenAI's ``strict``:

- ``strict_mode=True``: the output holds only the properties the schema lists, even where
  the schema leaves ``additionalProperties`` open (and no array items beyond those listed
  when ``items`` is absent). Every output still validates against the schema as written;
  it is a subset of the valid documents. OpenAI's ``strict: true`` asks for exactly this
  (additionalProperties false everywhere); with ``strict: false`` OpenAI only tries, we
  enforce the schema all the same. Unlike OpenAI we do not refuse strict schemas outside
  its supported subset: whatever xgrammar compiles is accepted.
- ``any_whitespace=True, max_whitespace_cnt=2``: the model may put up to 2 whitespace
  characters between two tokens of the JSON syntax (a newline and one space of indent),
  and cannot loop on whitespace, a known failure of small models. Measured with the
  default model on case J1 (greedy, 128 tokens): with 8 characters the json_object answer
  nested objects until the token limit; with no free whitespace (xgrammar's fixed
  separators) both answers ran into an endless string; with 2, both closed and validated.
- Property order is the schema's (``any_order=False``): JSON texts are canonicalized
  without sorting keys (`canonical_json`), since sorting would reorder the output.

``json_object`` is the JSON schema ``{"type": "object"}`` with ``strict_mode=False`` (in
strict mode that schema only allows ``{}``).
"""

from __future__ import annotations

import json
import re

JSON_SCHEMA_OPTIONS: dict = {"strict_mode": True, "any_whitespace": True, "max_whitespace_cnt": 2}
"""Keyword arguments of ``xgrammar.Grammar.from_json_schema`` for JSON_SCHEMA specs."""

JSON_OBJECT_SCHEMA = '{"type":"object"}'
"""The schema a JSON_OBJECT spec stands for (any JSON object)."""

JSON_OBJECT_OPTIONS: dict = {**JSON_SCHEMA_OPTIONS, "strict_mode": False}
"""Keyword arguments of ``xgrammar.Grammar.from_json_schema`` for `JSON_OBJECT_SCHEMA`."""

_LOG_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: (Check failed: .*? is false: )?")
_EBNF_POSITION = re.compile(r"^EBNF (?:parser|lexer) error at line \d+, column \d+: ")
"""How xgrammar starts an error in the EBNF it parses: for a regex or a JSON schema, the
grammar it converted them to, which the client never saw."""
MESSAGE_LIMIT = 500
"""Characters of an xgrammar error message kept for the client."""


def canonical_json(value: object) -> str:
    """`value` as compact JSON text (``,`` and ``:`` separators, key order kept, non-ASCII
    kept), so that equal schemas sent alike give equal texts and hit the compile cache."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


XGRAMMAR_ERRORS = (RuntimeError, UnicodeDecodeError)
"""What xgrammar raises for a grammar it cannot parse: RuntimeError, or UnicodeDecodeError
when its message quotes the grammar cut inside a multi-byte character."""


def xgrammar_message(exc: BaseException, own_ebnf: bool = False) -> str:
    """The user-facing part of an xgrammar error (one of `XGRAMMAR_ERRORS`): its first line
    without the C++ log prefix (``[12:00:00] /project/cpp/file.cc:123: ``), at most
    `MESSAGE_LIMIT` characters, never empty. own_ebnf: the input was EBNF the client wrote,
    so an EBNF error keeps its line and column; else (a regex, a JSON schema, a grammar built
    by the server) they point into a converted grammar, and that lead is dropped."""
    if isinstance(exc, UnicodeDecodeError):
        return "xgrammar could not parse it (its error message could not be decoded)"
    lines = [ln for ln in str(exc).splitlines() if ln.strip()]
    first = _LOG_PREFIX.sub("", lines[0]).strip() if lines else ""
    if not own_ebnf:
        first = _EBNF_POSITION.sub("", first)
    return first[:MESSAGE_LIMIT] or f"xgrammar rejected it without a reason ({type(exc).__name__})"
