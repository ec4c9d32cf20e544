"""A monotonic clock the test sets, for the deadline and request-log tests."""

from __future__ import annotations


class FakeClock:
    """Monotonic seconds that the test sets."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t
