"""An accepted request's claim on what its choices need before they start (`Hold`): room
in the queue limit and the ids its client chose. Its own module so that the routes, the SSE
response and the manager share one definition without importing each other."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

ClientGone = Callable[[], Awaitable[bool]]
"""Whether a request's client has left (its connection closed), e.g. Starlette's
``Request.is_disconnected``."""


class Ledger(Protocol):
    """What holds are counted in (`TokenizerManager` is the one): held, the choices accepted
    and not started; client_rids, the ids clients chose that are in use; client_gone, for
    some of those ids, whether their client has left; release_client_rids lets ids go."""

    held: int
    client_rids: set[str]
    client_gone: dict[str, ClientGone]

    def release_client_rids(self, ids: Iterable[str | None]) -> None: ...


class Hold:
    """What one accepted request's choices claim before they start: room in the queue limit
    (``--max-queued-requests``) for the `left` choices not started, counted in
    `TokenizerManager.in_flight`, and the ids their client chose (`ids`), held in use in
    `TokenizerManager.client_rids`. Taken in the same step as the checks that accepted them
    (`choices.check_can_start`), so requests arriving together cannot all pass the same
    check; each choice takes its share over as it starts (`take`, in its `generate`), and
    the request gives back the rest when it ends without starting them (`release`: a
    client that left before its stream began). gone: tells whether the request's client has
    left, kept with its ids until they are let go (`TokenizerManager.wait_rids_free`)."""

    def __init__(self, manager: Ledger, n: int, ids: tuple[str, ...] = (), gone: ClientGone | None = None) -> None:
        self.manager, self.left, self.ids = manager, n, set(ids)
        manager.held += n
        manager.client_rids.update(self.ids)
        if gone is not None:
            manager.client_gone.update(dict.fromkeys(self.ids, gone))

    def take(self, client_rid: str | None = None) -> None:
        """One choice starts (with the id its client chose, if any): from now on its queue
        counts it and its `generate` holds the id."""
        if self.left > 0:
            self.left -= 1
            self.manager.held -= 1
        if client_rid in self.ids:
            self.ids.discard(client_rid)
            self.manager.client_rids.discard(client_rid)

    def release(self) -> None:
        """Give back the room and the ids of the choices not started (idempotent)."""
        self.manager.held -= self.left
        self.left = 0
        self.manager.release_client_rids(self.ids)
        self.ids.clear()
