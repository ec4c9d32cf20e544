"""Is a JSON schema's ``pattern`` a regular expression? JSON Schema patterns are ECMA-262
regexes, and ``jsonschema``'s metaschema check compiles them with Python's ``re``, which
reads named groups the other way round: ECMA's ``(?<name>...)`` and ``\\k<name>`` are errors
to Python 3.11, Python's ``(?P<name>...)`` and ``(?P=name)`` are errors to ECMA. `is_regex`
translates the ECMA forms before compiling and refuses the Python-only ones; everything else
the two dialects read alike or differently is left to `string_grammar`, which refuses what
it cannot enforce.
"""

from __future__ import annotations

import re

import jsonschema

_ECMA_NAMED = re.compile(r"\(\?<([A-Za-z_][A-Za-z0-9_]*)>")
_ECMA_BACKREF = re.compile(r"\\k<([A-Za-z_][A-Za-z0-9_]*)>")


def python_form(pattern: str) -> str:
    """`pattern` (ECMA-262) with its named groups and named backreferences in Python's
    syntax. Raises `re.error` for a Python-only ``(?P`` group (not an ECMA regex). Escapes
    and character classes are skipped, so ``\\(?P`` or ``[(?P]`` are left alone."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            if (m := _ECMA_BACKREF.match(pattern, i)) and not in_class:
                out.append(f"(?P={m.group(1)})")
                i = m.end()
                continue
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(" and pattern.startswith("(?P", i):
            raise re.error(
                "(?P...) is Python's syntax, not ECMA-262's: write a named group as (?<name>...)", pattern, i
            )
        elif c == "(" and (m := _ECMA_NAMED.match(pattern, i)):
            out.append(f"(?P<{m.group(1)}>")
            i = m.end()
            continue
        out.append(c)
        i += 1
    return "".join(out)


def is_regex(instance: object) -> bool:
    """The ``regex`` format of JSON Schema: True for a non-string (formats apply to strings
    only) or an ECMA-262 pattern Python can compile once translated (`python_form`). Raises
    `re.error` saying why one is not, also where ``re`` raises another error (a repetition
    count above its limit is an `OverflowError`, groups nested thousands deep a
    `RecursionError`)."""
    if not isinstance(instance, str):
        return True
    try:
        re.compile(python_form(instance))
    except OverflowError as e:
        raise re.error(str(e)) from None
    except RecursionError:
        raise re.error("it nests too deeply") from None
    return True


def format_checker(validator_class) -> jsonschema.FormatChecker:
    """`validator_class`'s format checker with ``regex`` read as ECMA-262 (`is_regex`)."""
    checker = jsonschema.FormatChecker(validator_class.FORMAT_CHECKER.checkers)
    checker.checks("regex", raises=re.error)(is_regex)
    return checker
