"""When and how much to draft: per request from its acceptance, per batch from measured speed.

- **Per request** (`DraftLength`): the draft length starts at the server's k; a draft
  accepted whole lengthens the next by one (up to k), one accepted in part sets it to the
  accepted count plus one, one rejected whole halves it; after `COOL_AFTER` drafts in a row
  rejected whole, the request drafts nothing for `COOL_STEPS` launches, doubling each time
  it happens again (a free-text stretch costs at most a few wasted positions).
- **Per batch size** (`SpeedPolicy`): speculation costs a batch its chained decodes (a
  verify's accepted tokens must reach the scheduler before it drafts again, so the
  next launch cannot be queued behind it) and a wider launch. The policy measures, per
  batch-size bucket (powers of two), the output tokens per second of the launches made with
  speculation on (TARGET_VERIFY, unchained) and off (DECODE, chained), from one result to the
  next, as exponential moving averages; the batch speculates while its bucket's rate on is at
  least its rate off. A bucket starts on, then measures off, and every `PROBE_EVERY`
  launches tries the other mode; a mode once chosen is held for `HOLD` launches, and only a
  launch that follows one of its own mode is measured (the first after a switch pays the
  switch: an unchained decode, or a verify behind a chained decode).
"""

from __future__ import annotations

from dataclasses import dataclass, field

COOL_AFTER = 3
COOL_STEPS = 8
MAX_COOL_STEPS = 256
PROBE_EVERY = 32
HOLD = 4
EMA = 0.2
"""Weight of a new measurement in a rate's moving average."""


@dataclass
class DraftLength:
    """One request's adaptive draft length (see the module doc). k: the server's maximum."""

    k: int
    length: int = 0
    misses: int = 0
    cool: int = 0
    cool_steps: int = COOL_STEPS

    def __post_init__(self) -> None:
        self.length = self.k

    def next(self) -> int:
        """The draft length for the next launch (0 while cooling down; counts the launch)."""
        if self.cool > 0:
            self.cool -= 1
            return 0
        return self.length

    def update(self, drafted: int, accepted: int) -> None:
        """Record a verified draft of `drafted` tokens of which `accepted` were accepted."""
        if drafted <= 0:
            return
        if accepted == drafted:
            self.length, self.misses = min(self.k, self.length + 1), 0
            self.cool_steps = COOL_STEPS
        elif accepted > 0:
            self.length, self.misses = accepted + 1, 0
        else:
            self.length, self.misses = max(1, self.length // 2), self.misses + 1
            if self.misses >= COOL_AFTER:
                self.cool, self.misses = self.cool_steps, 0
                self.cool_steps = min(MAX_COOL_STEPS, 2 * self.cool_steps)


def bucket(batch_size: int) -> int:
    """The power of two at or above `batch_size` (>= 1)."""
    return 1 << max(0, batch_size - 1).bit_length()


@dataclass
class _Bucket:
    on: float | None = None
    off: float | None = None
    launches: int = 0
    last: bool | None = None
    hold: int = 0


@dataclass
class SpeedPolicy:
    """Speculate or not, per batch-size bucket, by measured output tokens per second (see the
    module doc)."""

    buckets: dict[int, _Bucket] = field(default_factory=dict)

    def speculate(self, batch_size: int) -> bool:
        """Whether the next launch of a batch of `batch_size` rows speculates (counts it)."""
        b = self.buckets.setdefault(bucket(batch_size), _Bucket())
        b.launches += 1
        if b.hold > 0:
            b.hold -= 1
            return bool(b.last)
        if b.on is None:
            choice = True
        elif b.off is None:
            choice = False
        else:
            better = b.on >= b.off
            choice = better != (b.launches % PROBE_EVERY == 0)  # now and then, the other mode
        if choice != b.last:
            b.hold = HOLD - 1
        b.last = choice
        return choice

    def record(self, batch_size: int, speculated: bool, tokens: int, seconds: float) -> None:
        """A launch's `tokens` produced in `seconds` (result to result), in the mode it ran."""
        if seconds <= 0:
            return
        b = self.buckets.setdefault(bucket(batch_size), _Bucket())
        rate = tokens / seconds
        old = b.on if speculated else b.off
        new = rate if old is None else (1 - EMA) * old + EMA * rate
        if speculated:
            b.on = new
        else:
            b.off = new

    def rates(self) -> dict[int, tuple[float | None, float | None]]:
        """Bucket -> (tokens/s with speculation, without), for logs and tests."""
        return {k: (b.on, b.off) for k, b in sorted(self.buckets.items())}
