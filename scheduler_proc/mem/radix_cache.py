"""`RadixCache`: a radix tree from token-id sequences to the KV slots that hold them.

Page size 1: every token of a key has one slot. A node's `lock_ref` counts the live
requests using it (and, through them, its ancestors); only unlocked leaves are evicted,
least recently used first. Sizes are in tokens (= slots). The structure follows SGLang's
radix cache (match, split on partial match, insert returning the shared prefix length).

For models with recurrent layers a node may also own a *state slot*: a snapshot of the
recurrent state after its last token (`set_state`). Such a model can only resume where a
snapshot is (`state_point`); evicting the node frees its state slot with its KV slots
(`on_state_freed`).

Namespaces: every key lives under the root of a *salt* (vLLM's ``cache_salt``): the
unsalted requests share `root` (salt ""), and each salt has its own root, made by its first
insert and dropped when its last node is evicted. Equal tokens under two salts never share
a node, which is vLLM's rule (the salt enters the hash of the first block) in a tree.
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
        self.salt = ""  # a root's: the salt whose keys it holds
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
        self.roots: dict[str, TreeNode] = {"": self.root}
        """Each salt's root (a node whose parent is None); "" is `root`, always there."""
        self._none = TreeNode([], [], None)
        """The root `match_prefix` gives a salt with nothing cached (never holds a child)."""
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

    def match_prefix(self, key: list[int], salt: str = "") -> tuple[list[int], TreeNode]:
        """The slots of the longest prefix of `key` cached under `salt`, and the node where it
        ends (a root when none is; for a salt with nothing cached, a root that stays empty)."""
        node, slots, i = self.roots.get(salt, self._none), [], 0
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

    def insert(self, key: list[int], value: list[int], salt: str = "") -> int:
        """Cache `value` (slots) for `key` under `salt`; returns how many leading tokens were
        already cached (the caller frees its own slots for those, which are duplicates).
        Raises `ValueError` when the lengths differ."""
        if len(key) != len(value):
            raise ValueError(f"key has {len(key)} tokens but value {len(value)} slots")
        node = self.roots.get(salt)
        if node is None:
            node = self.roots[salt] = TreeNode([], [], None)
            node.salt = salt
            node.lock_ref = 1
        i = 0
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

    def set_state(self, key: list[int], slot: int, salt: str = "") -> bool:
        """Give the node ending exactly after `key` under `salt` (split there if needed) the
        state snapshot `slot`; False (nothing changed) when `key` is not all cached or that
        node already has one (the caller keeps `slot`, a duplicate)."""
        slots, node = self.match_prefix(key, salt)
        if len(slots) != len(key) or node.parent is None or node.state_slot:
            return False
        node.state_slot = slot
        return True

    def state_point(self, node: TreeNode) -> tuple[TreeNode, int]:
        """The deepest node at or above `node` that owns a state snapshot, and the number of
        tokens up to its end (its root and 0 when none does)."""
        while node.parent is not None and not node.state_slot:
            node = node.parent
        depth, up = 0, node
        while up.parent is not None:
            depth += len(up.key)
            up = up.parent
        return node, depth

    def inc_lock_ref(self, node: TreeNode) -> None:
        """Protect `node` and its ancestors from eviction (one more user)."""
        while node.parent is not None:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode) -> None:
        """Undo one `inc_lock_ref(node)`. Raises `RuntimeError` on an unlocked node."""
        while node.parent is not None:
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
        (the state slots go to `on_state_freed`). A salt's root left with no children goes."""
        leaves = [x for x in self._nodes() if not x.children and x.lock_ref == 0 and x.parent is not None]
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
            if parent.parent is not None and not parent.children and parent.lock_ref == 0:
                heapq.heappush(leaves, parent)
            elif parent.parent is None and not parent.children and parent is not self.root:
                del self.roots[parent.salt]
        return freed

    def _nodes(self):
        stack = list(self.roots.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def state_slots(self) -> int:
        """State snapshots the tree owns."""
        return sum(1 for x in self._nodes() if x.state_slot)

    def check(self) -> None:
        """Assert the size counters match the tree (tests and idle-time checks)."""
        ev = sum(len(x.key) for x in self._nodes() if x.lock_ref == 0 and x.parent is not None)
        pr = sum(len(x.key) for x in self._nodes() if x.lock_ref > 0 and x.parent is not None)
        if (ev, pr) != (self.evictable_size, self.protected_size):
            raise AssertionError(f"radix sizes {self.evictable_size}/{self.protected_size} != tree {ev}/{pr}")
