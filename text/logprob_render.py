"""`LogprobRenderer`: a request's logprob columns (`TokenLogprobs`) as `LogprobEntries`.

Each scored token is decoded incrementally, one at a time, in its context, so the entries'
tokens concatenate to the text exactly: a token that ends inside a multi-byte character
gets "", the token that completes it the whole character, and a character still unfinished
where the tokens end (the output's end, or the prompt's, which completions ``echo`` shows
decoded, U+FFFD for such a character) is U+FFFD on the last entry, as in the text. This costs two short decodes per
token, so a replica builds a renderer only for requests that asked for logprobs; the text
path of the others is untouched.
"""

from __future__ import annotations

from protocol.messages import LogprobEntries, TokenLogprobs
from text.incremental import IncrementalDecoder
from text.token_pieces import TokenPieces


class LogprobRenderer:
    """Renders the consecutive logprob columns of one request's output, or of its prompt.

    tokenizer / pieces: the model's tokenizer and its `TokenPieces`; context_ids: the tokens
    before the first scored one (the prompt tail for output, the prompt tokens before the
    first scored position for the prompt); skip_special_tokens / spaces_between_special_tokens:
    the request's text settings (a skipped special token gets "" and no bytes);
    complete_context: True for prompt entries (see `IncrementalDecoder`).
    """

    def __init__(
        self,
        tokenizer,
        pieces: TokenPieces,
        context_ids: list[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
        complete_context: bool = False,
    ) -> None:
        self.decoder = IncrementalDecoder(
            tokenizer, context_ids, skip_special_tokens, spaces_between_special_tokens, complete_context
        )
        self.pieces = pieces
        self.skip = skip_special_tokens

    def _own_bytes(self, token_id: int) -> bytes:
        return b"" if self.skip and token_id in self.pieces.special_ids else self.pieces.raw(token_id)

    def render(self, lp: TokenLogprobs, start: int, final: bool = False) -> LogprobEntries:
        """Entries for the next scored tokens `lp`, the first being entry `start` of the
        request. final: the scored tokens end with them (the request's output, or its prompt),
        so a character still unfinished is appended to the last entry as U+FFFD, as the text's
        flush (or the echoed prompt's decode) does. Top alternatives are each decoded alone,
        special tokens spelled out."""
        tokens = [self.decoder.push([t]) for t in lp.token_ids]
        if final and tokens:
            tokens[-1] += self.decoder.flush()
        text, raw = self.pieces.text, self.pieces.raw
        return LogprobEntries(
            start,
            list(lp.token_ids),
            tokens,
            [self._own_bytes(t) for t in lp.token_ids],
            list(lp.logprobs),
            top_ids=lp.top_ids,
            top_tokens=[[text(i) for i in row] for row in lp.top_ids],
            top_bytes=[[raw(i) for i in row] for row in lp.top_ids],
            top_logprobs=lp.top_logprobs,
            ids_logprobs=lp.ids_logprobs,
        )
