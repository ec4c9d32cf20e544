"""Response objects and Responses stream events.

The output's blocks (`output.blocks`) are the response's output items, in order: reasoning
→ a ``reasoning`` item (its text as one ``reasoning_text`` part), text → an assistant
``message`` item with one ``output_text`` part, a tool call → a ``function_call`` item
(call_id, name, arguments as written). A model that wrote nothing gives one empty message
item, in both modes. status: ``completed`` (with ``completed_at``), or ``incomplete`` with
``incomplete_details.reason`` ``max_output_tokens`` when the token budget cut it (the last
item is then incomplete too); a function_call item whose arguments are no whole JSON object
is ``incomplete`` in any case.

A stream is ``response.created``, ``response.in_progress``, then per item
``response.output_item.added``, its part (``response.content_part.added`` / ``.done``
around the text of messages and reasoning), its deltas (``response.output_text.delta``,
``response.reasoning_text.delta``, ``response.function_call_arguments.delta``), their
``.done`` and ``response.output_item.done``, then ``response.completed`` (or
``response.incomplete``); every event has ``type`` and a ``sequence_number`` from 0. An
error after the 200 is an ``error`` event and ``response.failed``.
"""

from __future__ import annotations

import json
import time

from protocol.enums import FinishReason
from protocol.messages import DEFAULT_SAMPLING
from tokenizer_proc.errors import APIError, shown_message
from tokenizer_proc.output.blocks import Block, Step
from tokenizer_proc.request.fields import SERVED_TIER
from tokenizer_proc.request.route_run import Outcome
from tokenizer_proc.responses.models import ResponsesRequest
from tokenizer_proc.responses.translate import ID_PREFIX
from tokenizer_proc.tools.parsers import is_call_object

PREFIX = {"reasoning": "rs", "text": "msg", "call": "fc"}
"""Block kind -> the id prefix of its output item."""
PART = {"reasoning": "reasoning_text", "text": "output_text"}
"""Block kind -> the type of its item's content part (calls have none)."""


def _usage(o: Outcome) -> dict:
    """The Response ``usage`` of `o` (cache_write_tokens: 0, as the Anthropic routes report
    no cache creation; the `openai` SDK's models require the field)."""
    return {
        "input_tokens": o.prompt_tokens,
        "input_tokens_details": {"cached_tokens": o.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": o.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": o.reasoning_tokens},
        "total_tokens": o.prompt_tokens + o.completion_tokens,
    }


def _error_code(e: APIError) -> str:
    """The Response ``error.code`` of `e` (one of the API's codes)."""
    if e.status == 429:
        return "rate_limit_exceeded"
    return "server_error" if e.status >= 500 else "invalid_prompt"


def part(kind: str, text: str) -> dict:
    """The content part of a message (``output_text``) or reasoning item with `text`."""
    if kind == "text":
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"type": "reasoning_text", "text": text}


class ResponseView:
    """The bodies of one response: the Response object at each stage and its output items."""

    def __init__(self, rid: str, req: ResponsesRequest, model: str) -> None:
        self.id = rid  # the request ran under the response's id (`translate.build`)
        self.hex = rid.removeprefix(ID_PREFIX)
        self.req, self.model = req, model
        self.created_at = int(time.time())

    def item_id(self, b: Block) -> str:
        """The output item id of block `b`."""
        return f"{PREFIX[b.kind]}_{self.hex}_{b.index}"

    def item(self, b: Block, status: str) -> dict:
        """Block `b` as an output item with `status` (in_progress: as first announced, empty); a
        call whose arguments are no whole JSON object (cut by EOS, not JSON) is never
        ``completed`` but ``incomplete``, as chat's finish_reason is then no ``tool_calls``."""
        started = status == "in_progress"
        if b.kind == "call":
            if status == "completed" and not is_call_object(b.text):
                status = "incomplete"
            return {
                "id": self.item_id(b),
                "type": "function_call",
                "status": status,
                "call_id": b.call_id,
                "name": b.name,
                "arguments": "" if started else b.text,
            }
        content = [] if started else [part(b.kind, b.text)]
        if b.kind == "text":
            return {"id": self.item_id(b), "type": "message", "role": "assistant", "status": status, "content": content}
        return {"id": self.item_id(b), "type": "reasoning", "status": status, "summary": [], "content": content}

    def items(self, o: Outcome) -> list[dict]:
        """The finished output items (one empty message when there are no blocks)."""
        blocks = o.blocks or [Block("text", 0)]
        last = "incomplete" if o.reason == FinishReason.LENGTH else "completed"
        return [self.item(b, last if b is blocks[-1] else "completed") for b in blocks]

    def body(self, status: str, o: Outcome | None = None, error: APIError | None = None) -> dict:
        """The Response object: in_progress (no output yet), completed / incomplete (with
        outcome `o`), or failed (with `error`); it echoes the request's settings, as OpenAI's
        does (user, safety_identifier, the prompt-cache key and retention, ...)."""
        r, fmt = self.req, (self.req.text.format if self.req.text and self.req.text.format else None)
        choice = (
            r.tool_choice.model_dump()
            if r.tool_choice is not None and not isinstance(r.tool_choice, str)
            else r.tool_choice or "auto"
        )
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if status == "completed" else None,
            "error": None
            if error is None
            else {
                "code": _error_code(error),
                "message": shown_message(error.message),
                "param": error.param,
                "type": error.type,
            },
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": r.instructions,
            "max_output_tokens": r.max_output_tokens,
            "model": self.model,
            "output": [] if o is None else self.items(o),
            "parallel_tool_calls": r.parallel_tool_calls is not False,
            "previous_response_id": r.previous_response_id,
            "reasoning": None,
            "store": r.store,
            "service_tier": SERVED_TIER,
            "temperature": DEFAULT_SAMPLING.temperature if r.temperature is None else r.temperature,
            "top_p": DEFAULT_SAMPLING.top_p if r.top_p is None else r.top_p,
            "background": False,
            "text": {
                "format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"},
                "verbosity": "medium",
            },
            "tool_choice": choice,
            "tools": [t.model_dump(exclude_none=True) for t in r.tools or []],
            "truncation": "disabled",
            "usage": None if o is None else _usage(o),
            "user": r.user,
            "metadata": r.metadata or {},
            "safety_identifier": r.safety_identifier,
            "prompt_cache_key": r.prompt_cache_key,
            "prompt_cache_retention": r.prompt_cache_retention,
            "top_logprobs": r.top_logprobs,
        }

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

    def start(self) -> tuple[str, dict]:
        """``response.created`` and ``response.in_progress``, and the in-progress Response object."""
        body = self.view.body("in_progress")
        return self.event("response.created", response=body) + self.event("response.in_progress", response=body), body

    def _where(self, b: Block) -> dict:
        at = {"item_id": self.view.item_id(b), "output_index": b.index}
        return at if b.kind == "call" else {**at, "content_index": 0}

    def steps(self, steps: list[Step], final: str = "completed") -> str:
        """The events of `steps`; final: the status of the item the last step stops (the
        output's end stops the last item)."""
        out = []
        for k, s in enumerate(steps):
            b, at = s.block, self._where(s.block)
            if s.op == "start":
                out.append(
                    self.event(
                        "response.output_item.added", output_index=b.index, item=self.view.item(b, "in_progress")
                    )
                )
                if b.kind != "call":
                    out.append(self.event("response.content_part.added", **at, part=part(b.kind, "")))
            elif s.op == "delta":
                kind = {"text": "output_text", "reasoning": "reasoning_text", "call": "function_call_arguments"}
                extra = {"logprobs": []} if b.kind == "text" else {}
                out.append(self.event(f"response.{kind[b.kind]}.delta", **at, delta=s.text, **extra))
            else:
                out.append(self._done(b, final if k == len(steps) - 1 else "completed"))
        return "".join(out)

    def _done(self, b: Block, status: str) -> str:
        at = self._where(b)
        if b.kind == "call":
            out = self.event("response.function_call_arguments.done", **at, arguments=b.text, name=b.name)
        else:
            extra = {"logprobs": []} if b.kind == "text" else {}
            kind = "output_text" if b.kind == "text" else "reasoning_text"
            out = self.event(f"response.{kind}.done", **at, text=b.text, **extra) + self.event(
                "response.content_part.done", **at, part=part(b.kind, b.text)
            )
        return out + self.event("response.output_item.done", output_index=b.index, item=self.view.item(b, status))

    def finish(self, o: Outcome) -> tuple[str, dict]:
        """The closing events (an empty message first when there were no blocks) and the
        finished Response object."""
        body = self.view.final(o)
        status = body["status"]
        out = ""
        if not o.blocks:
            empty = Block("text", 0)
            out = self.steps([Step("start", empty)]) + self._done(empty, status)
        return out + self.event(f"response.{status}", response=body), body

    def fail(self, e: APIError) -> str:
        """An ``error`` event and ``response.failed``."""
        return self.event("error", code=str(e.status), message=e.message, param=e.param) + self.event(
            "response.failed", response=self.view.body("failed", error=e)
        )
