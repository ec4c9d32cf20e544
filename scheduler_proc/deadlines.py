"""How long a request may wait, and go without progress, before the scheduler fails it.

Two bounds, both checked by `Scheduler.expire` (the scheduler is the one place that decides
a finish, and the one process that knows whether a request is queued):

- **Queue timeout** (``--queue-timeout S``, default none): a request not yet admitted S
  seconds after it reached the scheduler (waiting, or held for its grammar or its n > 1
  leader) fails with a 503 saying it timed out in the queue. A client or load balancer
  sets it to give up early and retry elsewhere.
- **Stall timeout** (``--stall-timeout S``, default 300 s; 0: off): a request that is
  admitted (prefilling or decoding) is stalled when for S seconds neither it progressed (a
  prefill chunk or a token) nor the worker returned any launch result: the worker is stuck
  or stopped. A request that waits behind work the worker does (a decode behind a long
  prefill, a queue behind a large batch) is not stalled, however long the work takes (such
  requests were failed as "the server may be stuck" while it computed). A request that
  waits (queued, held, or retracted back into the queue) may go `QUEUED_STALL_FACTOR`
  times as long, since a grammar's compile (no launch meanwhile) may take minutes. A
  stalled request's state is logged by every process that holds it (scheduler, its
  detokenizer replica, the HTTP process) and it fails with a 503, so the client gets an
  error instead of silence.

300 s is far above a healthy gap between two results (one decode step or one prefill chunk
of ``--chunked-prefill-size`` tokens), so it fires only for a worker that stopped answering;
lower it where steps are known to be fast, raise it for huge unchunked prefills on slow
hardware.
"""

from __future__ import annotations

from dataclasses import dataclass

QUEUED_STALL_FACTOR = 4.0
"""A waiting request's no-progress bound is this many times ``--stall-timeout``."""
CHECK_INTERVAL_S = 0.25
"""`Scheduler.expire` looks at the requests at most this often."""


@dataclass(frozen=True)
class Deadlines:
    """queue_timeout: seconds a request may wait for its first admission (None: forever);
    stall_timeout: seconds an admitted request may go without progress (0: forever)."""

    queue_timeout: float | None = None
    stall_timeout: float = 0.0

    def queue_expired(self, waited: float) -> bool:
        """True when a request not yet admitted has waited `waited` seconds too long."""
        return self.queue_timeout is not None and waited > self.queue_timeout

    def stall_bound(self, queued: bool) -> float | None:
        """Seconds without progress allowed (None: no bound): longer while `queued`."""
        if not self.stall_timeout:
            return None
        return self.stall_timeout * (QUEUED_STALL_FACTOR if queued else 1.0)
