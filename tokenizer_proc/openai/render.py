"""OpenAI response bodies (whole responses and SSE stream chunks) and what each choice's
chunks show (`ChoiceView`: echoed prompt, logprobs)."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass

from protocol.enums import FinishReason
from protocol.messages import LogprobEntries
from tokenizer_proc.link.tokenizer_manager import Delta
from tokenizer_proc.output.logprob_format import chat_content, completion_part, join_completion
from tokenizer_proc.request.fields import SERVED_TIER


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """The OpenAI ``usage`` object; cached_tokens: prompt tokens served from the prefix cache."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def system_fingerprint(*config: object) -> str:
    """OpenAI's ``system_fingerprint``: ``fp_`` and 10 hex digits of a hash of `config` (what
    decides the outputs: the server's version, the model, the settings that change the
    answer), the same for every response of one configuration and different when it
    changes, as OpenAI's and vLLM's are."""
    text = json.dumps([repr(part) for part in config])
    return "fp_" + hashlib.sha256(text.encode()).hexdigest()[:10]


def finish_str(reason: FinishReason | str | None) -> str | None:
    """OpenAI ``finish_reason`` string (None while running; a string is one already)."""
    return reason if reason is None or isinstance(reason, str) else reason.api_str


@dataclass(frozen=True)
class Piece:
    """What one delta of one choice shows: text, logprobs in the endpoint's shape (None when
    not asked) and how many logprob entries those hold."""

    text: str
    logprobs: dict | None = None
    entries: int = 0


class ChoiceView:
    """One choice of a chat or completions request, delta by delta.

    kind: "chat" or "completion"; logprobs: the request asked for them; echo: text shown
    before the choice's own (completions echo), with head (the prompt's first token, see
    `request.builder.Built`) and the prompt's logprob entries first in its logprobs.
    """

    def __init__(self, kind: str, logprobs: bool, echo: str | None = None, head: LogprobEntries | None = None) -> None:
        self.kind, self.logprobs, self.echo, self.head = kind, logprobs, echo, head
        self.first = True
        self.offset = 0  # completions text_offset of the next entry, in characters of the returned text

    def step(self, d: Delta) -> Piece:
        """The text and logprobs that delta `d` adds (the first one also shows the echo)."""
        text, prompt = d.text, []
        echoed = self.first and self.echo is not None
        if echoed:
            text = self.echo + text
            prompt = [(e, e is self.head) for e in (self.head, d.prompt_logprobs) if e is not None]
        self.first = False
        if not self.logprobs:
            return Piece(text)
        output = [(d.logprobs, False)] if d.logprobs is not None else []
        entries = sum(len(e.token_ids) for e, _ in prompt + output)
        if self.kind == "chat":
            return Piece(text, {"content": [c for e, _ in prompt + output for c in chat_content(e)]}, entries)
        parts = [self._completion_part(e, head) for e, head in prompt]
        if echoed:
            self.offset = len(self.echo)  # the completion's text starts right after the echoed prompt
        parts += [self._completion_part(e, head) for e, head in output]
        return Piece(text, join_completion(parts), entries)

    def _completion_part(self, e: LogprobEntries, head: bool) -> dict:
        part, self.offset = completion_part(e, self.offset, head)
        return part

    def join(self, pieces: list[Piece]) -> dict | None:
        """The non-streamed logprobs of this choice: its pieces' logprobs joined."""
        if not self.logprobs:
            return None
        if self.kind == "chat":
            return {"content": [c for p in pieces for c in p.logprobs["content"]]}
        return join_completion([p.logprobs for p in pieces])


class ResponseShape:
    """Builds bodies for one endpoint kind ("chat" or "completion") and one request;
    fingerprint: the server's `system_fingerprint`, in every body and chunk."""

    def __init__(self, kind: str, rid: str, model: str, fingerprint: str | None = None) -> None:
        self.kind, self.rid, self.model, self.fingerprint = kind, rid, model, fingerprint
        self.created = int(time.time())
        self.obj = "chat.completion.chunk" if kind == "chat" else "text_completion"

    def _envelope(self, obj: str, choices: list) -> dict:
        """The fields every body and chunk carries; chat's also say the tier served (OpenAI's
        completions objects have no such field)."""
        body = {
            "id": self.rid,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": choices,
        }
        if self.kind == "chat":
            body["service_tier"] = SERVED_TIER
        return body

    def choice(
        self,
        index: int,
        text: str,
        reason: FinishReason | str | None,
        matched,
        logprobs: dict | None,
        message: dict | None = None,
    ) -> dict:
        """One choice of the non-streamed response; chat: `message` (see `ChatOutput.message`)
        or else the text as the assistant's content."""
        choice = {"index": index, "logprobs": logprobs, "finish_reason": finish_str(reason), "stop_reason": matched}
        if self.kind == "chat":
            choice["message"] = message or {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return choice

    def full(self, choices: list[dict], prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
        """The non-streamed response; choices in index order."""
        body = self._envelope("chat.completion" if self.kind == "chat" else "text_completion", choices)
        body["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens)
        return body

    def chunk(
        self,
        index: int,
        text: str | None,
        reason: FinishReason | str | None = None,
        matched=None,
        role: bool = False,
        logprobs: dict | None = None,
        delta: dict | None = None,
    ) -> dict:
        """One streamed chunk of choice `index`; for chat, `role` sends the assistant role and
        `delta` adds fields to the delta (reasoning, tool calls; see `ChatPiece.delta`)."""
        choice = {"index": index, "logprobs": logprobs, "finish_reason": finish_str(reason)}
        if reason is not None:
            choice["stop_reason"] = matched
        if self.kind == "chat":
            delta_fields, delta = delta, {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice["delta"] = {**delta, **(delta_fields or {})}
        else:
            choice["text"] = text or ""
        return self._envelope(self.obj, [choice])

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
        """The single usage chunk (``choices: []``) sent before ``[DONE]``."""
        body = self._envelope(self.obj, [])
        body["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens)
        return body
