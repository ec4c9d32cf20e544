"""Anthropic response bodies: the whole message, and the events of a streamed one.

A stream is ``message_start``, ``ping``, then for the text (once there is any) a
``content_block_start`` / ``content_block_delta`` (text_delta)... / ``content_block_stop``,
then ``message_delta`` (stop_reason, stop_sequence, usage) and ``message_stop``. The
message's content is one text block, or none when the model wrote nothing, the same way in
both modes. Usage: ``input_tokens`` are the prompt tokens the prefix cache did not serve,
``cache_read_input_tokens`` those it did (Anthropic's split).
"""

from __future__ import annotations

import json

from tokenizer_proc.anthropic.translate import stop_reason
from tokenizer_proc.route_run import Outcome


def message_id(rid: str) -> str:
    """The message id for request `rid` (``msg_`` and the rid's hex, so logs can be matched)."""
    return "msg_" + rid.split("-", 1)[-1]


def usage(o: Outcome) -> dict:
    """The ``usage`` of a finished request."""
    return {"input_tokens": o.prompt_tokens - o.cached_tokens, "output_tokens": o.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": o.cached_tokens}


def _envelope(rid: str, model: str, content: list, reason: str | None, sequence: str | None, use: dict) -> dict:
    return {"id": message_id(rid), "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": sequence, "usage": use}


def message(rid: str, model: str, o: Outcome) -> dict:
    """The non-streamed response body."""
    reason, sequence = stop_reason(o.reason, o.matched)
    content = [{"type": "text", "text": o.text}] if o.text else []
    return _envelope(rid, model, content, reason, sequence, usage(o))


def event(name: str, data: dict) -> str:
    """One SSE event: ``event: NAME`` and its JSON data."""
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class MessageEvents:
    """The events of one streamed message, in order (see the module docstring)."""

    def __init__(self, rid: str, model: str) -> None:
        self.rid, self.model = rid, model
        self.open = False

    def start(self, prompt_tokens: int) -> str:
        """``message_start`` (usage so far: the prompt) and a ``ping``."""
        use = {"input_tokens": prompt_tokens, "output_tokens": 0, "cache_creation_input_tokens": 0,
               "cache_read_input_tokens": 0}
        return (event("message_start", {"type": "message_start",
                                        "message": _envelope(self.rid, self.model, [], None, None, use)})
                + event("ping", {"type": "ping"}))

    def text(self, text: str) -> str:
        """A ``text_delta`` of `text` (opening the text block first); "" for no text."""
        if not text:
            return ""
        out = ""
        if not self.open:
            self.open = True
            out = event("content_block_start", {"type": "content_block_start", "index": 0,
                                                "content_block": {"type": "text", "text": ""}})
        return out + event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                   "delta": {"type": "text_delta", "text": text}})

    def finish(self, o: Outcome) -> str:
        """``content_block_stop`` (if a block is open), ``message_delta`` and ``message_stop``."""
        reason, sequence = stop_reason(o.reason, o.matched)
        out = event("content_block_stop", {"type": "content_block_stop", "index": 0}) if self.open else ""
        delta = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                 "usage": usage(o)}
        return out + event("message_delta", delta) + event("message_stop", {"type": "message_stop"})
