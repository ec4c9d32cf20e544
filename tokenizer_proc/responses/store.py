"""Stored responses (``store: true``), kept in memory for ``previous_response_id`` and
``GET /v1/responses/{id}``: at most `MAX_STORED` of them, each for `TTL_S` seconds after it
finished; the oldest go first when full. Nothing survives a restart. A stored response
keeps its Response body and its conversation as chat messages (without instructions);
a later response's conversation shares the earlier one's message objects, so a long
chain costs one reference per message, not a copy of the text.

A streamed response's id reaches the client (``response.created``) before it finishes: while
it runs (`begin` .. `end`) it is retrieved as its in-progress Response object, deleting it
means it is not stored when it finishes, and continuing it (``previous_response_id``) is a
400 saying it is still in progress. (It was a 404 "not stored here" for all three, and a
delete was lost: the response was stored when it finished.)
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from tokenizer_proc.errors import APIError, not_found

MAX_STORED = 1024
"""Responses kept at most (the least recently stored go first)."""
TTL_S = 3600.0
"""Seconds a response is kept after it finished."""


@dataclass(frozen=True)
class Stored:
    """body: the Response object; messages: the conversation through its output; until: expiry (clock s)."""

    body: dict
    messages: list[dict[str, str]]
    until: float


class ResponseStore:
    """The stored responses by id (see the module docstring). clock: seconds, monotonic."""

    def __init__(
        self, max_stored: int = MAX_STORED, ttl_s: float = TTL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_stored, self.ttl_s, self.clock = max_stored, ttl_s, clock
        self.items: OrderedDict[str, Stored] = OrderedDict()
        self.running: dict[str, dict] = {}  # id -> in-progress Response object, between begin and end
        self.dropped: set[str] = set()  # running ids deleted: not stored when they finish
        self.unstored: OrderedDict[str, str] = OrderedDict()
        """Ids of streamed responses that stopped before they finished -> why (at most
        `max_stored`), so that retrieving one says why it is not stored."""

    def begin(self, rid: str, body: dict) -> None:
        """Response `rid` (to be stored) runs, its id known to the client; `body`: its
        in-progress Response object."""
        self.running[rid] = body

    def end(self, rid: str, why: str = "") -> None:
        """Response `rid` stopped running (finished and `put`, failed, or its client left).
        why: why it stopped unfinished, said when it is retrieved (unless it was deleted)."""
        if self.running.pop(rid, None) is not None and why and rid not in self.dropped:
            self.unstored[rid] = why
            while len(self.unstored) > self.max_stored:
                self.unstored.popitem(last=False)
        self.dropped.discard(rid)

    def _expire(self) -> None:
        now = self.clock()
        while self.items and next(iter(self.items.values())).until <= now:
            self.items.popitem(last=False)

    def put(self, rid: str, body: dict, messages: list[dict[str, str]]) -> None:
        """Keep response `rid` (evicting expired ones, then the oldest past `max_stored`),
        unless it was deleted while it ran."""
        self.running.pop(rid, None)
        if rid in self.dropped:
            self.dropped.discard(rid)
            return
        self._expire()
        self.items[rid] = Stored(body, messages, self.clock() + self.ttl_s)
        while len(self.items) > self.max_stored:
            self.items.popitem(last=False)

    def get(self, rid: str, param: str | None = None) -> Stored:
        """Stored response `rid`. Raises `APIError` when it is not kept (never stored, expired,
        evicted or from before a restart), its message naming the id: a 404 with code
        ``not_found`` (`errors.not_found`), or, for the id a request's field `param` gave, a
        400 naming it with code ``previous_response_not_found`` (OpenAI's code for that field).
        A running response is its in-progress Response object, without messages; for a
        field's id, a 400 saying it is still in progress."""
        self._expire()
        if rid in self.running:
            if param is not None:
                raise APIError(f"response {rid!r} is still in progress: continue it once it has finished", 400, param)
            return Stored(self.running[rid], [], self.clock() + self.ttl_s)
        found = self.items.get(rid)
        if found is None:
            e = (
                not_found("response", rid, f"it was not stored: {self.unstored[rid]}")
                if rid in self.unstored
                else not_found(
                    "response",
                    rid,
                    f"it is not stored here: responses are kept in memory only when store "
                    f"is true, for {self.ttl_s:g} s, at most {self.max_stored} of them, and not across restarts",
                )
            )
            if param is not None:  # not a missing resource: a bad value of a field
                raise APIError(e.message, 400, param, code="previous_response_not_found")
            raise e
        return found

    def delete(self, rid: str) -> None:
        """Forget response `rid` (a running one is not stored when it finishes). Raises
        `APIError` 404 when it is not kept."""
        if self.running.pop(rid, None) is not None:
            self.dropped.add(rid)
            return
        self.get(rid)
        del self.items[rid]
