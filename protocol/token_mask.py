"""The packed token bitmask of `ForwardBatch.grammar_masks`, for its makers and readers.

Layout (xgrammar's): ``ceil(vocab_size / 32)`` int32 words, little-endian; bit ``j % 32``
of word ``j // 32`` set means token ``j`` is allowed. Read as bytes, byte ``j // 8`` bit
``j % 8`` (least significant first) is token ``j``.
"""

from __future__ import annotations

import numpy as np


def mask_words(vocab_size: int) -> int:
    """Number of int32 words in the mask of a `vocab_size`-token vocabulary."""
    return (vocab_size + 31) // 32


def allowed_ids(mask: bytes, vocab_size: int) -> np.ndarray:
    """The mask unpacked: a bool array of shape (vocab_size,), True where the token is allowed.

    Raises `ValueError` when `mask` is not ``4 * mask_words(vocab_size)`` bytes long."""
    size = 4 * mask_words(vocab_size)
    if len(mask) != size:
        raise ValueError(f"a token mask for {vocab_size} tokens has {size} bytes, got {len(mask)}")
    bits = np.unpackbits(np.frombuffer(mask, dtype=np.uint8), bitorder="little")
    return bits[:vocab_size].astype(bool)


def only(token_id: int, vocab_size: int) -> bytes:
    """The mask that allows `token_id` alone (a forced token), in the layout above.

    Raises `ValueError` when `token_id` is outside ``[0, vocab_size)``."""
    if not 0 <= token_id < vocab_size:
        raise ValueError(f"token id {token_id} is outside [0, {vocab_size})")
    words = np.zeros(mask_words(vocab_size), dtype="<i4")
    words[token_id // 32] = np.int32(np.uint32(1 << (token_id % 32)).view(np.int32))
    return words.tobytes()
