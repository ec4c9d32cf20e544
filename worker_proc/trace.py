"""Optional per-launch timestamps taken in the worker, for the overlap and step-profile
benchmarks.

Enabled by ``LAZYSERVE_WORKER_TRACE=/path/file.jsonl`` or, for `bench/step_profile.py`, by
``LAZYSERVE_TRACE_DIR`` (`protocol.trace`): one JSON line per finalized launch, written once
its result is sent, with `time.perf_counter()` seconds:
``received`` (the message that started the launch was read), ``built`` (`ModelRunner`
returned from building it; for a launch queued at once that includes `mx.async_eval`),
``queueing`` / ``launched`` (before / after `mx.async_eval`), ``sampling_s`` (seconds in
`worker_proc.logits.pipeline.process` while building it), ``fin_received`` (its Finalize
was read), ``wait`` (finalize started blocking), ``ready`` (the tokens were available),
``result_sending`` / ``result_sent`` (the send of its LaunchResult started / returned), mode,
rows, ``waited`` (seconds the worker sat in poll before the message that started the launch
arrived) and ``finalize_early`` (see `worker_proc.finalize_order`). A finalize that had to
wait (ready - wait > 0) proves the device was still busy with that launch; the gaps
between consecutive ``ready`` times are the served step times.
"""

from __future__ import annotations

import json
import os
import time

from protocol.enums import mode_name
from protocol.trace import open_trace


class StepTrace:
    """Collects timestamps by launch id and appends finished records to a file."""

    def __init__(self, file) -> None:
        self.file = file
        self.open: dict[int, dict] = {}
        self.sampling_s = 0.0
        """Sampling build seconds of the launch being built (moved to it when it is queued)."""

    @classmethod
    def from_env(cls) -> StepTrace | None:
        """A trace writing to ``$LAZYSERVE_WORKER_TRACE``, else into ``$LAZYSERVE_TRACE_DIR``,
        or None when both are unset."""
        path = os.environ.get("LAZYSERVE_WORKER_TRACE")
        file = open(path, "a", buffering=1) if path else open_trace("worker")  # noqa: SIM115 (held open while the worker runs)
        return cls(file) if file else None

    def sampled(self, seconds: float) -> None:
        """The launch being built spent `seconds` building its sampling ops."""
        self.sampling_s += seconds

    def queueing(self, launch_id: int) -> None:
        """`mx.async_eval` of the launch is about to be called."""
        self.note(launch_id, queueing=time.perf_counter(), sampling_s=self.sampling_s)
        self.sampling_s = 0.0

    def launched(self, launch_id: int) -> None:
        """The launch was queued on the device."""
        self.note(launch_id, launched=time.perf_counter())

    def note(self, launch_id: int, **fields) -> None:
        """Add fields to the launch's record (e.g. the worker's wait before the message that
        started it, ``waited`` s, and whether its previous launch was finalized early)."""
        self.open.setdefault(launch_id, {"id": launch_id}).update(fields)

    def waiting(self, launch_id: int) -> None:
        """Finalize started blocking on the launch."""
        self.note(launch_id, wait=time.perf_counter())

    def ready(self, launch_id: int, mode: int, rows: int) -> None:
        """The launch's tokens are available."""
        self.note(launch_id, ready=time.perf_counter(), mode=mode_name(mode), rows=rows)

    def sent(self, launch_id: int, sending: float) -> None:
        """The send of the launch's result started at `sending` (perf_counter s) and returned;
        write its record (only for a launch that became ready: failed ones are dropped)."""
        rec = self.open.pop(launch_id, {})
        if "ready" in rec:
            rec.update(result_sending=sending, result_sent=time.perf_counter())
            self.file.write(json.dumps(rec) + "\n")
