"""Optional per-process JSONL traces for `bench/step_profile.py`.

Enabled by ``LAZYSERVE_TRACE_DIR=DIR``: each traced process appends one JSON object per line
to ``DIR/NAME-PID.jsonl``. Timestamps are `time.perf_counter()` seconds, which on Linux is
CLOCK_MONOTONIC and so comparable between processes of one machine. With the variable unset
`open_trace` returns None and the processes skip every hook.
"""

from __future__ import annotations

import json
import os
from typing import TextIO

TRACE_DIR_ENV = "LAZYSERVE_TRACE_DIR"


def open_trace(name: str) -> TextIO | None:
    """A line-buffered file ``$LAZYSERVE_TRACE_DIR/NAME-PID.jsonl`` to append records to, or
    None when the variable is unset."""
    folder = os.environ.get(TRACE_DIR_ENV)
    if not folder:
        return None
    return open(os.path.join(folder, f"{name}-{os.getpid()}.jsonl"), "a", buffering=1)


def write_record(file: TextIO, **fields) -> None:
    """Append one record (a JSON line) to a trace file."""
    file.write(json.dumps(fields) + "\n")


def batch_key(rids: list[str], completion_tokens: list[int]) -> str:
    """The key that joins one step's token batch across the scheduler, a detokenizer and
    the HTTP process: its first row's rid and completion token count ("" when empty)."""
    return f"{rids[0]}:{completion_tokens[0]}" if rids else ""
