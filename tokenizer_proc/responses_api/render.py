"""Response objects and Responses stream events.

The output is one assistant message item holding one ``output_text`` part (empty when the
model wrote nothing), the same way in both modes. status: ``completed``, or ``incomplete``
with ``incomplete_details.reason`` ``max_output_tokens`` when the token budget cut it. A
stream is ``response.created``, ``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta``..., ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done``, then ``response.completed``
(or ``response.incomplete``); each event has ``type`` and a ``sequence_number`` from 0. An
error after the 200 is an ``error`` event and ``response.failed``.
"""

from __future__ import annotations

import json
import time

from protocol.enums import FinishReason
from tokenizer_proc.errors import APIError
from tokenizer_proc.responses_api.models import ResponsesRequest
from tokenizer_proc.route_run import Outcome


def response_id(rid: str) -> str:
    """The response id for request `rid` (``resp_`` and the rid's hex, so logs can be matched)."""
    return "resp_" + rid.split("-", 1)[-1]


def _usage(o: Outcome) -> dict:
    return {"input_tokens": o.prompt_tokens, "input_tokens_details": {"cached_tokens": o.cached_tokens},
            "output_tokens": o.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": o.prompt_tokens + o.completion_tokens}


class ResponseView:
    """The bodies of one response: the Response object at each stage and its output item."""

    def __init__(self, rid: str, req: ResponsesRequest, model: str) -> None:
        self.id = response_id(rid)
        self.item_id = "msg_" + rid.split("-", 1)[-1]
        self.req, self.model = req, model
        self.created_at = int(time.time())

    def item(self, text: str, status: str) -> dict:
        """The assistant message item with `text` (no parts while in progress)."""
        content = [self.part(text)] if status != "in_progress" else []
        return {"id": self.item_id, "type": "message", "role": "assistant", "status": status, "content": content}

    @staticmethod
    def part(text: str) -> dict:
        """The ``output_text`` part with `text`."""
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}

    def body(self, status: str, o: Outcome | None = None, error: APIError | None = None) -> dict:
        """The Response object: in_progress (no output yet), completed / incomplete (with
        outcome `o`), or failed (with `error`)."""
        r, fmt = self.req, (self.req.text.format if self.req.text and self.req.text.format else None)
        body = {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": status,
            "error": None if error is None else {"code": "server_error" if error.status >= 500 else "invalid_request",
                                                 "message": error.message},
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": r.instructions, "max_output_tokens": r.max_output_tokens, "model": self.model,
            "output": [] if o is None else [self.item(o.text, status)],
            "parallel_tool_calls": r.parallel_tool_calls is not False, "previous_response_id": r.previous_response_id,
            "reasoning": None, "store": r.store, "temperature": r.temperature,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
            "tool_choice": r.tool_choice or "auto", "tools": [], "top_p": r.top_p, "truncation": "disabled",
            "usage": None if o is None else _usage(o), "user": r.user, "metadata": r.metadata or {},
        }
        return body

    def final(self, o: Outcome) -> dict:
        """The finished Response object."""
        if o.reason == FinishReason.ABORT:
            raise APIError("the request was aborted by the server", 500)
        return self.body("incomplete" if o.reason == FinishReason.LENGTH else "completed", o)


class ResponseEvents:
    """The events of one streamed response, numbered in order."""

    def __init__(self, view: ResponseView) -> None:
        self.view = view
        self.seq = 0

    def event(self, kind: str, **fields) -> str:
        """One SSE event of type `kind` with `fields`."""
        data = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def _at(self) -> dict:
        return {"item_id": self.view.item_id, "output_index": 0, "content_index": 0}

    def start(self) -> str:
        """created, in_progress, the message item and its text part added."""
        v = self.view
        return (self.event("response.created", response=v.body("in_progress"))
                + self.event("response.in_progress", response=v.body("in_progress"))
                + self.event("response.output_item.added", output_index=0, item=v.item("", "in_progress"))
                + self.event("response.content_part.added", **self._at(), part=v.part("")))

    def delta(self, text: str) -> str:
        """An output_text delta ("" for no text)."""
        return self.event("response.output_text.delta", **self._at(), delta=text, logprobs=[]) if text else ""

    def finish(self, o: Outcome) -> tuple[str, dict]:
        """The closing events and the finished Response object."""
        v = self.view
        body = v.final(o)
        status = body["status"]
        events = (self.event("response.output_text.done", **self._at(), text=o.text, logprobs=[])
                  + self.event("response.content_part.done", **self._at(), part=v.part(o.text))
                  + self.event("response.output_item.done", output_index=0, item=v.item(o.text, status))
                  + self.event(f"response.{status}", response=body))
        return events, body

    def fail(self, e: APIError) -> str:
        """An ``error`` event and ``response.failed``."""
        return (self.event("error", code=str(e.status), message=e.message, param=e.param)
                + self.event("response.failed", response=self.view.body("failed", error=e)))
