"""`TokenPieces`: one token id's text decoded alone and its raw bytes, for logprob entries.

A token's raw bytes are what it adds to the UTF-8 of the text. For a byte-level BPE
tokenizer (GPT-2 style, as SmolLM2's) the token string spells its bytes through GPT-2's
byte-to-unicode table, so mapping it back gives them exactly, also for a token that holds
half a character (whose text decoded alone is U+FFFD). Added tokens (``<|im_end|>``) are
stored as their literal text, and tokenizers of other kinds have no such table: their bytes
are the UTF-8 of the token decoded alone.
"""

from __future__ import annotations

import json


def _byte_decoder(tokenizer) -> dict[str, int] | None:
    """GPT-2's unicode-to-byte table when `tokenizer` decodes byte-level BPE, else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    kinds = [d.get("type") for d in decoder.get("decoders", [decoder])]
    if "ByteLevel" not in kinds:
        return None
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return {ch: b for b, ch in bytes_to_unicode().items()}


class TokenPieces:
    """Per-id text and bytes of one tokenizer, memoized (ids repeat across requests).

    text(id): the token decoded alone, special tokens spelled out (``<|im_end|>``); a partial
    character decodes as U+FFFD. raw(id): the token's own bytes (see the module docstring).
    """

    def __init__(self, tokenizer) -> None:
        self.tok = tokenizer
        self.special_ids = frozenset(tokenizer.all_special_ids)
        self._added = {i: t.content for i, t in tokenizer.added_tokens_decoder.items()}
        self._byte_decoder = _byte_decoder(tokenizer)
        self._cache: dict[int, tuple[str, bytes]] = {}

    def _piece(self, token_id: int) -> tuple[str, bytes]:
        got = self._cache.get(token_id)
        if got is None:
            text = self.tok.decode([token_id], skip_special_tokens=False)
            got = self._cache[token_id] = (text, self._bytes(token_id, text))
        return got

    def _bytes(self, token_id: int, text: str) -> bytes:
        if token_id in self._added:
            return self._added[token_id].encode()
        if self._byte_decoder is not None:
            spelled = self.tok.convert_ids_to_tokens(token_id)
            if isinstance(spelled, str) and all(ch in self._byte_decoder for ch in spelled):
                return bytes(self._byte_decoder[ch] for ch in spelled)
        return text.encode()

    def text(self, token_id: int) -> str:
        """The token decoded alone (special tokens included)."""
        return self._piece(token_id)[0]

    def raw(self, token_id: int) -> bytes:
        """The token's own bytes."""
        return self._piece(token_id)[1]
