"""Tool calls and the results that answer them, in a conversation a client sends back.

OpenAI's APIs refuse a result that answers no call and a call left without its result when the
conversation goes on (chat completions: a ``tool`` message whose ``tool_call_id`` is not a call of
the assistant turn before it, an assistant message with ``tool_calls`` not followed by a tool
message for each; Responses: a ``function_call_output`` whose ``call_id`` no ``function_call``
made, a ``function_call`` with no output), and two calls waiting under one id, which no result
could tell apart. Rendered as sent, a result would be read as the answer to whatever call came
last, or a call as answered by nothing. `CallLedger` follows one
conversation in order and raises a 400 naming the item at fault. Assistant turns may come
between calls and their results (the Responses and Anthropic routes write an assistant's text
after its calls as a message of its own); a turn of another role may not, and a conversation
may end with calls unanswered only in an assistant turn (calls just made, or a prefill).
The Anthropic route checks its own blocks (`anthropic.translate.check_tool_pairs`).
"""

from __future__ import annotations

from tokenizer_proc.errors import APIError


class CallLedger:
    """The calls of one conversation not answered yet. `call`, `result` and `turn` are fed its
    items in order, `end` after the last; each raises `APIError` 400 where pairing fails.
    result_name: what a result is called in the API's words (``tool message``,
    ``function_call_output``), for the messages."""

    def __init__(self, result_name: str) -> None:
        self.result_name = result_name
        self.pending: dict[str, str] = {}  # call id -> where the call is (a path, or words)

    def call(self, call_id: str, where: str) -> None:
        """A call with id `call_id` was made at `where`; a 400 when a call of that id still
        waits for its result (one result could not answer both)."""
        if call_id in self.pending:
            raise APIError(
                f"{where}: tool call id {call_id!r} is used twice (first at {self.pending[call_id]}): "
                f"each call needs an id of its own, which its {self.result_name} names",
                400,
                where,
            )
        self.pending[call_id] = where

    def result(self, call_id: str, param: str) -> None:
        """A result at `param` (its id's path) answers `call_id`, which must be a call not
        answered yet."""
        if self.pending.pop(call_id, None) is None:
            raise APIError(
                f"{param}: {call_id!r} answers no tool call: a {self.result_name} must answer a call "
                f"the assistant made before it and no earlier {self.result_name} answered",
                400,
                param,
            )

    def turn(self, where: str, is_assistant: bool) -> None:
        """A turn of a role other than tool at `where` (is_assistant: the assistant's own): only
        an assistant turn may come while calls wait for their results."""
        if not is_assistant:
            self._unanswered(f"before {where}")

    def end(self, last_is_assistant: bool) -> None:
        """The conversation ended; its last turn is the assistant's or not."""
        if not last_is_assistant:
            self._unanswered("at the end of the conversation")

    def _unanswered(self, when: str) -> None:
        """Raise `APIError` 400 naming the first call still waiting for its result, if any."""
        if self.pending:
            call_id, where = next(iter(self.pending.items()))
            raise APIError(
                f"{where}: tool call {call_id!r} has no {self.result_name} answering it {when}: each "
                f"call needs a {self.result_name} with its id, right after the assistant's turn",
                400,
                where,
            )
