"""A vLLM-style free-block queue that evicts cached blocks in IAC order instead of LRU.

vLLM's ``FreeKVCacheBlockQueue`` hands out free blocks from its head: blocks never filled
first, then cached blocks in the order they were freed (least recently freed first), a block
is taken out again (``remove``) when a new request hits its cached prefix. This queue has the
same operations; the order of cached blocks is the IAC priority instead:

1. blocks without a tag (nothing cached, or no request metadata): first, in FIFO order;
2. tagged blocks by ``(1[now - freed_at < M(i, t)], P(t+1 | i, t), size_tokens, -position,
   freed_at)``, lowest first: past their state's median reuse delay before the rest, then the
   least likely to continue, the smallest, and within one request's chain the **last** block
   first (a prefix cache stops matching at the first missing block, so the tail goes before
   the head; vLLM frees a request's blocks tail-first for the same reason).

``M`` and ``P`` are read from the table when a block is appended (freed); the recency bit
flips from 1 to 0 at ``freed_at + M`` by itself. Heaps with lazy deletion: O(log n) per
operation. Not thread-safe (vLLM's block pool runs on the scheduler thread).
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kvcast.exporters.adapters.sglang import HasIndex, _Fixed
from kvcast.stats.priority import PriorityIndex

__all__ = ["TAG_ATTR", "BlockTag", "IACFreeBlockQueue"]

TAG_ATTR = "iac_tag"
_COMPACT_SLACK = 64  # rebuild the heaps when they hold this many more than 4 per free block


@dataclass(frozen=True, slots=True)
class BlockTag:
    """What the engine knows about a block when it frees it.

    ``size_tokens``: tokens of the request's cached prefix the block belongs to (IAC's node
    size; give every block of one request the same value). ``position``: the block's index in
    that prefix, 0 for the first block.
    """

    intent: str | None
    turn: int
    size_tokens: float
    position: int = 0


class _Entry:
    __slots__ = ("block", "dead", "deadline", "key", "stale", "tagged")

    def __init__(self, block: Any, key: tuple[Any, ...], deadline: float, tagged: bool) -> None:
        self.block, self.key, self.deadline = block, key, deadline
        self.stale, self.tagged, self.dead = False, tagged, False


class IACFreeBlockQueue:
    """Free blocks in IAC eviction order; ``popleft()`` returns the block to reuse next.

    ``table``: a ``TableClient`` or a fixed :class:`PriorityIndex`. ``blocks``: the initially
    free (empty) blocks. A block is identified by its ``block_id``; its tag comes from
    ``append(block, tag)`` or, when none is given, from its ``iac_tag`` attribute.
    """

    def __init__(
        self,
        table: HasIndex | PriorityIndex,
        blocks: Iterable[Any] = (),
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._table: HasIndex = _Fixed(table) if isinstance(table, PriorityIndex) else table
        self._clock = clock
        self._live: dict[int, _Entry] = {}
        self._plain: deque[_Entry] = deque()
        # Heap items are flat tuples (p, size, -position, freed_at, seq, entry): seq is unique,
        # so the entry itself is never compared. Deadline items: (deadline, seq, item).
        self._deadlines: list[tuple[float, int, tuple[Any, ...]]] = []
        self._fresh: list[tuple[Any, ...]] = []  # recency bit 1
        self._stale: list[tuple[Any, ...]] = []  # recency bit 0
        self._seq = 0
        self._ops = 0  # operations since the last compaction check
        self.append_n(blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._live)

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, block: Any) -> bool:
        return block.block_id in self._live

    def append(self, block: Any, tag: BlockTag | None = None) -> None:
        """Add a freed block (its cached content stays until it is popped)."""
        if block.block_id in self._live:
            raise ValueError(f"block {block.block_id} is already free")
        if tag is None:
            tag = getattr(block, TAG_ATTR, None)
        self._seq = seq = self._seq + 1
        if tag is None:
            entry = _Entry(block, (seq,), 0.0, tagged=False)
            self._plain.append(entry)
        else:
            now = self._clock()
            median_s, p = self._table.index.state(tag.intent, tag.turn)
            key = (p, tag.size_tokens, -tag.position, now, seq)
            entry = _Entry(block, key, now + median_s, tagged=True)
            item = (*key, entry)
            heapq.heappush(self._deadlines, (entry.deadline, seq, item))
            heapq.heappush(self._fresh, item)
        self._live[block.block_id] = entry
        self._tick()

    def append_n(
        self, blocks: Iterable[Any], tags: Iterable[BlockTag | None] | None = None
    ) -> None:
        """Append blocks in order (vLLM appends a request's blocks tail first)."""
        if tags is None:
            for block in blocks:
                self.append(block)
        else:
            for block, tag in zip(blocks, tags, strict=True):
                self.append(block, tag)

    def remove(self, block: Any) -> None:
        """Take a block out (a cache hit reuses it); KeyError if it is not free."""
        self._live.pop(block.block_id).dead = True
        self._tick()

    def popleft(self) -> Any:
        """Remove and return the block to evict/reuse first; ValueError when none is free."""
        self._expire(self._clock())
        return self._pop()

    def popleft_n(self, n: int) -> list[Any]:
        """The next ``n`` blocks in eviction order; ValueError (nothing taken) if fewer free."""
        if n > len(self._live):
            raise ValueError(f"{n} blocks requested, {len(self._live)} free")
        self._expire(self._clock())
        return [self._pop() for _ in range(n)]

    evict = popleft_n

    def get_all_free_blocks(self) -> list[Any]:
        """Every free block in the order ``popleft`` would return them now (not removed)."""
        now = self._clock()

        def order(entry: _Entry) -> tuple[Any, ...]:
            if not entry.tagged:
                return (0, 0, entry.key)
            return (1, 0 if entry.deadline <= now else 1, entry.key)

        return [entry.block for entry in sorted(self._live.values(), key=order)]

    def _pop(self) -> Any:
        self._tick()
        plain, stale, fresh = self._plain, self._stale, self._fresh
        entry = None
        while plain:
            entry = plain.popleft()
            if not entry.dead:
                break
        else:
            while stale:
                entry = heapq.heappop(stale)[-1]
                if not entry.dead:
                    break
            else:
                while fresh:
                    entry = heapq.heappop(fresh)[-1]
                    if not (entry.dead or entry.stale):
                        break
                else:
                    raise ValueError("no free blocks available")
        entry.dead = True
        del self._live[entry.block.block_id]
        return entry.block

    def _tick(self) -> None:
        self._ops += 1
        if self._ops >= _COMPACT_SLACK:
            self._ops = 0
            self._maybe_compact()

    def _expire(self, now: float) -> None:
        """Move blocks whose median reuse delay has passed to the recency-0 heap."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            item = heapq.heappop(deadlines)[2]
            entry = item[-1]
            if not entry.dead:
                entry.stale = True
                heapq.heappush(self._stale, item)

    def _maybe_compact(self) -> None:
        """Drop dead heap entries once they outnumber the live blocks (bounded memory)."""
        stored = len(self._plain) + len(self._fresh) + len(self._stale) + len(self._deadlines)
        if stored <= 4 * len(self._live) + _COMPACT_SLACK:
            return
        self._plain = deque(e for e in self._plain if not e.dead)
        self._fresh = [i for i in self._fresh if not (i[-1].dead or i[-1].stale)]
        self._stale = [i for i in self._stale if not i[-1].dead]
        self._deadlines = [d for d in self._deadlines if not (d[2][-1].dead or d[2][-1].stale)]
        for heap in (self._fresh, self._stale, self._deadlines):
            heapq.heapify(heap)
