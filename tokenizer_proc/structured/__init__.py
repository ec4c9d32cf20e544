"""Structured output: ``response_format`` and grammar checks before a request starts, the
JSON-schema keywords a grammar can enforce, schema rewrites for xgrammar, our own string grammar,
and the tokenizer hand-off to xgrammar."""
