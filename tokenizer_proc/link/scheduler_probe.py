"""`SchedulerProbe`: is the scheduler's loop still turning? Asked by ``GET /health``.

The scheduler answers a `HealthProbe` from its loop (`HealthAnswer`), so an answer shows
that the loop turned after the probe was sent; a loop stuck in a step, blocked, or a process
stopped (SIGSTOP) does not answer. Probes are sent only when /health is asked, one at a time
(callers meanwhile wait on the same one): no message per scheduler step.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from protocol.messages import HealthProbe

ANSWER_WAIT_S = 1.0
"""The longest one /health call waits for the scheduler's answer: a load balancer's health
check times out after a few seconds, and a probe still out but younger than the stall timeout
says nothing yet (the loop may be in one long step)."""


class SchedulerProbe:
    """Times the scheduler's answers to health probes.

    send: sends a probe to the scheduler; timeout_s: how long a probe may go unanswered
    before the scheduler counts as stalled (``--stall-timeout``; 0: never probe); clock:
    monotonic seconds; answer_wait_s: the longest a caller waits for an answer (seconds)."""

    def __init__(
        self,
        send: Callable[[HealthProbe], Awaitable[None]],
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
        answer_wait_s: float = ANSWER_WAIT_S,
    ) -> None:
        self.send, self.timeout_s, self.clock, self.answer_wait_s = send, timeout_s, clock, answer_wait_s
        self.seq = 0
        self.out: tuple[int, float, asyncio.Future] | None = None
        """The probe sent and not answered yet: (seq, sent at, done when answered)."""

    async def stalled(self) -> str:
        """ "" when the scheduler answers a probe (sent now, or one still out) within
        `answer_wait_s`, or the probe out is younger than `timeout_s`; otherwise why it counts
        as stalled (the process named, how long it has been silent). Waits for the answer at
        most `answer_wait_s`, and not past the probe's deadline."""
        if not self.timeout_s:
            return ""
        if self.out is None:
            self.seq += 1
            self.out = (self.seq, self.clock(), asyncio.get_running_loop().create_future())
            await self.send(HealthProbe(self.seq))
        _, sent_at, answered = self.out
        left = sent_at + self.timeout_s - self.clock()
        if left > 0:
            try:
                await asyncio.wait_for(asyncio.shield(answered), min(left, self.answer_wait_s))
                return ""
            except asyncio.TimeoutError:
                pass
        if answered.done() or self.clock() < sent_at + self.timeout_s:
            return ""
        return (
            f"the scheduler has not answered a health probe for {self.clock() - sent_at:.1f} s "
            f"(--stall-timeout {self.timeout_s:g} s): its loop is stuck or the process is stopped"
        )

    def answered(self, seq: int) -> None:
        """The scheduler's `HealthAnswer` for probe `seq` arrived (one for no probe out is
        ignored)."""
        if self.out is not None and self.out[0] == seq:
            self.out[2].set_result(None)
            self.out = None
