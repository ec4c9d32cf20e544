"""`TokenToKVPoolAllocator`: the free list of KV slots (page size 1, slot 0 reserved)."""

from __future__ import annotations


class TokenToKVPoolAllocator:
    """Hands out slot ids 1..size; slot 0 is reserved as padding and never given out.

    size: the number of usable slots (the pool holds size + 1). Slots are ints.
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"the KV pool needs at least 1 slot, got {size}")
        self.size = size
        self._free: list[int] = list(range(size, 0, -1))

    @property
    def free_count(self) -> int:
        """Slots available now."""
        return len(self._free)

    def alloc(self, n: int) -> list[int] | None:
        """`n` free slots, or None (nothing taken) when fewer are free."""
        if n > len(self._free):
            return None
        if n == 0:
            return []
        out = self._free[-n:]
        del self._free[-n:]
        return out[::-1]

    def free(self, slots: list[int]) -> None:
        """Give `slots` back. Raises `ValueError` for slot 0 or an id out of range."""
        for s in slots:
            if not 0 < s <= self.size:
                raise ValueError(f"slot {s} is not a pool slot (1..{self.size})")
        self._free.extend(slots)
