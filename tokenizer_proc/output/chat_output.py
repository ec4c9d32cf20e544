"""What a chat choice shows, delta by delta: the model's text split into reasoning
(`reasoning.ReasoningParser`), content and tool calls (`tools.parsers`), in OpenAI's shapes.

The reasoning parser reads the text first; its content goes through the tool parser (a call
inside the reasoning is reasoning). Streamed chunks and the non-streamed message come from
the same `ChatOutput`, fed the same text, so both report the same content, reasoning and
calls. When tool calls are parsed, whitespace-only content is held back and shown only if
more content follows (the newlines around markup are not content), and the finish reason of
a choice that ended on its own with complete calls is ``tool_calls``; a choice cut by the
token limit stays ``length`` whatever it holds, and markup it cut before a call's name was
out is dropped (not content).
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.enums import FinishReason
from tokenizer_proc.output.reasoning import ReasoningParser
from tokenizer_proc.tools.parsers import CallDelta, ParsedDelta, ToolParser


@dataclass(frozen=True)
class OutputPlan:
    """How a chat request's output is read. tool_parser: parse calls with it (None: no
    parsing); max_calls: calls reported at most (None: any); reasoning: split out the
    think block; in_reasoning: the output starts inside it."""

    tool_parser: type[ToolParser] | None = None
    max_calls: int | None = None
    reasoning: bool = False
    in_reasoning: bool = False


@dataclass
class ChatPiece(ParsedDelta):
    """What one delta adds: reasoning (before the rest), then content and call deltas (OpenAI
    ``delta.tool_calls``) as `parts`, in the order the model wrote them."""

    reasoning: str = ""

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.calls)

    def delta(self) -> dict:
        """The fields of an OpenAI stream chunk's ``delta`` (only those with something)."""
        out: dict = {}
        if self.content:
            out["content"] = self.content
        if self.reasoning:
            out["reasoning_content"] = out["reasoning"] = self.reasoning
        if self.calls:
            out["tool_calls"] = [_call_delta(c) for c in _one_per_call(self.calls)]
        return out


def _one_per_call(calls: list[CallDelta]) -> list[CallDelta]:
    """`calls` with the deltas of one call merged (id and name from the first that has them,
    arguments concatenated), in order: OpenAI sends one ``tool_calls`` entry per index in a
    chunk (a parser can yield a call's id and its first arguments as two deltas)."""
    out: list[CallDelta] = []
    for c in calls:
        if out and out[-1].index == c.index:
            last = out[-1]
            out[-1] = CallDelta(
                c.index,
                last.id if last.id is not None else c.id,
                last.name if last.name is not None else c.name,
                last.arguments + c.arguments,
            )
        else:
            out.append(c)
    return out


def _call_delta(c: CallDelta) -> dict:
    d: dict = {"index": c.index}
    if c.id is not None:
        d["id"], d["type"] = c.id, "function"
    fn = {"arguments": c.arguments}
    if c.name is not None:
        fn = {"name": c.name, **fn}
    d["function"] = fn
    return d


class ChatOutput:
    """One chat choice's output reader (see the module docstring)."""

    def __init__(self, plan: OutputPlan) -> None:
        self.plan = plan
        self.reasoning = ReasoningParser(plan.in_reasoning) if plan.reasoning else None
        self.tools = plan.tool_parser() if plan.tool_parser is not None else None
        self._space = ""  # whitespace-only content held back while calls are parsed
        self.content, self.reasoning_text = "", ""

    def step(self, text: str, final: bool = False, cut: bool = False) -> ChatPiece:
        """What `text` (the next delta's text) adds; `final`: it is the last delta; `cut`:
        the token limit ended the output there (markup it cut short is not content:
        `ToolParser.finish`)."""
        piece = ChatPiece()
        content = text
        if self.reasoning is not None:
            r = self.reasoning.feed(text)
            if final:
                end = self.reasoning.finish()
                r.reasoning, r.content = r.reasoning + end.reasoning, r.content + end.content
            piece.reasoning, content = r.reasoning, r.content
        if self.tools is None:
            piece.add_text(content)
        else:
            parsed = self.tools.feed(content)
            if final:
                parsed.extend(self.tools.finish(cut))
            limit = self.plan.max_calls
            for part in parsed.parts:
                if isinstance(part, str):
                    piece.add_text(self._hold_space(part))
                elif limit is None or part.index < limit:
                    piece.add_call(part)
            if final:
                if not self.tools.calls:
                    piece.add_text(self._space)
                self._space = ""
        self.content += piece.content
        self.reasoning_text += piece.reasoning
        return piece

    def _hold_space(self, text: str) -> str:
        """`text` after the whitespace held back before it, or "" while they are whitespace
        only (held back, to be shown before the next content, or at the end when no call came)."""
        text = self._space + text
        self._space = "" if text.strip() else text
        return text if text.strip() else ""

    def calls(self) -> list[dict]:
        """The calls parsed from the whole output, OpenAI ``message.tool_calls`` entries."""
        if self.tools is None:
            return []
        calls = self.tools.calls[: self.plan.max_calls] if self.plan.max_calls else self.tools.calls
        return [c.openai() for c in calls]

    def finish_reason(self, reason: FinishReason | None) -> str | None:
        """The OpenAI finish reason: ``tool_calls`` for a choice that stopped on its own
        with complete calls, else the request's own."""
        if reason == FinishReason.STOP and self.tools is not None and self.tools.calls and self.tools.complete:
            return "tool_calls"
        return None if reason is None else reason.api_str

    def message(self) -> dict:
        """The non-streamed ``message`` (after the last `step`); ``refusal`` is always null
        (OpenAI's schema requires the field; this server never refuses)."""
        calls = self.calls()
        empty = calls or self.reasoning_text  # OpenAI and vLLM: null content beside calls or reasoning only
        msg: dict = {
            "role": "assistant",
            "content": self.content if self.content or not empty else None,
            "refusal": None,
        }
        if self.reasoning is not None:
            msg["reasoning_content"] = msg["reasoning"] = self.reasoning_text or None
        if calls:
            msg["tool_calls"] = calls
        return msg
