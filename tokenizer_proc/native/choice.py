"""`NativeChoice`: the body of one choice of a native ``/generate`` request (SGLang's shape).

``{"text", "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens",
"cached_tokens", ...logprobs}}``; streamed events carry the text and logprobs so far (as
SGLang streams by default) and the choice's ``index``. With return_logprob, meta_info has
``output_token_logprobs`` ``[[logprob, token_id, text], ...]`` and ``output_top_logprobs``
(per position, a list of such triples), ``output_token_ids_logprobs`` when
token_ids_logprob was given, and the ``input_*`` counterparts when logprob_start_len >= 0
(position 0, the prompt's first token, has a None logprob).
"""

from __future__ import annotations

from protocol.messages import GenerateReq, LogprobEntries
from text.token_pieces import TokenPieces
from tokenizer_proc.link.tokenizer_manager import Delta
from tokenizer_proc.output.logprob_format import native_ids, native_tokens, native_top


class NativeChoice:
    """Accumulates one choice's deltas. req: the choice's `GenerateReq` (it asks for logprobs
    when its prompt asked return_logprob); pieces: for the text of token_ids_logprob ids;
    head: the prompt's first token; rid: the id shown as ``meta_info.id`` (see
    `request.builder.Built`)."""

    def __init__(self, req: GenerateReq, pieces: TokenPieces, head: LogprobEntries | None, rid: str) -> None:
        self.req, self.pieces, self.rid = req, pieces, rid
        self.text = ""
        self.last = Delta("", 0)
        ids = req.sampling.token_ids_logprob
        self.lists: dict[str, list] = {}
        if req.sampling.wants_logprobs:
            sides = ["output"] + (["input"] if req.sampling.logprob_start_len >= 0 else [])
            for side in sides:
                kinds = ["token", "top"] + (["token_ids"] if ids else [])
                self.lists.update({f"{side}_{k}_logprobs": [] for k in kinds})
            if head is not None:
                self._extend("input", head, True)

    def _extend(self, side: str, e: LogprobEntries, head: bool = False) -> None:
        self.lists[f"{side}_token_logprobs"] += native_tokens(e, head)
        self.lists[f"{side}_top_logprobs"] += native_top(e, head)
        if f"{side}_token_ids_logprobs" in self.lists:
            self.lists[f"{side}_token_ids_logprobs"] += native_ids(
                e, self.req.sampling.token_ids_logprob, self.pieces, head
            )

    def add(self, d: Delta) -> None:
        """Take the choice's next delta."""
        self.text += d.text
        self.last = d
        if self.lists:
            if d.prompt_logprobs is not None and "input_token_logprobs" in self.lists:
                self._extend("input", d.prompt_logprobs)
            if d.logprobs is not None:
                self._extend("output", d.logprobs)

    def body(self, index: int | None = None) -> dict:
        """The choice's body so far; index: added for streamed events."""
        d = self.last
        reason = None if d.finish_reason is None else {"type": d.finish_reason.api_str, "matched": d.matched_stop}
        meta = {
            "id": self.rid,
            "finish_reason": reason,
            "prompt_tokens": len(self.req.input_ids),
            "completion_tokens": d.completion_tokens,
            "cached_tokens": d.cached_tokens,
            **self.lists,
        }
        out = {"text": self.text, "meta_info": meta}
        if index is not None:
            out["index"] = index
        return out
