"""Custom logit processors: operator-installed code, loaded only behind
``--enable-custom-logit-processor`` from ``--logit-processor-module MODULE``.

MODULE (importable in the worker, e.g. on PYTHONPATH) defines ``LOGIT_PROCESSORS``, a dict
of name -> callable ``fn(logits, output_ids, args) -> logits``: logits is one row's
float32 [V] MLX array after logit edits and penalties, output_ids the tokens the request
generated so far (list[int]), args the request's JSON arguments (a dict, parsed with
`json.loads`: nothing from a request is evaluated or unpickled). A request names its
processor; rows with one never chain (the processor reads the last token as an int).

A processor that fails fails its own request only (`apply_processors`): it raised (any
exception, ``SystemExit`` included), returned something other than an array of the row's
shape, or returned an array whose evaluation fails (MLX reports some errors, e.g. a singular
matrix's inverse, only when the graph runs, and then marks the array evaluated with garbage:
left lazy, the error would fail the whole launch).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx

PROCESSORS_ATTR = "LOGIT_PROCESSORS"

Processor = Callable[[mx.array, list[int], dict], mx.array]


def load_processors(module_name: str) -> dict[str, Processor]:
    """The processors `module_name` exposes. Raises `ValueError` naming the module when it
    cannot be imported or has no ``LOGIT_PROCESSORS`` dict of callables."""
    try:
        module = importlib.import_module(module_name)
    except Exception as e:
        raise ValueError(f"--logit-processor-module {module_name}: cannot import it: {type(e).__name__}: {e}") from e
    table = getattr(module, PROCESSORS_ATTR, None)
    if not isinstance(table, dict) or not all(isinstance(k, str) and callable(v) for k, v in table.items()):
        raise ValueError(
            f"--logit-processor-module {module_name}: it must define {PROCESSORS_ATTR}, "
            "a dict of name -> callable(logits, output_ids, args)"
        )
    return dict(table)


@dataclass
class RowProcessor:
    """One request's processor (its name in ``LOGIT_PROCESSORS`` and the callable), its
    parsed arguments and the tokens it has generated."""

    name: str
    fn: Processor
    args: dict
    output_ids: list[int] = field(default_factory=list)

    @classmethod
    def create(cls, name: str, args_json: str, table: dict[str, Processor]) -> RowProcessor:
        """Raises `ValueError` for an unknown name or arguments that are not a JSON object."""
        if name not in table:
            raise ValueError(f"unknown logit processor {name!r}; loaded: {sorted(table)}")
        args = json.loads(args_json) if args_json else {}
        if not isinstance(args, dict):
            raise ValueError("logit processor arguments must be a JSON object")
        return cls(name, table[name], args)


def apply_processors(logits: mx.array, processors: list[RowProcessor | None]) -> tuple[mx.array, dict[int, str]]:
    """logits float32 [B, V] with row i replaced by processors[i]'s output (when it has one),
    and the rows whose processor failed (row -> message naming the processor and the
    exception; those rows keep their logits and the request is failed alone).

    With any processor, this blocks: first on `logits` (the batch's own graph; its error is
    raised, as the launch's), then on each processor's output in turn, so that an error MLX
    reports only at evaluation is pinned on the row that caused it. Rows with a processor
    never chain, so the launch would be waited for at once anyway."""
    if not any(processors):
        return logits, {}
    mx.eval(logits)
    rows, failed = [], {}
    for i, p in enumerate(processors):
        row = logits[i]
        if p is not None:
            try:
                out = p.fn(row, list(p.output_ids), p.args)
                if not isinstance(out, mx.array) or out.shape != row.shape:
                    raise ValueError(f"returned {getattr(out, 'shape', type(out).__name__)}, not shape {row.shape}")
                out = out.astype(mx.float32)
                mx.eval(out)
                row = out
            except BaseException as e:  # operator code (SystemExit too): fail its request, never the batch
                failed[i] = f"custom logit processor {p.name!r} failed: {type(e).__name__}: {e}"
        rows.append(row)
    return mx.stack(rows), failed
