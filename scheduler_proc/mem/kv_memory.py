"""`KVMemory`: the scheduler's whole view of KV memory, in slots (= tokens).

It ties the `TokenToKVPoolAllocator`, the `ReqToTokenPool` and the `RadixCache` together
and owns the conservation law checked in tests and at idle time:

    free slots + slots held by the radix cache + slots held by live requests = pool size

A live request's positions [0, prefix_len) are the radix cache's slots (locked while the
request lives); positions [prefix_len, kv_len) are its own.

A model with recurrent layers also has a pool of state slots, snapshots of its recurrent
state at chunk-aligned prompt positions: a request takes one as a chunk of its prompt ends
at such a position (`snapshot`), hands it to the radix cache with its prompt's KV, and a
later request resumes from the deepest snapshot its prompt matches (its prefix is cut back
there: a recurrent state cannot be cut back the way KV is). The same law holds for them:

    free state slots + state slots of the radix cache + state slots of live requests = total

With end snapshots (``--enable-mamba-extra-buffer``), a request that ends and is cached also
takes a state slot for its state after all its cached tokens (`KVState.end_state`), which the
worker fills from the states of its last steps (`StoreKV.state_slots`): a multi-turn chat
resumes after the previous answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler_proc.mem.allocator import TokenToKVPoolAllocator
from scheduler_proc.mem.radix_cache import RadixCache, TreeNode
from scheduler_proc.mem.req_to_token import ReqToTokenPool


@dataclass(eq=False)
class KVState:
    """One request's KV bookkeeping. pool_idx: its `ReqToTokenPool` row; prefix_len:
    cached tokens matched at admission; kv_len: positions that have a slot."""

    pool_idx: int
    prefix_len: int
    node: TreeNode
    kv_len: int = 0
    prefix_slots: list[int] = field(default_factory=list)
    prefix_state: int = 0
    """The state slot its prefix resumes from (0: none, or no recurrent layers)."""
    snapshots: list[tuple[int, int]] = field(default_factory=list)
    """(position, state slot) of the snapshots it took and still holds."""
    end_state: int = 0
    """The state slot of its end snapshot, set by `KVMemory.release` (0: none)."""
    salt: str = ""
    """Its ``cache_salt``: the radix namespace it reads and fills ("" : the shared one)."""


@dataclass
class MemoryStats:
    """Counters for /metrics: tokens received, tokens served from the prefix cache."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    retractions: int = 0


class KVMemory:
    """Slot accounting for one KV pool of `total_slots` slots.

    max_reqs: rows of the request table; context_len: positions per row; radix: reuse
    cached prefixes (False: `--disable-radix-cache`, every finished request frees all);
    state_slots: the recurrent-state snapshot slots (0: a model without recurrent layers);
    end_snapshots: a request that ends takes a snapshot of its state after its tokens.
    """

    def __init__(
        self,
        total_slots: int,
        max_reqs: int,
        context_len: int,
        radix: bool = True,
        state_slots: int = 0,
        end_snapshots: bool = False,
    ) -> None:
        self.total = total_slots
        self.allocator = TokenToKVPoolAllocator(total_slots)
        self.table = ReqToTokenPool(max_reqs, context_len)
        self.radix = RadixCache()
        self.use_radix = radix
        self.held = 0
        self.stats = MemoryStats()
        self.states = TokenToKVPoolAllocator(state_slots) if state_slots else None
        self.state_held = 0
        self.end_snapshots = end_snapshots
        if self.states is not None:
            self.radix.on_state_freed = lambda slot: self.states.free([slot])

    @property
    def available(self) -> int:
        """Slots that could be had now: free plus evictable cache."""
        return self.allocator.free_count + self.radix.evictable_size

    def begin(self, ids: list[int], max_prefix: int | None = None, salt: str = "") -> KVState | None:
        """Start a request whose prefill tokens are `ids`: take a table row and match (and
        lock) the longest prefix cached under `salt`, at most len(ids) - 1 tokens so that at
        least the last token is computed (its logits are needed), and at most `max_prefix`
        when given. None when no row is free."""
        idx = self.table.alloc()
        if idx is None:
            return None
        limit = len(ids) - 1 if max_prefix is None else min(len(ids) - 1, max_prefix)
        slots, node = self.radix.match_prefix(ids[:limit], salt) if self.use_radix else ([], self.radix.root)
        if self.states is not None:  # resume where a state snapshot is
            node, depth = self.radix.state_point(node)
            slots = slots[:depth]
        self.radix.inc_lock_ref(node)
        self.table.write(idx, 0, slots)
        return KVState(idx, len(slots), node, len(slots), slots, node.state_slot, salt=salt)

    def admitted(self, kv: KVState, n_tokens: int) -> None:
        """Count an admission that stuck (`MemoryStats`): `n_tokens` prefill tokens, of which
        `kv.prefix_len` came from the cache. A `begin` undone by `release` because the pool
        could not hold its first chunk is no admission: the scheduler tries the queue's head
        again at every step while the pool is full."""
        self.stats.prompt_tokens += n_tokens
        self.stats.cached_tokens += kv.prefix_len

    def snapshot(self, kv: KVState, position: int) -> int:
        """A state slot for `kv`'s recurrent state after `position` prompt tokens (evicting
        cache for one if none is free); 0 when there is none to have (no recurrent layers,
        or every snapshot in use)."""
        got = self._state_slots(1)
        if not got:
            return 0
        kv.snapshots.append((position, got[0]))
        return got[0]

    def _state_slots(self, n: int) -> list[int]:
        """`n` state slots for a live request (evicting cached snapshots if needed); []
        when there are none to have (or no recurrent layers, or no prefix cache)."""
        if self.states is None or not self.use_radix:
            return []
        if self.states.free_count < n:
            self.allocator.free(self.radix.evict(0, states=n - self.states.free_count))
        got = self.states.alloc(n)
        if got is None:
            return []
        self.state_held += n
        return got

    def _end_snapshot(self, kv: KVState, tokens: list[int]) -> None:
        """With ``end_snapshots``, a state slot for `kv`'s state after all of `tokens`
        (`KVState.end_state`), unless the cache has one there already."""
        if not self.end_snapshots or any(position == len(tokens) for position, _ in kv.snapshots):
            return
        got = self._state_slots(1)
        if got:
            kv.snapshots.append((len(tokens), got[0]))
            kv.end_state = got[0]

    def _attach(self, kv: KVState, tokens: list[int] | None) -> None:
        """Give `kv`'s snapshots to the radix cache beside the KV of `tokens` (just
        inserted); free those it cannot take (duplicates, past `tokens`, or no `tokens`), and
        then its end snapshot's slot (`end_state`, which then nothing must be written to)."""
        for position, slot in kv.snapshots:
            if tokens is None or position > len(tokens) or not self.radix.set_state(tokens[:position], slot, kv.salt):
                self.states.free([slot])
                if slot == kv.end_state:
                    kv.end_state = 0
        self.state_held -= len(kv.snapshots)
        kv.snapshots = []

    def alloc(self, kv: KVState, n: int) -> bool:
        """Give `kv` slots for its next `n` positions, evicting cache if needed; False (and
        nothing taken) when even eviction cannot free enough."""
        if n > self.allocator.free_count:
            self.allocator.free(self.radix.evict(n - self.allocator.free_count))
        slots = self.allocator.alloc(n)
        if slots is None:
            return False
        self.table.write(kv.pool_idx, kv.kv_len, slots)
        kv.kv_len += n
        self.held += n
        return True

    def trim(self, kv: KVState, n: int) -> None:
        """Give back `kv`'s last `n` slots (speculative decoding: positions of draft tokens
        that were not accepted). Raises `ValueError` when it holds fewer of its own."""
        if n <= 0:
            return
        if n > kv.kv_len - kv.prefix_len:
            raise ValueError(f"cannot trim {n} slots: the request holds {kv.kv_len - kv.prefix_len} of its own")
        self.allocator.free(self.table.read(kv.pool_idx, kv.kv_len - n, kv.kv_len))
        kv.kv_len -= n
        self.held -= n

    def release(self, kv: KVState, tokens: list[int] | None = None) -> tuple[int, list[int]]:
        """End a request. tokens: the token ids of its first len(tokens) positions, whose KV
        is complete, to insert into the radix cache (None: cache nothing, as for an abort or
        a retraction). Returns (start, slots): positions start.. whose KV the worker must
        store at those slots (the part of `tokens` the cache did not hold yet)."""
        own = self.table.read(kv.pool_idx, kv.prefix_len, kv.kv_len)
        start, store = 0, []
        if tokens is not None and self.use_radix and tokens:
            keep = len(tokens)
            slots = kv.prefix_slots + own[: keep - kv.prefix_len]
            shared = self.radix.insert(tokens, slots, kv.salt)
            start = max(shared, kv.prefix_len)
            store = slots[start:]
            # positions [prefix_len, shared) duplicate what another request cached meanwhile
            self.allocator.free(own[: max(0, shared - kv.prefix_len)])
            self.allocator.free(own[keep - kv.prefix_len :])
            self._end_snapshot(kv, tokens)
            self._attach(kv, tokens)
        else:
            self.allocator.free(own)
            self._attach(kv, None)
        self.held -= kv.kv_len - kv.prefix_len
        self.radix.dec_lock_ref(kv.node)
        self.table.free(kv.pool_idx)
        return start, store

    def cache_prompt(self, kv: KVState, tokens: list[int]) -> tuple[int, list[int]]:
        """Insert a running request's fully prefilled prompt `tokens` (all its positions so
        far) into the radix cache, so that requests admitted from now on reuse it before this
        one finishes. The request then holds the cache's node (locked) for those positions.
        Returns (start, slots): positions the worker must store into the pool now."""
        if not self.use_radix or len(tokens) <= kv.prefix_len:
            return 0, []
        own = self.table.read(kv.pool_idx, kv.prefix_len, len(tokens))
        slots = kv.prefix_slots + own
        shared = self.radix.insert(tokens, slots, kv.salt)
        self.allocator.free(own[: max(0, shared - kv.prefix_len)])  # another request cached these first
        self.held -= len(tokens) - kv.prefix_len
        self._attach(kv, tokens)
        cached, node = self.radix.match_prefix(tokens, kv.salt)
        self.radix.inc_lock_ref(node)
        self.radix.dec_lock_ref(kv.node)
        self.table.write(kv.pool_idx, 0, cached)
        start = max(shared, kv.prefix_len)
        kv.node, kv.prefix_len, kv.prefix_slots = node, len(tokens), cached
        return start, slots[start:]

    def flush(self) -> tuple[int, int]:
        """Drop every prefix of the radix cache that no request holds (``/flush_cache``), as
        eviction under memory pressure does, whatever room is left; returns (slots freed,
        cached tokens still held by requests)."""
        freed = self.radix.evict(self.radix.total_size + 1)  # more than there is: every unlocked leaf
        self.allocator.free(freed)
        return len(freed), self.radix.protected_size

    def check(self) -> None:
        """Raise `AssertionError` unless free + cached + held = total and the radix sizes
        match its tree."""
        self.radix.check()
        got = self.allocator.free_count + self.radix.total_size + self.held
        if got != self.total:
            raise AssertionError(
                f"KV slots leaked: free {self.allocator.free_count} + cached {self.radix.total_size} "
                f"+ held {self.held} = {got} != {self.total}"
            )
        if self.states is not None:
            tree = self.radix.state_slots()
            if self.states.free_count + tree + self.state_held != self.states.size:
                raise AssertionError(
                    f"state slots leaked: free {self.states.free_count} + cached {tree} + held "
                    f"{self.state_held} != {self.states.size}"
                )
