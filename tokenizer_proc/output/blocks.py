"""A chat choice's output as an ordered list of blocks, for the APIs that show output that
way (Anthropic content blocks, Responses output items): reasoning, text and tool calls,
each a block of its own, one open at a time.

`BlockSequencer` reads the `chat_output.ChatPiece`s of one choice (reasoning first, then
content and call deltas in the order the model wrote them) and says what each adds:
a block starts when the kind changes (or the next call begins), grows by text (reasoning,
content, or a call's argument text), and stops when the next starts or the output ends.
Streamed events and non-streamed bodies are both built from these blocks, so they agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from protocol.enums import FinishReason
from tokenizer_proc.link.tokenizer_manager import Delta
from tokenizer_proc.output.chat_output import ChatOutput, ChatPiece, OutputPlan
from tokenizer_proc.output.json_prefix import prefix_object

Kind = Literal["reasoning", "text", "call"]


@dataclass
class Block:
    """One output block: its kind, position, text so far (a call's: its arguments as JSON
    text), and for a call its id and function name."""

    kind: Kind
    index: int
    text: str = ""
    call_id: str | None = None
    name: str | None = None

    def call_input(self) -> dict:
        """A call's arguments as an object, read as partial JSON as far as they are JSON
        (`prefix_object`): a call cut by the token limit keeps its finished members (as the
        Anthropic SDK reads the streamed ``input_json_delta``s and as `decode_arguments` reads
        such arguments sent back); {} when they do not begin an object."""
        return prefix_object(self.text)[0]


@dataclass(frozen=True)
class Step:
    """What one piece did to one block: ``start`` (empty block), ``delta`` (with `text`), ``stop``."""

    op: Literal["start", "delta", "stop"]
    block: Block
    text: str = ""


class BlockSequencer:
    """The blocks of one choice (see the module docstring)."""

    def __init__(self) -> None:
        self.blocks: list[Block] = []
        self.open: Block | None = None
        self._call: int | None = None  # the parser's index of the open call block

    def _to(
        self,
        kind: Kind,
        steps: list[Step],
        call: int | None = None,
        call_id: str | None = None,
        name: str | None = None,
    ) -> Block:
        if self.open is not None and self.open.kind == kind and (kind != "call" or self._call == call):
            return self.open
        if self.open is not None:
            steps.append(Step("stop", self.open))
        self.open = Block(kind, len(self.blocks), call_id=call_id, name=name)
        self._call = call
        self.blocks.append(self.open)
        steps.append(Step("start", self.open))
        return self.open

    def _add(self, block: Block, text: str, steps: list[Step]) -> None:
        if text:
            block.text += text
            steps.append(Step("delta", block, text))

    def feed(self, piece: ChatPiece) -> list[Step]:
        """The steps `piece` causes, in order: reasoning, then its content and call deltas in
        the order the model wrote them (a call's rest, text after it and the next call may
        share one piece)."""
        steps: list[Step] = []
        if piece.reasoning:
            self._add(self._to("reasoning", steps), piece.reasoning, steps)
        for part in piece.parts:
            if isinstance(part, str):
                self._add(self._to("text", steps), part, steps)
            else:
                self._add(self._to("call", steps, part.index, part.id, part.name), part.arguments, steps)
        return steps

    def close(self) -> list[Step]:
        """The last block's stop (at the end of the output)."""
        if self.open is None:
            return []
        block, self.open = self.open, None
        return [Step("stop", block)]


class ChoiceBlocks:
    """One chat choice read into blocks: its `ChatOutput` (per the request's `OutputPlan`;
    None: plain text) feeding a `BlockSequencer`. reasoning_tokens: the output tokens
    through the delta that closed the think block (all of them while it is open; 0 without
    one), the reasoning's share of the completion tokens."""

    def __init__(self, plan: OutputPlan | None) -> None:
        self.output = ChatOutput(plan or OutputPlan())
        self.seq = BlockSequencer()
        self.reasoning_tokens = 0
        self._reasoned = False  # the think block has closed: reasoning_tokens is final

    def step(self, d: Delta) -> list[Step]:
        """The steps delta `d` causes (the last delta also stops the open block)."""
        final = d.finish_reason is not None
        steps = self.seq.feed(self.output.step(d.text, final, d.finish_reason == FinishReason.LENGTH))
        thinking = self.output.reasoning
        if thinking is not None and thinking.opened and not self._reasoned:
            self.reasoning_tokens, self._reasoned = d.completion_tokens, thinking.done
        return steps + self.seq.close() if final else steps

    @property
    def blocks(self) -> list[Block]:
        """The blocks so far, in output order."""
        return self.seq.blocks

    def called_tools(self, reason: FinishReason | None) -> bool:
        """Whether the choice ended on its own with complete tool calls."""
        return self.output.finish_reason(reason) == "tool_calls"
