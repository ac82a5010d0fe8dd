"""An LRU stack with stack distances in O(log n): the shadow simulation's cache
(``kvcast.stats.shadow``), every capacity at once. Pure computation."""

from __future__ import annotations


class LruStack:
    """An LRU stack of at most ``limit`` keys with stack distances in O(log limit).

    Each key holds a stamp (its latest touch, increasing); a Fenwick tree over stamps marks
    them, so a key's distance (keys touched after it) is ``marks - marks <= its stamp``. A key
    dropped past ``limit`` is the oldest, below every live stamp, so its mark may stay: it
    cancels out of every distance, which saves a tree walk per insertion. Stamps run in ``2 *
    limit + 2`` slots; when they run out the live ones are renumbered in order (O(limit), once
    per ``limit`` touches), dropping the stale marks. The oldest key is found by a pointer that
    only moves forward, as stamps do.
    """

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError("limit must be >= 0")
        self.limit = limit
        self.size = 2 * limit + 2
        self.tree = [0] * (self.size + 1)
        self.slot_of: dict[int, int] = {}
        self.key_at: list[int | None] = [None] * self.size
        self.next = 0  # next stamp
        self.oldest = 0  # no live stamp below it
        self.live = 0
        self.marks = 0  # live stamps plus those of dropped keys (all below the live ones)

    def __len__(self) -> int:
        return self.live

    def distance(self, key: int) -> int | None:
        """Keys touched since ``key`` was (0: it is the most recent); None if not held."""
        slot = self.slot_of.get(key)
        if slot is None:
            return None
        tree, i, below = self.tree, slot + 1, 0
        while i > 0:
            below += tree[i]
            i &= i - 1
        return self.marks - below

    def _add(self, slot: int, delta: int) -> None:
        tree, size, i = self.tree, self.size, slot + 1
        while i <= size:
            tree[i] += delta
            i += i & -i

    def touch(self, key: int) -> None:
        """Move ``key`` to the top (insert it if absent), dropping the oldest past ``limit``."""
        if self.limit == 0:
            return
        slot_of = self.slot_of
        slot = slot_of.get(key)
        if slot is not None:
            self._add(slot, -1)
            self.key_at[slot] = None
            self.live -= 1
            self.marks -= 1
        if self.next == self.size:
            self._compact()
            slot_of = self.slot_of  # a new mapping
        slot = self.next
        self.next += 1
        self._add(slot, 1)
        slot_of[key] = slot
        self.key_at[slot] = key
        self.live += 1
        self.marks += 1
        if self.live > self.limit:  # drop the oldest; its mark stays (see the class doc)
            key_at = self.key_at
            old = self.oldest
            while key_at[old] is None:
                old += 1
            self.oldest = old
            del slot_of[key_at[old]]  # type: ignore[arg-type]
            key_at[old] = None
            self.live -= 1

    def _compact(self) -> None:
        keys = [k for k in self.key_at if k is not None]
        self.key_at = keys + [None] * (self.size - len(keys))
        self.slot_of = {k: s for s, k in enumerate(keys)}
        tree = [1] * (len(keys) + 1) + [0] * (self.size - len(keys))
        tree[0] = 0
        for i in range(1, self.size + 1):  # Fenwick tree of ones, built in linear time
            up = i + (i & -i)
            if up <= self.size:
                tree[up] += tree[i]
        self.tree = tree
        self.next, self.oldest, self.marks = len(keys), 0, len(keys)

    def entries(self) -> int:
        """Python objects held, for memory accounting: keys, slots and tree cells."""
        return len(self.slot_of) + self.size + self.size + 1
