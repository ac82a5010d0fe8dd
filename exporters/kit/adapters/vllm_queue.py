"""The free-block queue of vLLM with cached blocks evicted in IAC order (vLLM is not a
dependency; :mod:`kvcast.exporters.kit.adapters.vllm` installs it).

vLLM's ``BlockPool`` keeps every free block in one ``FreeKVCacheBlockQueue``, a doubly linked
list threaded through the blocks' own ``prev_free_block`` / ``next_free_block`` fields: it
hands out blocks from the head, puts blocks holding no cache at the head (``prepend_n``) and
cached blocks, freed tail-first by request, at the tail (``append_n``): LRU.
:class:`IACFreeBlockQueue` has the same constructor, methods, fields and error texts, and the
same order for untagged blocks, so that a pool with nothing tagged behaves exactly as stock.

Tagged blocks (freed inside :meth:`IACFreeBlockQueue.tagging`, which the installer wraps
around ``KVCacheManager.free``) wait behind every untagged one, in one FIFO list per table
state. A block is evicted first when its state's median reuse delay has passed since it was
freed, among those the state least likely to continue first (``P(t+1 | i, t)``), then the rest
by the same probability: the IAC tuple of SPEC section 5 with its size term dropped. Within
one state blocks leave in the order they were freed (a request's tail first), so every
operation is O(1) per block plus one pass over the table's states per ``popleft_n``; the table
is read once per freed request, never per block.

A state's list is a chain of *runs*, one per freed request, each behind a run head that
carries its list and the time it was freed (:mod:`kvcast.exporters.kit.adapters.vllm_lists`):
blocks carry nothing of kvcast's (vLLM's ``KVCacheBlock`` is a slots dataclass and takes no
new attributes), and taking or putting back a block costs what it costs in vLLM's own list
plus one test (is the next node a block?).

Under the ``density`` policy (the table's client ranks by it: ``TableClient(..., policy=
"density")``) the tagged blocks go lowest hit density first, the key of
``PriorityIndex.priority(..., policy="density")`` with the size of one block, from a heap over
the lists' ends (:mod:`kvcast.exporters.kit.adapters.vllm_density`): O(log states) per run taken.
The two orders are two classes (:mod:`kvcast.exporters.kit.adapters.vllm_orders`); the lists'
values come from the kit's one cache of table states
(:mod:`kvcast.exporters.kit.adapters.state_values`), shared with the SGLang adapter.

Shared blocks (``density`` with a table that carries the shared blocks' reuse law): a block
that a turn-1 request found cached is shared by two conversations (a turn-1 request has no
history of its own; :func:`kvcast.exporters.kit.adapters.vllm.marking_lookup` marks them with
:meth:`IACFreeBlockQueue.mark_shared`). When freed, a request's marked blocks (its leading
ones: a request's marked blocks are a prefix of it) wait in the list of
``SHARED_INTENT`` instead of their request's state, valued by the table's ``shared`` law.
A mark lasts until the block is handed out for other content.

The shared marks live in a side table keyed by block id. Not thread-safe, like vLLM's queue:
the block pool runs on the scheduler thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from kvcast.exporters.kit.adapters.request_state import HasIndex, live_table, policy_of
from kvcast.exporters.kit.adapters.state_values import StateCache
from kvcast.exporters.kit.adapters.vllm_lists import (
    StateList,
    append_run,
    chain,
    drop_run,
    empty_list,
)
from kvcast.exporters.kit.adapters.vllm_orders import order_for
from kvcast.exporters.kit.index import SHARED_INTENT, PriorityIndex

__all__ = ["IACFreeBlockQueue"]


class _Tagging:
    __slots__ = ("intent", "queue", "turn")

    def __init__(self, queue: IACFreeBlockQueue, intent: str | None, turn: int) -> None:
        self.queue, self.intent, self.turn = queue, intent, turn

    def __enter__(self) -> None:
        if self.intent is not None:
            self.queue.begin_tagging(self.intent, self.turn)

    def __exit__(self, *exc: object) -> None:
        self.queue.end_tagging()


class IACFreeBlockQueue:
    """``FreeKVCacheBlockQueue(blocks)``, with tagged blocks in IAC order after the rest.

    ``blocks``: the initially free blocks, in order (vLLM passes all of its pool's blocks and
    then pops the null block, block 0). ``table``: a ``TableClient`` or a fixed
    :class:`PriorityIndex`; default: the one given to :meth:`bound`, else the defaults only.
    ``clock``: seconds, ``time.monotonic`` by default.
    """

    _bound_table: HasIndex | PriorityIndex | None = None

    def __init__(
        self,
        blocks: Sequence[Any],
        *,
        table: HasIndex | PriorityIndex | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        table = table if table is not None else self._bound_table
        if table is None:
            table = PriorityIndex(None)
        self._table: HasIndex = live_table(table)
        policy = policy_of(self._table)
        self._order = order_for(policy)  # how the tagged blocks leave
        self._density = policy == "density"  # curves valued, shared marks kept
        self._clock = clock
        self.num_free_blocks = 0
        self.fake_free_list_head, self.fake_free_list_tail = empty_list()
        # Per block id: 1 where a turn-1 request found the block cached (shared); _marked: any
        # block ever marked (until then neither appending nor taking blocks looks at marks).
        self._shared = bytearray(max((block.block_id for block in blocks), default=-1) + 1)
        self._marked = False
        # One list per (intent, turn) freed, valued by the table in use (the defaults while it
        # is not listed), so blocks freed before the table lists their state move when it does;
        # past its bound, unlisted states share the defaults' list.
        self._states = StateCache(
            self._table,
            StateList,
            density=self._density,
            added=self._added,
            changed=lambda: self._order.revalued(self._clock()),
        )
        self._pending: StateList | None = None  # set by tagging(): the state being freed
        self.append_n(list(blocks))

    @classmethod
    def bound(cls, table: HasIndex | PriorityIndex) -> type[IACFreeBlockQueue]:
        """This class with ``table`` as its default: a drop-in for vLLM's ``(blocks)`` call."""
        return type(cls.__name__, (cls,), {"_bound_table": table, "__module__": cls.__module__})

    def reserve(self, num_blocks: int) -> None:
        """Room in the marks' side table for block ids below ``num_blocks`` (the pool's size)."""
        if num_blocks > len(self._shared):
            self._shared.extend(bytes(num_blocks - len(self._shared)))

    @property
    def keeps_marks(self) -> bool:
        """Whether :meth:`mark_shared` does anything: only a ``density`` queue ranks by them."""
        return self._density

    def mark_shared(self, groups: Sequence[Sequence[Any]]) -> None:
        """Mark blocks as shared by two conversations (``KVCacheBlocks.blocks``: one list of
        blocks per KV cache group); only a ``density`` queue keeps marks."""
        if not self._density:
            return
        for blocks in groups:
            for block in blocks:
                if block.block_id >= len(self._shared):
                    self.reserve(block.block_id + 1)
                self._shared[block.block_id] = 1
                self._marked = True

    def state_of(self, block: Any) -> tuple[str, int] | None:
        """The table state whose list a free block waits in (None: the defaults' list);
        ``KeyError`` for a block that is not in a state's list (untagged, or not free)."""
        node = block.prev_free_block
        while node is not None and node.block_id >= 0:
            node = node.prev_free_block
        if node is None or node.owner is None:
            raise KeyError(f"block {block.block_id} waits in no state's list")
        return node.owner.state

    # -- tagging -------------------------------------------------------------------------------

    def tagging(self, intent: str | None, turn: int) -> _Tagging:
        """Blocks appended (freed with cached content) inside ``with queue.tagging(...)`` are of
        state ``(intent, turn)``. An intent the table does not list counts under the table's
        defaults; ``intent=None`` leaves the blocks untagged (the stock LRU order)."""
        return _Tagging(self, intent, turn)

    def begin_tagging(self, intent: str, turn: int) -> None:
        """What ``with tagging(...)`` does on entry (for a hot path: no context object)."""
        self._pending = self._states.get(intent, turn)

    def end_tagging(self) -> None:
        self._pending = None

    def _added(self, state_list: StateList) -> None:
        state_list.serial = len(self._states)  # creation order: density's tie-break
        self._order.add(state_list)

    # -- vLLM's FreeKVCacheBlockQueue ------------------------------------------------------------

    def popleft(self) -> Any:
        """Pop the first free block and reduce num_free_blocks by 1."""
        if self.num_free_blocks == 0:
            raise ValueError("No free blocks available")
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[Any]:
        """Pop the first n free blocks (untagged first, then IAC order)."""
        if n == 0:
            return []
        assert self.num_free_blocks >= n
        self.num_free_blocks -= n
        popped: list[Any] = []
        head, tail = self.fake_free_list_head, self.fake_free_list_tail
        block = head.next_free_block
        while block is not tail:
            following = block.next_free_block
            block.prev_free_block = block.next_free_block = None
            popped.append(block)
            block = following
            if len(popped) == n:
                break
        head.next_free_block, block.prev_free_block = block, head
        if len(popped) < n:
            self._pop_tagged(n - len(popped), popped)
        if self._marked:  # handed out for other content: no longer shared
            shared = self._shared
            for block in popped:
                shared[block.block_id] = 0
        return popped

    def _pop_tagged(self, wanted: int, popped: list[Any]) -> None:
        self._states.sync()
        self._order.pop(wanted, popped, self._clock())

    def remove(self, block: Any) -> None:
        """Remove a block in the free list (a cache hit) and reduce num_free_blocks by 1."""
        prev_block, next_block = block.prev_free_block, block.next_free_block
        if prev_block is None or next_block is None:
            raise RuntimeError(f"remove() called on an invalid block: {block}")
        prev_block.next_free_block, next_block.prev_free_block = next_block, prev_block
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1
        state_list = prev_block.owner if prev_block.block_id < 0 else None
        if state_list is not None and next_block.block_id < 0:  # the last block of its run
            at_head = prev_block.prev_run is state_list.head
            at_tail = prev_block.next_run is state_list.tail
            drop_run(prev_block, next_block)
            self._order.removed(state_list, at_head or at_tail, self._clock())

    def append(self, block: Any) -> None:
        """Put a block back into the free list and increase num_free_blocks by 1."""
        self.append_n([block])

    def append_n(self, blocks: Sequence[Any]) -> None:
        """Put blocks back, in order: untagged at the tail, inside :meth:`tagging` at the tail of
        their state's list."""
        if not blocks:
            return
        state_list = self._pending
        if state_list is None:  # the stock path, step for step
            tail = self.fake_free_list_tail
            last_block = chain(tail.prev_free_block, blocks)
            last_block.next_free_block, tail.prev_free_block = tail, last_block
            self.num_free_blocks += len(blocks)
            return
        cut = self._shared_from(blocks) if self._marked else len(blocks)
        self._append_tagged(blocks[:cut] if cut < len(blocks) else blocks, state_list)
        if cut < len(blocks):
            self._append_tagged(blocks[cut:], self._states.get(SHARED_INTENT, 1))

    def _shared_from(self, blocks: Sequence[Any]) -> int:
        """Where the marked blocks of a request's freed blocks (tail first) begin: its marked
        blocks are its leading ones, the end of ``blocks``; ``len(blocks)``: none, or a table
        without the shared law (then they stay with their request's state)."""
        shared, cut = self._shared, len(blocks)
        while cut and blocks[cut - 1].block_id < len(shared) and shared[blocks[cut - 1].block_id]:
            cut -= 1
        index = self._states.index
        if cut < len(blocks) and not (index is not None and index.has_shared):
            return len(blocks)
        return cut

    def _append_tagged(self, blocks: Sequence[Any], state_list: StateList) -> None:
        """Put freed blocks, in order, at the tail of a state's list: a new run."""
        if not blocks:
            return
        now = self._clock()
        was_empty = state_list.head.next_run is state_list.tail
        run = append_run(state_list, blocks, now)
        self.num_free_blocks += len(blocks)
        self._order.appended(state_list, run, was_empty, now)

    def prepend_n(self, blocks: Sequence[Any]) -> None:
        """Put blocks holding no cache at the front of the free list (reused first, as stock)."""
        if not blocks:
            return
        head = self.fake_free_list_head
        first_block = head.next_free_block
        prev_block = chain(head, blocks)
        prev_block.next_free_block, first_block.prev_free_block = first_block, prev_block
        self.num_free_blocks += len(blocks)

    def iter_blocks_after(self, cursor: Any | None) -> Iterator[Any]:
        """Free blocks in eviction order after ``cursor`` (all of them for None); nothing when
        ``cursor`` is no longer free. Costs the blocks before the cursor too (stock: O(1))."""
        if cursor is not None and cursor.next_free_block is None:
            return
        found = cursor is None
        for block in self._eviction_order():
            if found:
                yield block
            elif block is cursor:
                found = True

    def get_all_free_blocks(self) -> list[Any]:
        """Every free block, in the order ``popleft`` would take them now (not removed)."""
        return list(self._eviction_order())

    def _eviction_order(self) -> Iterator[Any]:
        """What :meth:`popleft_n` would take, in order, without taking it."""
        tail = self.fake_free_list_tail
        block = self.fake_free_list_head.next_free_block
        while block is not tail:
            yield block
            block = block.next_free_block
        self._states.sync()
        yield from self._order.order(self._clock())
