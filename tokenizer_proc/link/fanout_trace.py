"""Optional timing of the HTTP fan-out, for `bench/step_profile.py`.

Enabled by ``LAZYSERVE_TRACE_DIR`` (`protocol.trace`): one JSON line per `BatchStrOut`
with `time.perf_counter()` seconds: ``recv`` (read from the inbox), ``routed`` (its rows
put on the request queues), ``last_written`` (the last of its rows' SSE chunks was handed
to the server: the request's generator was resumed after yielding that row's delta),
``rows`` (rows with a waiting request) and ``written`` (how many of them were written; fewer
when a row carried nothing to send, the record is then written after `STALE_S`).
"""

from __future__ import annotations

import time

from protocol.messages import BatchStrOut
from protocol.trace import batch_key, open_trace, write_record

STALE_S = 2.0
"""Seconds after which a text batch with rows never written is recorded as it stands."""


class FanoutTrace:
    """Follows each text batch until every row of it was written to its stream."""

    def __init__(self, file) -> None:
        self.file = file
        self.rows: dict[tuple[str, int], str] = {}
        """(rid, completion tokens) -> key of the batch that carried that row."""
        self.batches: dict[str, dict] = {}

    @classmethod
    def from_env(cls) -> FanoutTrace | None:
        """A trace in ``$LAZYSERVE_TRACE_DIR``, or None when it is unset."""
        file = open_trace("http")
        return cls(file) if file else None

    def batch(self, msg: BatchStrOut, recv: float, waiting: dict) -> None:
        """`msg`, read at `recv` (perf_counter s), was just routed; `waiting`: rid -> queue of
        the requests being streamed."""
        now = time.perf_counter()
        key = batch_key(msg.rids, msg.completion_tokens)
        rows = [(rid, n) for rid, n in zip(msg.rids, msg.completion_tokens) if rid in waiting]
        self.rows.update((row, key) for row in rows)
        self.batches[key] = {
            "key": key,
            "recv": recv,
            "routed": now,
            "rows": len(rows),
            "written": 0,
            "last_written": None,
        }
        stale = [k for k, b in self.batches.items() if now - b["recv"] > STALE_S]
        for k in stale:
            write_record(self.file, **self.batches.pop(k))
        if stale:
            self.rows = {row: k for row, k in self.rows.items() if k in self.batches}

    def written(self, rid: str, completion_tokens: int) -> None:
        """The delta of `rid` at `completion_tokens` tokens was written to its stream."""
        key = self.rows.pop((rid, completion_tokens), None)
        b = self.batches.get(key) if key is not None else None
        if b is None:
            return
        b["written"] += 1
        b["last_written"] = time.perf_counter()
        if b["written"] == b["rows"]:
            write_record(self.file, **self.batches.pop(key))
