"""`Replica` and `ReplicaSet`: the detokenizer replicas the scheduler knows, and which one
takes the next request (DESIGN.md §7).

A replica launch started (index 0..launched-1) is routed to from the start: its socket
queues until the process binds, and it registers (Hello → `ReplicaWelcome` → Ready) only
to tell its pid. An attached replica (``--attach``) gets the next free index and takes
requests once Ready. Launch restarts a dead replica under its old index.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.enums import ReplicaState


@dataclass
class Replica:
    """One replica.

    pid: its process (0 for one launch started that has not registered yet); endpoint: where
    its link connects ("" for launch's, linked from the start); attached: registered with
    ``--attach``; load: running requests it renders; routed / reseeded: requests started on
    it / moved onto it from a lost replica; last_seen: monotonic time of its last heartbeat
    (or registration); told_to_exit: sent `DetokShutdown` or `ReplicaRefused`; refused_at:
    monotonic time `ReplicaRefused` was last sent (None: never).
    """

    index: int
    pid: int = 0
    endpoint: str = ""
    state: ReplicaState = ReplicaState.LIVE
    attached: bool = False
    load: int = 0
    routed: int = 0
    reseeded: int = 0
    last_seen: float = 0.0
    told_to_exit: bool = False
    refused_at: float | None = None

    @property
    def serving(self) -> bool:
        """True while it exists and renders what it was given (STARTING, LIVE or DRAINING)."""
        return self.state != ReplicaState.GONE


class ReplicaSet:
    """The replicas by index, and the routing choice.

    launched: replicas launch started (indexes 0..launched-1, live from the start).
    """

    def __init__(self, launched: int) -> None:
        self.launched = launched
        self.by_index: dict[int, Replica] = {i: Replica(i) for i in range(launched)}
        self.next_index = launched
        self._cursor = 0

    def __iter__(self):
        return iter(sorted(self.by_index.values(), key=lambda r: r.index))

    def get(self, index: int) -> Replica | None:
        """The replica with `index`, or None."""
        return self.by_index.get(index)

    def loads(self) -> list[int]:
        """Running requests per index, 0..highest index (0 where no replica is)."""
        n = max(self.by_index, default=-1) + 1
        return [self.by_index[i].load if i in self.by_index else 0 for i in range(n)]

    def add_attached(self, pid: int, endpoint: str, now: float) -> Replica:
        """A new attached replica (STARTING) under the next free index."""
        rep = Replica(self.next_index, pid, endpoint, ReplicaState.STARTING, attached=True, last_seen=now)
        self.by_index[rep.index] = rep
        self.next_index += 1
        return rep

    def launched_replica(self, index: int) -> Replica:
        """Replica `index` of those launch started. Raises `ValueError` for another index."""
        if not 0 <= index < self.launched:
            span = f"0..{self.launched - 1}" if self.launched else "none"
            raise ValueError(
                f"detokenizer index {index} was not started by launch (it started {span}); "
                f"start extra replicas with --attach"
            )
        return self.by_index[index]

    def choose(self) -> Replica | None:
        """The LIVE replica with the fewest running requests (ties in turn), or None."""
        best: list[Replica] = []
        low = None
        for rep in self.by_index.values():
            if rep.state != ReplicaState.LIVE:
                continue
            if low is None or rep.load < low:
                low, best = rep.load, [rep]
            elif rep.load == low:
                best.append(rep)
        if not best:
            return None
        best.sort(key=lambda r: r.index)
        pick = next((r for r in best if r.index >= self._cursor), best[0])
        self._cursor = pick.index + 1
        return pick
