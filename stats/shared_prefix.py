"""Shared-prefix statistics: which leading blocks of a request other conversations share.

Units: blocks (KV blocks, one id per block), seconds of event time.

A block whose id appears in two or more conversations is *shared* (SPEC section 12). For each
accepted request with ``block_hashes`` the :class:`SharedPrefixIndex` finds its leading run of
shared blocks, ``s`` of them, and for each of those the gap since the block's previous
reference by any conversation. The run's blocks are counted as shared-block references next to
the conversation's own content; that is what the forecast with shared blocks models
(``kvcast.stats.estimators.shared_model``, docs/validation.md).

Only the leading run counts: a shared block after a private one (the same paragraph quoted in
two conversations) does not match in a prefix cache, so it is private content here too.

What the index holds, so that a checkpoint restores it exactly:

- the *private* blocks of open conversations: each conversation holds the ids of its newest
  request (``held``, kept with the conversation and checkpointed with it); a block leaves when
  its conversation completes or its next request no longer has it;
- the *shared* blocks with the time of their last reference, in a table committed with the
  partition's delta (``changes``); one expires when the watermark passes its last reference
  plus the completion timeout.

Which ids are indexed: every block of the first ``2 * dense_blocks``, then one id every 2**k
blocks from position ``2**k * dense_blocks`` on, so that memory and checkpoints grow with the
logarithm of a long request, not its length. A run whose last shared id is at ``p`` ends after
``p`` and at or before the next indexed position ``q``; it is counted to the middle of that
span, ``p + ceil((q - p) / 2)`` blocks: exact in the dense part, within ``1 / (4 dense_blocks)``
of the request's length beyond it. ``capacity`` bounds the entries: when it is
reached, new private blocks are not indexed (and cannot become shared) until others leave.

Not restored exactly in one corner: a shared block that expires while a conversation that
held it privately is still open (possible only when that conversation's later request, already
applied, does not repeat the block) comes back as that conversation's after a restart.

Cost per request: a dict lookup per indexed leading shared block plus one per indexed block of
the rest; memory about 100 bytes per indexed block.

Two implementations with the same results: :class:`PySharedPrefixIndex` below, the reference,
and :class:`NativeSharedPrefixIndex` in C (``stats/native/_replay.c``, ``SharedIndexCore``),
about 6x faster; ``SharedPrefixIndex`` is the C one where the extension is built.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import operator
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

BlockId = int | str

_PICKS_KEPT = 1 << 16  # request lengths whose id getter is kept (one tuple of positions each)
# The dense part is never shorter than this many blocks (large blocks: long dense part).
MIN_DENSE_BLOCKS = 16

# A request's shared references, flat: (gap_s, blocks, gap_s, blocks, ...), one pair per
# distinct gap, in gap order. Flat because one is kept per turn with shared blocks, for the
# conversation's life and then in the window: a tuple per pair cost the daemon's pipeline more
# than any other part of the index (scripts/shared_index_cachegrind.py).
SharedGaps = tuple[float | int, ...]


class SharedRun(NamedTuple):
    """What one request shares: its leading shared blocks, their gaps, and how many of them
    became shared with this request (``born``: their first reference by a second conversation)."""

    blocks: int
    gaps: SharedGaps
    born: int


NO_SHARING = SharedRun(0, (), 0)


@dataclass(slots=True)
class SharedTableChanges:
    """The shared table's changes since the last checkpoint: block -> last reference (s)."""

    upserts: dict[BlockId, float] = field(default_factory=dict)
    removals: set[BlockId] = field(default_factory=set)

    def clear(self) -> None:
        self.upserts.clear()
        self.removals.clear()


class PySharedPrefixIndex:
    """The blocks of open conversations and the shared table (see the module docstring).

    Deterministic in the order of the requests it sees, so a partition's statistics depend on
    that partition's events alone. ``capacity`` 0 turns it off.

    The reference: :class:`NativeSharedPrefixIndex` (C, the one the tracker uses where the
    extension is built) gives the same results, tested against this code.
    """

    def __init__(self, capacity: int, timeout_s: float, dense_blocks: int = 10**9) -> None:
        _check(capacity, dense_blocks)
        self.capacity = capacity
        self.dense_blocks = dense_blocks
        self._positions: list[int] = []  # indexed positions, extended as requests grow
        self._picks: dict[int, tuple[list[int], Callable[[list], tuple] | None]] = {}
        self._timeout = timeout_s
        self._owner: dict[BlockId, str] = {}  # private block -> the open conversation holding it
        self._shared: dict[BlockId, float] = {}  # shared block -> last reference (s)
        self._deadlines: list[tuple[int, int, BlockId]] = []  # (second, tie, block), lazy
        self._pushed = 0
        self.changes = SharedTableChanges()

    def __len__(self) -> int:
        return len(self._owner) + len(self._shared)

    @property
    def shared_table(self) -> dict[BlockId, float]:
        """Shared block -> last reference (s), read-only use."""
        return self._shared

    @property
    def next_due(self) -> float:
        """Event time from which :meth:`expire` has something to drop (inf: nothing)."""
        return self._deadlines[0][0] + 1 if self._deadlines else math.inf

    def restore(self, shared: dict[BlockId, float], held: Iterable[tuple[str, tuple]]) -> None:
        """Rebuild from a checkpoint: the shared table and each open conversation's held ids."""
        for block, last_ts in shared.items():
            self._shared[block] = last_ts
            self._schedule(block, last_ts)
        for session_id, blocks in held:
            for block in blocks:
                if block not in self._shared:
                    self._owner[block] = session_id

    def observe(
        self,
        session_id: str,
        timestamp: float,
        hashes: list[BlockId],
        held: tuple[BlockId, ...],
        last_seen: Callable[[str], float],
        newest: bool = True,
    ) -> tuple[SharedRun, tuple[BlockId, ...]]:
        """Record one request (``hashes``: its block ids in order) of a conversation holding
        ``held``; return its shared run and what the conversation holds now.

        ``last_seen(session)``: the newest event time (s) of an open conversation (its blocks'
        last reference). ``newest``: the request is the conversation's newest turn so far (an
        older turn arriving late leaves ``held`` as it is).
        """
        if not self.capacity or not hashes:
            return NO_SHARING, held
        positions, pick = self._pick(len(hashes))
        indexed = hashes if pick is None else pick(hashes)
        owners = self._owner
        shared = self._shared
        upserts = self.changes.upserts
        born = 0
        # Each indexed block's last reference if it is shared (None if not), looked up in C;
        # the run goes on through blocks that another open conversation holds (now shared).
        lasts: list[float | None] = list(map(shared.get, indexed))
        count = 0
        size = len(lasts)
        while count < size:
            if None not in lasts[count:]:
                count = size
                break
            count = lasts.index(None, count)
            block = indexed[count]
            owner = owners.get(block)
            if owner is None or owner == session_id:
                break
            del owners[block]
            born += 1
            last = last_seen(owner)
            self._schedule(block, max(last, timestamp))
            lasts[count] = last
            count += 1
        del lasts[count:]
        if count:
            newest_last = max(lasts)  # type: ignore[type-var]
            run_blocks = indexed[:count]
            if timestamp >= newest_last:  # in order: every block's last reference is now
                now = dict.fromkeys(run_blocks, timestamp)
            else:  # a late event leaves the later references standing
                now = {b: max(t, timestamp) for b, t in zip(run_blocks, lasts, strict=True)}
            shared.update(now)
            upserts.update(now)
        run = _run(timestamp, lasts, positions, len(hashes), born)
        if not newest:
            return run, held
        rest = indexed[count:]
        # The usual case: this request repeats the one before it, whose ids the conversation
        # holds, bar the last (a partly filled block, re-hashed once it fills).
        same = len(held) - 1
        if same > 0 and tuple(rest[:same]) == held[:same]:
            mine = list(held[:same])
            dropped = held[same:]
        else:
            same, mine, dropped = 0, [], held
        room = self.capacity - len(self)
        for block in rest[same:]:
            owner = owners.get(block)
            if owner == session_id:
                mine.append(block)
            elif owner is None and block not in shared and room > 0:
                owners[block] = session_id
                mine.append(block)
                room -= 1
        if dropped:
            kept = set(mine)
            for block in dropped:
                if block not in kept and owners.get(block) == session_id:
                    del owners[block]
        return run, tuple(mine)

    def continues(self, hashes: list[BlockId], held: tuple[BlockId, ...]) -> bool:
        """Whether a request of ``hashes`` repeats any block its conversation holds, bar the
        partly filled last one (True when that cannot be told: less than two held).

        False is a conversation that starts its context anew (an agent that compacts it into
        a summary, a user who edits the first message): nothing of its cached chain can be
        reused, so the tracker ends the conversation there and starts another.
        """
        if len(held) < 2 or not self.capacity or not hashes:
            return True
        _, pick = self._pick(len(hashes))
        indexed = hashes if pick is None else pick(hashes)
        if held[0] in indexed:  # the usual case, found within the first few ids
            return True
        return not set(held[:-1]).isdisjoint(indexed)

    def _pick(self, blocks: int) -> tuple[list[int], Callable[[list], tuple] | None]:
        """The indexed positions of a ``blocks``-block request and a getter of their ids
        (None: every block is indexed)."""
        picked = self._picks.get(blocks)
        if picked is None:
            positions = self.positions(blocks)
            getter = None
            if len(positions) < blocks:
                one = operator.itemgetter(*positions)
                getter = one if len(positions) > 1 else (lambda ids: (one(ids),))
            picked = (positions, getter)
            if len(self._picks) < _PICKS_KEPT:
                self._picks[blocks] = picked
        return picked

    def positions(self, blocks: int) -> list[int]:
        """The indexed positions of a request of ``blocks`` blocks (0-based, increasing)."""
        known = self._positions
        if not known or known[-1] < blocks - 1:
            dense = self.dense_blocks
            p = known[-1] + 1 if known else 0
            target = max(blocks, 2 * len(known) + 1)  # amortised growth
            while p < target:
                # Below 2 D every block; from 2**k D on, one id every 2**k blocks.
                step = 1 if p < 2 * dense else 1 << ((p // dense).bit_length() - 1)
                if p % step == 0:
                    known.append(p)
                p += 1 if p < 2 * dense else step - p % step
        return known[: bisect.bisect_left(known, blocks)]

    def release(self, session_id: str, held: tuple[BlockId, ...]) -> None:
        """A conversation completed: its private blocks leave the index."""
        owners = self._owner
        for block in held:
            if owners.get(block) == session_id:
                del owners[block]

    def expire(self, watermark: float) -> None:
        """Drop the shared blocks last referenced more than the timeout before ``watermark``."""
        deadlines = self._deadlines
        shared = self._shared
        removals = self.changes.removals
        while deadlines and deadlines[0][0] + 1 <= watermark:
            _, _, block = heapq.heappop(deadlines)
            last = shared.get(block)
            if last is None:
                continue
            if math.floor(last + self._timeout) + 1 <= watermark:
                del shared[block]
                self.changes.upserts.pop(block, None)
                removals.add(block)
            else:  # referenced since it was scheduled: one entry per block, at its deadline
                self._schedule(block, last)

    def clear(self) -> None:
        """End of a finite input: everything completes."""
        self._owner.clear()

    def _schedule(self, block: BlockId, last_ts: float) -> None:
        self._pushed += 1
        heapq.heappush(self._deadlines, (math.floor(last_ts + self._timeout), self._pushed, block))


def _check(capacity: int, dense_blocks: int) -> None:
    if capacity < 0:
        raise ValueError(f"shared-prefix index capacity must be >= 0 blocks, got {capacity}")
    if dense_blocks < 1:
        raise ValueError(f"shared-prefix index dense_blocks must be >= 1, got {dense_blocks}")


def _load_core() -> type | None:
    try:
        from kvcast.stats.native._replay import SharedIndexCore
    except ImportError:  # the extension is optional: no compiler, the Python index
        return None
    return SharedIndexCore


_Core = _load_core()


class _NativeChanges:
    """:class:`SharedTableChanges` of a :class:`NativeSharedPrefixIndex`: the upserts are kept
    in C and read as a new dict (the same items in the same order as the Python index's)."""

    __slots__ = ("_index", "removals")

    def __init__(self, index: NativeSharedPrefixIndex) -> None:
        self._index = index
        self.removals: set[BlockId] = set()

    @property
    def upserts(self) -> dict[BlockId, float]:
        return self._index._upserts()

    def clear(self) -> None:
        self._index._clear_changes()

    def __repr__(self) -> str:
        return f"SharedTableChanges(upserts={self.upserts!r}, removals={self.removals!r})"


if _Core is not None:

    class NativeSharedPrefixIndex(_Core):  # type: ignore[misc, valid-type]
        """:class:`PySharedPrefixIndex` in C (``stats/native/_replay.c``, ``SharedIndexCore``):
        the same methods and results. ``shared_table`` and ``changes.upserts`` are new dicts
        at each read (same items, same order); ``restore`` fills an empty index."""

        def __init__(self, capacity: int, timeout_s: float, dense_blocks: int = 10**9) -> None:
            _check(capacity, dense_blocks)
            self.changes = _NativeChanges(self)
            super().__init__(
                capacity, timeout_s, dense_blocks, SharedRun, NO_SHARING, self.changes.removals
            )

    SharedPrefixIndex: type[PySharedPrefixIndex] = NativeSharedPrefixIndex  # type: ignore[assignment]
else:
    SharedPrefixIndex = PySharedPrefixIndex


def _run(
    timestamp: float, lasts: list[float], positions: list[int], blocks: int, born: int
) -> SharedRun:
    """The run of a request (at ``timestamp`` s, ``blocks`` blocks) whose first
    ``len(lasts)`` indexed ids (at ``positions``) are shared and were last referenced at
    ``lasts``. Each indexed id stands for the blocks up to the next one; the run ends after the
    last shared id and at or before the next indexed position (or the request's end), and is
    counted to the middle of that span, rounded up."""
    count = len(lasts)
    if not count:
        return NO_SHARING
    start = positions[count - 1]
    end = positions[count] if count < len(positions) else blocks  # first block not shared, at most
    last = (end - start + 1) // 2
    if lasts.count(lasts[0]) == count:  # the usual case: referenced together, one gap
        gap = timestamp - lasts[0]
        return SharedRun(start + last, (gap if gap > 0.0 else 0.0, start + last), born)
    weights = Counter(lasts[:-1]) if start == count - 1 else _span_weights(lasts, positions)
    weights[lasts[-1]] += last
    gaps: dict[float, int] = {}
    for previous, n in weights.items():
        gap = timestamp - previous
        gap = gap if gap > 0.0 else 0.0
        gaps[gap] = gaps.get(gap, 0) + n
    return SharedRun(start + last, tuple(itertools.chain.from_iterable(sorted(gaps.items()))), born)


def _span_weights(lasts: list[float], positions: list[int]) -> Counter[float]:
    """Blocks per previous reference time, each indexed id standing for the blocks up to the
    next one (all but the last shared id)."""
    weights: Counter[float] = Counter()
    for k in range(len(lasts) - 1):
        weights[lasts[k]] += positions[k + 1] - positions[k]
    return weights
