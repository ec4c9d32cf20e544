"""`GrammarBackend`: compiles `GrammarSpec`s on a thread of its own and caches the results."""

from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from protocol.endpoints import GRAMMAR_TOKENIZER_FILE
from protocol.enums import GrammarKind
from protocol.grammar import (
    JSON_OBJECT_OPTIONS,
    JSON_OBJECT_SCHEMA,
    JSON_SCHEMA_OPTIONS,
    XGRAMMAR_ERRORS,
    xgrammar_message,
)
from protocol.messages import GrammarSpec
from scheduler_proc.grammar.row import RowGrammar


class GrammarError(ValueError):
    """A spec xgrammar could not compile; the message is xgrammar's, for the client."""


COMPILE_WORKERS = 2
"""Grammars compiled at once. xgrammar compiles with the GIL released; a large schema within
the limits (thousands of properties or enum values) takes seconds to tens of seconds, and
with one compile thread every grammar sent after it waited as long. Two let the others pass
one such compile (vLLM likewise compiles on a thread pool)."""


class GrammarBackend:
    """Compiles grammars for the tokenizer of run directory `run_dir`.

    vocab_size: the model's logit width; the hand-off file (`GRAMMAR_TOKENIZER_FILE`,
    written by the tokenizer process) must state the same. threads: xgrammar's compile
    threads (parallelism inside one compile). Up to `COMPILE_WORKERS` compiles run at once,
    started in submission order, on executor threads; the first one also imports xgrammar
    and loads the hand-off (the others wait for it). cache_size: compiled grammars kept,
    least recently submitted dropped first.

    Not thread-safe: call `submit` and `close` from one thread (the scheduling loop).
    """

    def __init__(self, run_dir: str | Path, vocab_size: int, threads: int = 1, cache_size: int = 256) -> None:
        self.path = Path(run_dir) / GRAMMAR_TOKENIZER_FILE
        self.vocab_size, self.threads, self.cache_size = vocab_size, threads, cache_size
        self._executor = ThreadPoolExecutor(max_workers=COMPILE_WORKERS, thread_name_prefix="grammar")
        self._cache: OrderedDict[tuple[GrammarKind, str], Future] = OrderedDict()
        self._compiler = None  # xgrammar.GrammarCompiler, made on an executor thread
        self._compiler_lock = threading.Lock()

    def submit(self, spec: GrammarSpec) -> Future:
        """A future of `spec`'s ``xgrammar.CompiledGrammar``; returns at once.

        The same (kind, text) gives the same future while cached (done, or still in
        flight), so each spec compiles once. The future raises `GrammarError` when xgrammar
        rejects the spec or the grammar matches no text at all, and `OSError` / `ValueError` when the hand-off file is missing,
        unreadable or for another vocabulary size. Raises `RuntimeError` after `close`.
        """
        key = (spec.kind, spec.text)
        future = self._cache.get(key)
        if future is None:
            future = self._executor.submit(self._compile, spec)
            self._cache[key] = future
            if len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return future

    @staticmethod
    def matcher(compiled) -> RowGrammar:
        """A fresh matcher for one request over a compiled grammar (from `submit`)."""
        return RowGrammar(compiled)

    def close(self) -> None:
        """Cancel queued compiles and stop the thread (a running compile is not waited for)."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------ executor thread
    def _load(self, xgrammar):
        info = xgrammar.TokenizerInfo.deserialize_json(self.path.read_text())
        if info.vocab_size != self.vocab_size:
            raise ValueError(f"{self.path} is for {info.vocab_size} tokens, the model scores {self.vocab_size}")
        return xgrammar.GrammarCompiler(info, max_threads=self.threads, cache_enabled=False)

    def _compile(self, spec: GrammarSpec):
        import xgrammar  # the first time: torch + transformers, seconds, off the loop

        with self._compiler_lock:
            if self._compiler is None:
                self._compiler = self._load(xgrammar)
        try:
            if spec.kind == GrammarKind.JSON_SCHEMA:
                grammar = xgrammar.Grammar.from_json_schema(spec.text, **JSON_SCHEMA_OPTIONS)
            elif spec.kind == GrammarKind.JSON_OBJECT:
                grammar = xgrammar.Grammar.from_json_schema(JSON_OBJECT_SCHEMA, **JSON_OBJECT_OPTIONS)
            elif spec.kind == GrammarKind.REGEX:
                grammar = xgrammar.Grammar.from_regex(spec.text)
            elif spec.kind == GrammarKind.EBNF:
                grammar = xgrammar.Grammar.from_ebnf(spec.text)
            else:
                raise GrammarError(f"unknown grammar kind {spec.kind}")
            compiled = self._compiler.compile_grammar(grammar)
        except XGRAMMAR_ERRORS as e:
            raise GrammarError(xgrammar_message(e, own_ebnf=spec.kind == GrammarKind.EBNF)) from None
        row = RowGrammar(compiled)
        row.next_mask()
        if row.dead_end:  # else the request would end at once, "stop" with no text
            raise GrammarError(
                "it matches no text: no token may begin the output and it cannot be empty "
                "(e.g. a rule that only refers to itself, or an empty character class)"
            )
        return compiled
