"""Structured output in the scheduler: grammars compiled off the loop (`GrammarBackend`)
and one matcher per request (`RowGrammar`) that advances on finalized tokens and makes the
packed token mask of its next step (DESIGN.md §10).

Pure Python + xgrammar + numpy, never mlx. xgrammar imports torch and transformers
(~2.5 s on 2 cores), so it is imported only when the first grammar is compiled, in the
backend's thread; a server without grammar requests never loads it.
"""

from scheduler_proc.grammar.backend import GrammarBackend, GrammarError
from scheduler_proc.grammar.row import RowGrammar

__all__ = ["GrammarBackend", "GrammarError", "RowGrammar"]
