"""`Outbox`: where the scheduler's decisions go; sockets in the process, lists in tests."""

from __future__ import annotations

from typing import Protocol

from protocol.messages import ToDetokenizer, ToTokenizer, ToWorker


class Outbox(Protocol):
    """The three outgoing channels of the scheduler, and the links to detokenizer replicas."""

    def to_worker(self, msg: ToWorker) -> None:
        """Send one message to the worker."""

    def to_detokenizer(self, index: int, msg: ToDetokenizer) -> None:
        """Send one message to detokenizer replica `index`."""

    def to_tokenizer(self, msg: ToTokenizer) -> None:
        """Send one message to the tokenizer process."""

    def connect_detokenizer(self, index: int, endpoint: str) -> None:
        """Open the link to replica `index`, which listens on `endpoint` (replacing any old link)."""

    def disconnect_detokenizer(self, index: int, flush: bool = False) -> None:
        """Close the link to replica `index`; unsent messages are dropped unless `flush`."""
