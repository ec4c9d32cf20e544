"""`Outbox`: where the scheduler's decisions go; sockets in the process, lists in tests."""

from __future__ import annotations

from typing import Protocol

from protocol.messages import ToDetokenizer, ToTokenizer, ToWorker


class Outbox(Protocol):
    """The three outgoing channels of the scheduler."""

    def to_worker(self, msg: ToWorker) -> None:
        """Send one message to the worker."""

    def to_detokenizer(self, index: int, msg: ToDetokenizer) -> None:
        """Send one message to detokenizer replica `index`."""

    def to_tokenizer(self, msg: ToTokenizer) -> None:
        """Send one message to the tokenizer process."""
