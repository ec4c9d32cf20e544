"""Anthropic response bodies: the whole message, and the events of a streamed one.

The output's blocks (`output.blocks`: reasoning, text, tool calls) are the message's
content blocks, ``thinking``, ``text`` and ``tool_use``, in order. A stream is
``message_start``, ``ping``, then per block ``content_block_start``, its deltas
(``thinking_delta``, ``text_delta``, ``input_json_delta`` with the call's argument text as
written; a thinking block's last is a ``signature_delta``) and ``content_block_stop``, then ``message_delta`` (stop_reason, stop_sequence,
usage) and ``message_stop``; a model that wrote nothing gives no block, in both modes.
Thinking blocks carry an empty ``signature`` (nothing here signs them); with ``thinking.display:
"omitted"`` their ``thinking`` is empty and a stream sends no ``thinking_delta`` (the block's
start, its ``signature_delta`` and stop only), as Anthropic's API redacts it. A call's
argument text is sent as far as it is JSON (`JsonPrefix`: the SDK's stream accumulator fails
on text that is not; a number once it has ended), and its non-streamed ``input`` is what the
SDK makes of that (`Block.call_input`: the SDK's stream accumulator reads the
``input_json_delta``s as partial JSON, so both modes give one input). Usage:
``input_tokens`` are the prompt tokens the prefix cache did not serve,
``cache_read_input_tokens`` those it did (Anthropic's split).
"""

from __future__ import annotations

import json

from tokenizer_proc.anthropic.translate import stop_reason
from tokenizer_proc.output.blocks import Block, Step
from tokenizer_proc.output.json_prefix import JsonPrefix
from tokenizer_proc.request.route_run import Outcome


def usage(o: Outcome) -> dict:
    """The ``usage`` of a finished request."""
    return {
        "input_tokens": o.prompt_tokens - o.cached_tokens,
        "output_tokens": o.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": o.cached_tokens,
    }


def tool_use_id(call_id: str) -> str:
    """The Anthropic id of tool call `call_id`: ``toolu_`` and the call id's own digits
    (Anthropic's prefix; OpenAI's ``call_`` dropped)."""
    return "toolu_" + call_id.removeprefix("call_")


def content_block(b: Block, started: bool = False, omit_thinking: bool = False) -> dict:
    """Block `b` as an Anthropic content block; started: as ``content_block_start`` shows
    it (empty; a tool_use's input is {}); omit_thinking: a thinking block's text is left
    out (``thinking.display: "omitted"``)."""
    if b.kind == "reasoning":
        return {"type": "thinking", "thinking": "" if started or omit_thinking else b.text, "signature": ""}
    if b.kind == "text":
        return {"type": "text", "text": "" if started else b.text}
    return {
        "type": "tool_use",
        "id": tool_use_id(b.call_id),
        "name": b.name,
        "input": {} if started else b.call_input(),
    }


def _envelope(rid: str, model: str, content: list, reason: str | None, sequence: str | None, use: dict) -> dict:
    """The Message object; its id is the request's (``msg_...``: `translate.build`)."""
    return {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": use,
    }


def message(rid: str, model: str, o: Outcome, omit_thinking: bool = False) -> dict:
    """The non-streamed response body (omit_thinking: see `content_block`)."""
    reason, sequence = stop_reason(o.reason, o.matched, o.tool_calls)
    content = [content_block(b, omit_thinking=omit_thinking) for b in o.blocks]
    return _envelope(rid, model, content, reason, sequence, usage(o))


def event(name: str, data: dict) -> str:
    """One SSE event: ``event: NAME`` and its JSON data."""
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


_DELTAS = {
    "reasoning": ("thinking_delta", "thinking"),
    "text": ("text_delta", "text"),
    "call": ("input_json_delta", "partial_json"),
}
"""Block kind -> (delta type, the delta's text field)."""


class MessageEvents:
    """The events of one streamed message, in order (see the module docstring);
    omit_thinking: thinking blocks carry no text (``thinking.display: "omitted"``)."""

    def __init__(self, rid: str, model: str, omit_thinking: bool = False) -> None:
        self.rid, self.model, self.omit_thinking = rid, model, omit_thinking
        self._json: dict[int, JsonPrefix] = {}  # call block index -> how far its argument text is JSON

    def start(self, prompt_tokens: int, cached_tokens: int) -> str:
        """``message_start`` (usage so far: the prompt, split as `usage` splits it; sent with
        the first output, when the prefix cache's share is known) and a ``ping``."""
        use = {
            "input_tokens": prompt_tokens - cached_tokens,
            "output_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached_tokens,
        }
        return event(
            "message_start", {"type": "message_start", "message": _envelope(self.rid, self.model, [], None, None, use)}
        ) + event("ping", {"type": "ping"})

    def steps(self, steps: list[Step]) -> str:
        """The content block events of `steps`."""
        out = []
        for s in steps:
            i = s.block.index
            if s.op == "start":
                out.append(
                    event(
                        "content_block_start",
                        {
                            "type": "content_block_start",
                            "index": i,
                            "content_block": content_block(s.block, started=True),
                        },
                    )
                )
            elif s.op == "delta" and s.block.kind == "reasoning" and self.omit_thinking:
                continue
            elif s.op == "delta" and s.block.kind == "call":  # only text that is still JSON (`Block.call_input`)
                text = self._json.setdefault(i, JsonPrefix()).feed(s.text)
                if text:
                    out.append(
                        event(
                            "content_block_delta",
                            {
                                "type": "content_block_delta",
                                "index": i,
                                "delta": {"type": "input_json_delta", "partial_json": text},
                            },
                        )
                    )
            elif s.op == "delta":
                kind, field = _DELTAS[s.block.kind]
                out.append(
                    event(
                        "content_block_delta",
                        {"type": "content_block_delta", "index": i, "delta": {"type": kind, field: s.text}},
                    )
                )
            else:
                if s.block.kind == "reasoning":  # as Anthropic's API: a thinking block's signature comes last
                    out.append(
                        event(
                            "content_block_delta",
                            {
                                "type": "content_block_delta",
                                "index": i,
                                "delta": {"type": "signature_delta", "signature": ""},
                            },
                        )
                    )
                out.append(event("content_block_stop", {"type": "content_block_stop", "index": i}))
        return "".join(out)

    @staticmethod
    def finish(o: Outcome) -> str:
        """``message_delta`` and ``message_stop``."""
        reason, sequence = stop_reason(o.reason, o.matched, o.tool_calls)
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage(o),
        }
        return event("message_delta", delta) + event("message_stop", {"type": "message_stop"})
