"""`RadixCache`: a radix tree from token-id sequences to the KV slots that hold them.

Page size 1: every token of a key has one slot. A node's `lock_ref` counts the live
requests using it (and, through them, its ancestors); only unlocked leaves are evicted,
least recently used first. Sizes are in tokens (= slots). The structure follows SGLang's
radix cache (match, split on partial match, insert returning the shared prefix length).

For models with recurrent layers a node may also own a *state slot*: a snapshot of the
recurrent state after its last token (`set_state`). Such a model can only resume where a
snapshot is (`state_point`); evicting the node frees its state slot with its KV slots
(`on_state_freed`).
"""

from __future__ import annotations

import heapq
import itertools


class TreeNode:
    """A run of tokens `key` with their slots `value` (same length)."""

    _clock = itertools.count()

    def __init__(self, key: list[int], value: list[int], parent: TreeNode | None) -> None:
        self.key, self.value, self.parent = key, value, parent
        self.children: dict[int, TreeNode] = {}
        self.lock_ref = 0
        self.state_slot = 0  # a recurrent-state snapshot after the node's last token (0: none)
        self.last_access = next(self._clock)

    def touch(self) -> None:
        """Mark as used now (for LRU eviction)."""
        self.last_access = next(self._clock)

    def __lt__(self, other: TreeNode) -> bool:
        return self.last_access < other.last_access


def _common_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class RadixCache:
    """Prefix index over cached KV slots."""

    def __init__(self) -> None:
        self.root = TreeNode([], [], None)
        self.root.lock_ref = 1
        self.evictable_size = 0
        self.protected_size = 0
        self.on_state_freed = lambda slot: None
        """Called with the state slot of each evicted node that owns one."""

    @property
    def total_size(self) -> int:
        """Slots held by the tree (evictable + protected)."""
        return self.evictable_size + self.protected_size

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Split `child` after its first `n` tokens; returns the new upper node."""
        upper = TreeNode(child.key[:n], child.value[:n], child.parent)
        upper.lock_ref = child.lock_ref
        upper.children = {child.key[n]: child}
        child.parent.children[child.key[0]] = upper
        child.key, child.value, child.parent = child.key[n:], child.value[n:], upper
        return upper

    def match_prefix(self, key: list[int]) -> tuple[list[int], TreeNode]:
        """The slots of the longest cached prefix of `key`, and the node where it ends."""
        node, slots, i = self.root, [], 0
        node.touch()
        while i < len(key):
            child = node.children.get(key[i])
            if child is None:
                break
            n = _common_len(child.key, key[i:])
            if n < len(child.key):
                child = self._split(child, n)
            slots += child.value
            child.touch()
            node = child
            i += n
        return slots, node

    def insert(self, key: list[int], value: list[int]) -> int:
        """Cache `value` (slots) for `key`; returns how many leading tokens were already
        cached (the caller frees its own slots for those, which are duplicates)."""
        if len(key) != len(value):
            raise ValueError(f"key has {len(key)} tokens but value {len(value)} slots")
        node, i = self.root, 0
        while i < len(key):
            child = node.children.get(key[i])
            if child is None:
                new = TreeNode(key[i:], value[i:], node)
                node.children[key[i]] = new
                self.evictable_size += len(new.key)
                return i
            n = _common_len(child.key, key[i:])
            if n < len(child.key):
                child = self._split(child, n)
            child.touch()
            node = child
            i += n
        return i

    def set_state(self, key: list[int], slot: int) -> bool:
        """Give the node ending exactly after `key` (split there if needed) the state
        snapshot `slot`; False (nothing changed) when `key` is not all cached or that node
        already has one (the caller keeps `slot`, a duplicate)."""
        slots, node = self.match_prefix(key)
        if len(slots) != len(key) or node is self.root or node.state_slot:
            return False
        node.state_slot = slot
        return True

    def state_point(self, node: TreeNode) -> tuple[TreeNode, int]:
        """The deepest node at or above `node` that owns a state snapshot, and the number of
        tokens up to its end (root and 0 when none does)."""
        while node is not self.root and not node.state_slot:
            node = node.parent
        depth, up = 0, node
        while up is not self.root:
            depth += len(up.key)
            up = up.parent
        return node, depth

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Protect `node` and its ancestors from eviction (one more user)."""
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undo one `inc_lock_ref(node)`. Raises `RuntimeError` on an unlocked node."""
        while node is not self.root:
            if node.lock_ref <= 0:
                raise RuntimeError("dec_lock_ref on an unlocked radix node")
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.protected_size -= len(node.key)
                self.evictable_size += len(node.key)
            node = node.parent

    def evict(self, n: int, states: int = 0) -> list[int]:
        """Remove unlocked leaves, least recently used first, until at least `n` slots and
        `states` state snapshots are freed or nothing is evictable; returns the freed slots
        (the state slots go to `on_state_freed`)."""
        leaves = [x for x in self._nodes() if not x.children and x.lock_ref == 0 and x is not self.root]
        heapq.heapify(leaves)
        freed: list[int] = []
        while leaves and (len(freed) < n or states > 0):
            leaf = heapq.heappop(leaves)
            freed += leaf.value
            self.evictable_size -= len(leaf.key)
            if leaf.state_slot:
                self.on_state_freed(leaf.state_slot)
                states -= 1
            parent = leaf.parent
            del parent.children[leaf.key[0]]
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(leaves, parent)
        return freed

    def _nodes(self):
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def state_slots(self) -> int:
        """State snapshots the tree owns."""
        return sum(1 for x in self._nodes() if x.state_slot)

    def check(self) -> None:
        """Assert the size counters match the tree (tests and idle-time checks)."""
        ev = sum(len(x.key) for x in self._nodes() if x.lock_ref == 0 and x is not self.root)
        pr = sum(len(x.key) for x in self._nodes() if x.lock_ref > 0 and x is not self.root)
        if (ev, pr) != (self.evictable_size, self.protected_size):
            raise AssertionError(f"radix sizes {self.evictable_size}/{self.protected_size} != tree {ev}/{pr}")
