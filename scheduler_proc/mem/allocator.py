"""`TokenToKVPoolAllocator`: the free list of KV slots (page size 1, slot 0 reserved)."""

from __future__ import annotations

import numpy as np


class TokenToKVPoolAllocator:
    """Hands out slot ids 1..size; slot 0 is reserved as padding and never given out.

    size: the number of usable slots (the pool holds size + 1). The free list is an int32
    numpy stack, so a pool of millions of slots costs 4 bytes a slot.
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"the KV pool needs at least 1 slot, got {size}")
        self.size = size
        self._stack = np.arange(size, 0, -1, dtype=np.int32)
        self._n = size

    @property
    def free_count(self) -> int:
        """Slots available now."""
        return self._n

    def alloc(self, n: int) -> list[int] | None:
        """`n` free slots, or None (nothing taken) when fewer are free."""
        if n > self._n:
            return None
        out = self._stack[self._n - n : self._n][::-1].tolist()
        self._n -= n
        return out

    def free(self, slots: list[int]) -> None:
        """Give `slots` back. Raises `ValueError` for slot 0, an id out of range, or more
        slots than were ever taken."""
        if not slots:
            return
        arr = np.asarray(slots, dtype=np.int64)
        if arr.min() < 1 or arr.max() > self.size:
            raise ValueError(f"slots {arr.min()}..{arr.max()} are not all pool slots (1..{self.size})")
        if self._n + len(arr) > self.size:
            raise ValueError("more slots freed than were allocated")
        self._stack[self._n : self._n + len(arr)] = arr
        self._n += len(arr)
