"""Where the finalize of N goes when a `ChainDecode(N+1, N)` is followed by `Finalize(N)`.

The scheduler sends the two back to back and waits for N's result before it sends
`ChainDecode(N+2, N+1)`. The worker may run them in one of two orders:

- chain first (the default): build N+1's graph and queue it on the device, then block on
  N. Right when the device is the bottleneck: the finalize blocks while the device runs N,
  and N+1 is already queued behind it, so the device keeps working through the
  scheduler's round trip.
- finalize early: build N+1's graph, finalize N, then queue N+1. Right when the host is
  the bottleneck (a small model on a GPU is kernel-launch bound: the device finishes each
  step about when the worker finishes queueing it). Chain first would leave the worker,
  and so the device, idle for the whole round trip after each result; finalizing early
  lets the scheduler prepare N+2 while the worker queues N+1, and N's short tail on the
  device is hidden behind the building of N+1's graph.

`FinalizeOrder` picks from what the worker measures, per step: in chain-first steps, the
seconds the finalize blocked and the seconds the worker waited for the next ChainDecode
(the round trip); in finalize-early steps, the seconds the finalize blocked. It switches to
finalize early after `streak` chain-first steps in a row whose finalize did not block
(the device had finished before the worker asked: `unblocked`), and back as soon as a finalize-early
step blocks longer than the round trip it saves; every switch back doubles the streak
needed to try again (up to `max_streak`; `streak` good finalize-early steps in a row reset
it), so a regime in between costs one step in many.
"""

from __future__ import annotations

NO_BLOCK_S = 50e-6
"""A finalize that blocked less than this found its launch already computed."""
ROUND_TRIP_SHARE = 0.25
"""...or less than this share of the round trip finalizing early would hide: on a GPU a
finalize of a computed launch still waits on a device-to-host copy of its tokens (about
75 us at 64 rows on an H200, where the round trip is about 0.9 ms), which `NO_BLOCK_S`
alone took for a device still running, so a 64-row batch stayed chain first."""


def unblocked(blocked_s: float, waited_s: float) -> bool:
    """Whether a chain-first step's finalize found its launch computed: it blocked
    `blocked_s` (seconds), under `NO_BLOCK_S` or under `ROUND_TRIP_SHARE` of the round
    trip `waited_s` (seconds the worker waited for the ChainDecode this Finalize came with).

    Known gap: a finalize-early step switches back only when it blocks longer than the whole
    round trip, so a device behind the worker by less than this share stays finalize-early
    when queueing a step is cheaper than the round trip (a simulation: round trip 1 ms,
    queueing 0.3 ms, device 0.15 ms behind, about 2.5% a step lost). Not seen on the H200
    (queueing 5-7 ms) or the CPU (its queueing blocks while it computes)."""
    return blocked_s < max(NO_BLOCK_S, ROUND_TRIP_SHARE * waited_s) and waited_s > blocked_s


class FinalizeOrder:
    """The worker's choice of order for a ChainDecode followed by the previous launch's
    Finalize. Times are in seconds (`time.perf_counter` differences)."""

    def __init__(self, streak: int = 8, max_streak: int = 512, smoothing: float = 0.2) -> None:
        self.finalize_early = False
        self.base_streak = self.needed = streak
        self.max_streak = max_streak
        self.smoothing = smoothing
        self.round_trip_s: float | None = None
        self.unblocked = self.good = 0

    def chain_first_step(self, blocked_s: float, waited_s: float) -> None:
        """A chain-first step: its finalize blocked `blocked_s`; the worker had waited
        `waited_s` for the ChainDecode that came with this Finalize (the scheduler's round
        trip after the previous result)."""
        rt = self.round_trip_s
        self.round_trip_s = waited_s if rt is None else rt + self.smoothing * (waited_s - rt)
        self.unblocked = self.unblocked + 1 if unblocked(blocked_s, waited_s) else 0
        if self.unblocked >= self.needed:
            self.finalize_early, self.unblocked = True, 0

    def early_step(self, blocked_s: float) -> None:
        """A finalize-early step whose finalize blocked `blocked_s`."""
        if self.round_trip_s is not None and blocked_s > self.round_trip_s:
            self.finalize_early, self.good = False, 0
            self.needed = min(self.needed * 2, self.max_streak)
            return
        self.good += 1
        if self.good >= self.base_streak:
            self.needed = self.base_streak
