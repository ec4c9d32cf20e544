"""When and how much to draft: per request from its acceptance, per batch from measured speed.

- **Per request** (`DraftLength`): the draft length starts at the server's k; a draft
  accepted whole lengthens the next by one (up to k), one accepted in part sets it to the
  accepted count plus one, one rejected whole halves it; after `COOL_AFTER` drafts in a row
  rejected whole, the request drafts nothing for `COOL_STEPS` launches, doubling each time
  it happens again (a free-text stretch costs at most a few wasted positions).
- **Per batch size** (`SpeedPolicy`): how long drafts may be, from 0 (speculation off) to
  k, is chosen by measured speed. A verify of k + 1 positions a row costs more than a
  decode step, by an amount that depends on the machine (on the 2-core CPU a row of 2
  positions costs what 1 does, 5 positions about 1.9x: `bench/spec_decode.py`), and
  speculation costs the batch its chained decodes (a verify's accepted tokens must reach the
  scheduler before it drafts again, so the next launch cannot be queued behind it). So the
  policy measures, per batch-size bucket (powers of two) and per cap on the draft length, the
  output tokens per second from one result to the next and drafts under the cap that
  measured fastest. A launch yields anything from 1 to k + 1 tokens a row, so a rate is
  tokens over seconds summed over the cap's recent launches (each earlier launch weighted
  by `DECAY` per launch of that cap), not an average of per-launch rates. The caps are
  climbed from 0: a bucket starts off, then tries 1, and tries the next cap up while the
  last one measured faster (a cap that measured slower is not climbed past: on a CPU, where
  a verify of 5 positions a row costs about what 2 decode steps do, the costly caps are only
  tried where the cheaper ones paid); then every `PROBE_EVERY` launches it tries the
  neighbours of the fastest cap again, so that the choice follows the workload; the cap in
  use is kept unless another measured `MARGIN` faster. A cap once
  chosen is held for `HOLD` launches, and only a launch that follows one of its own cap is
  measured (the first after a switch pays the switch: an unchained decode, or a verify
  behind a chained decode).
"""

from __future__ import annotations

from dataclasses import dataclass, field

COOL_AFTER = 3
COOL_STEPS = 8
MAX_COOL_STEPS = 256
PROBE_EVERY = 48
HOLD = 8
DECAY = 0.98
"""Weight of a cap's earlier launches in its rate, per later launch of that cap (about the
last 50 launches count)."""
MARGIN = 1.05
"""Another cap replaces the current one only when its rate is this much higher (rates move
by 10-15% with the text being written: without a margin the choice flips every few launches)."""


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
    sums: dict[int, tuple[float, float]] = field(default_factory=dict)
    """cap -> (decayed tokens, decayed seconds)."""
    launches: int = 0
    last: int | None = None
    hold: int = 0
    probe: int = 0


@dataclass
class SpeedPolicy:
    """The draft-length cap per batch-size bucket, by measured output tokens per second (see
    the module doc). k: the longest draft (``--speculative-num-draft-tokens``)."""

    k: int
    buckets: dict[int, _Bucket] = field(default_factory=dict)
    switches: list[tuple[int, int, dict[int, float]]] = field(default_factory=list)
    """(bucket, the cap switched to, the bucket's rates then), since the caller last took
    them (the scheduler logs them)."""

    def cap(self, batch_size: int) -> int:
        """The draft-length cap of the next launch of a batch of `batch_size` rows (0:
        speculation off); counts the launch."""
        b = self.buckets.setdefault(bucket(batch_size), _Bucket())
        b.launches += 1
        if b.hold > 0:
            b.hold -= 1
            return b.last
        choice = self._climb(b)
        if choice != b.last:
            b.hold = HOLD - 1
            self.switches.append((bucket(batch_size), choice, self.rates().get(bucket(batch_size), {})))
        b.last = choice
        return choice

    def _climb(self, b: _Bucket) -> int:
        """The next cap of bucket `b` (see the module doc)."""
        if not b.sums:
            return 0
        rate = {c: t / d for c, (t, d) in b.sums.items()}
        best = max(rate, key=rate.get)
        if b.last in rate and rate[best] < MARGIN * rate[b.last]:
            best = b.last
        near = [c for c in (best + 1, best - 1) if 0 <= c <= self.k]
        untried = [c for c in near if c not in b.sums]
        if untried:
            return untried[0]
        if near and b.launches % PROBE_EVERY == 0:  # now and then, a neighbour again
            b.probe += 1
            return near[b.probe % len(near)]
        return best

    def record(self, batch_size: int, cap: int, tokens: int, seconds: float) -> None:
        """A launch's `tokens` produced in `seconds` (result to result) under draft cap `cap`."""
        if seconds <= 0:
            return
        b = self.buckets.setdefault(bucket(batch_size), _Bucket())
        t, d = b.sums.get(cap, (0.0, 0.0))
        b.sums[cap] = (DECAY * t + tokens, DECAY * d + seconds)

    def rates(self) -> dict[int, dict[int, float]]:
        """Bucket -> {cap: tokens/s}, for logs and tests."""
        return {k: {c: t / d for c, (t, d) in sorted(b.sums.items())} for k, b in sorted(self.buckets.items())}
