"""`ReqToTokenPool`: ``req_to_token[req_pool_idx, pos]`` -> the KV slot of a request's token."""

from __future__ import annotations

import numpy as np


class ReqToTokenPool:
    """A table of `size` rows of `max_context_len` int32 slot ids, one row per live request.

    Raises `ValueError` when a position is outside the context length.
    """

    def __init__(self, size: int, max_context_len: int) -> None:
        self.req_to_token = np.zeros((size, max_context_len), dtype=np.int32)
        self.max_context_len = max_context_len
        self._free = list(range(size - 1, -1, -1))

    @property
    def free_count(self) -> int:
        """Rows available now."""
        return len(self._free)

    def alloc(self) -> int | None:
        """A free row index, or None when every row is taken."""
        return self._free.pop() if self._free else None

    def free(self, idx: int) -> None:
        """Give row `idx` back."""
        self._free.append(idx)

    def write(self, idx: int, start: int, slots: list[int]) -> None:
        """Record `slots` for positions start .. start+len(slots)-1 of row `idx`."""
        end = start + len(slots)
        if end > self.max_context_len:
            raise ValueError(f"position {end - 1} is past the context length {self.max_context_len}")
        self.req_to_token[idx, start:end] = slots

    def read(self, idx: int, start: int, end: int) -> list[int]:
        """Slot ids of positions start .. end-1 of row `idx`."""
        return self.req_to_token[idx, start:end].tolist()
