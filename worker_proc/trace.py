"""Optional per-launch timestamps taken in the worker, for the overlap benchmark.

Enabled by ``LAZYSERVE_WORKER_TRACE=/path/file.jsonl``: one JSON line per finalized launch
with `time.perf_counter()` seconds: ``launched`` (after `mx.async_eval` returned),
``wait`` (finalize started blocking), ``ready`` (the tokens were available), mode, rows,
``waited`` (seconds the worker sat in poll before the message that started the launch
arrived) and ``finalize_early`` (see `worker_proc.finalize_order`). A finalize that had to
wait (ready - wait > 0) proves the device was still busy with that launch; the gaps
between consecutive ``ready`` times are the served step times.
"""

from __future__ import annotations

import json
import os
import time

from protocol.enums import mode_name


class StepTrace:
    """Collects timestamps by launch id and appends finished records to a file."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "a", buffering=1)
        self.open: dict[int, dict] = {}

    @classmethod
    def from_env(cls) -> "StepTrace | None":
        """A trace writing to ``$LAZYSERVE_WORKER_TRACE``, or None when unset."""
        path = os.environ.get("LAZYSERVE_WORKER_TRACE")
        return cls(path) if path else None

    def launched(self, launch_id: int) -> None:
        """The launch was queued on the device."""
        self.open[launch_id] = {"id": launch_id, "launched": time.perf_counter()}

    def note(self, launch_id: int, **fields) -> None:
        """Add fields to the launch's record (the worker's wait before the message that
        started it, ``waited`` s, and whether its previous launch was finalized early)."""
        self.open.setdefault(launch_id, {"id": launch_id}).update(fields)

    def waiting(self, launch_id: int) -> None:
        """Finalize started blocking on the launch."""
        self.open.setdefault(launch_id, {"id": launch_id})["wait"] = time.perf_counter()

    def ready(self, launch_id: int, mode: int, rows: int) -> None:
        """The launch's tokens are available; write its record."""
        rec = self.open.pop(launch_id, {"id": launch_id})
        rec.update(ready=time.perf_counter(), mode=mode_name(mode), rows=rows)
        self.file.write(json.dumps(rec) + "\n")
