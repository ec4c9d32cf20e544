"""OpenAI and native response bodies: whole responses and SSE stream chunks."""

from __future__ import annotations

import json
import time

from protocol.enums import FinishReason


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """The OpenAI ``usage`` object; cached_tokens: prompt tokens served from the prefix cache."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def finish_str(reason: FinishReason | None) -> str | None:
    """OpenAI ``finish_reason`` string (None while running)."""
    return None if reason is None else reason.api_str


def sse(obj: dict | str) -> str:
    """One server-sent event line pair: ``data: <json>\\n\\n`` (or a literal such as [DONE])."""
    payload = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return f"data: {payload}\n\n"


class ResponseShape:
    """Builds bodies for one endpoint kind ("chat" or "completion") and one request."""

    def __init__(self, kind: str, rid: str, model: str) -> None:
        self.kind, self.rid, self.model = kind, rid, model
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list) -> dict:
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def full(self, text: str, reason: FinishReason | None, matched, prompt_tokens: int, completion_tokens: int,
             cached_tokens: int = 0) -> dict:
        """The non-streamed response."""
        choice = {"index": 0, "logprobs": None, "finish_reason": finish_str(reason), "stop_reason": matched}
        if self.kind == "chat":
            choice["message"] = {"role": "assistant", "content": text}
            body = self._envelope("chat.completion", [choice])
        else:
            choice["text"] = text
            body = self._envelope("text_completion", [choice])
        body["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens)
        return body

    def chunk(self, text: str | None, reason: FinishReason | None = None, matched=None, role: bool = False) -> dict:
        """One streamed chunk; for chat, `role` sends the assistant role first."""
        choice = {"index": 0, "logprobs": None, "finish_reason": finish_str(reason)}
        if reason is not None:
            choice["stop_reason"] = matched
        if self.kind == "chat":
            delta = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
            return self._envelope("chat.completion.chunk", [choice])
        choice["text"] = text or ""
        return self._envelope("text_completion", [choice])

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
        """The single usage chunk (``choices: []``) sent before ``[DONE]``."""
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        body = self._envelope(obj, [])
        body["usage"] = usage(prompt_tokens, completion_tokens, cached_tokens)
        return body
