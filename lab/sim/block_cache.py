"""Block-level prefix cache (vLLM-like) driven by a pluggable eviction order.

Model, sizes in KV blocks. Requests are processed in trace order (timestamp order), one at a
time. Request r's input is a chain of blocks ``b_0 .. b_{R-1}``; a block is identified by its
whole prefix (a trie node of the ids), so equal ids under different prefixes never match.

1. Hit: the longest prefix ``b_0 .. b_{h-1}`` that is resident is reused: ``h`` hit blocks.
2. The request's blocks become resident: the hit ones are touched, the rest inserted (only the
   first ``capacity`` blocks of a request longer than the cache). Each insertion into a full
   cache first evicts one block. While the request runs its own blocks are pinned.
3. After the request every block is free (evictable) but stays cached until evicted.

Eviction candidates are the **leaves** (resident blocks without a resident child), so a chain's
tail goes before its head and every resident block is reachable from its chain's start (SGLang's
radix-tree rule; vLLM gets the same from freeing a request's blocks tail first). Among leaves the
:class:`Strategy` decides: the leaf with the lowest key is evicted first. A key may change
at a *flip time* (IAC's recency bit expires, TB+S's next reuse comes within the threshold).
Flip times must lie strictly after the time they are computed at (``kvcast.exporters.kit.ages.
flip_time`` for age buckets), or a flip would be due again at once.

Synthesized blocks (a request without ``block_hashes``): conversation c's request j is
``chain_c[0 .. R_j - 2]`` plus a tail block of its own. The tail stands for the partly filled last
block, which the next turn cannot match (SPEC section 3's unhashable block); so at unbounded
capacity turn j reuses ``min(R_{j-1}, R_j) - 1`` blocks, as Algorithm 1 does for growing inputs.

Cost: O(R) list operations per request plus O(log n) per eviction; ~1 s per million blocks.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from kvcast.lab.sim.trace import BlockHashes

if TYPE_CHECKING:
    from kvcast.lab.sim.trace import SimTrace


Progress = Callable[[int, int], None]
"""``progress(done_requests, total_requests)``; called every few thousand requests."""

PROGRESS_EVERY = 5000  # requests
# Entries either heap may hold before its stale ones are dropped (then 4x what stays, plus
# this): a compaction costs O(heap), paid for by the pushes since the last one.
COMPACT_MIN = 1024


@dataclass(frozen=True)
class BlockLayout:
    """Request r's blocks are ``nodes[offsets[r]:offsets[r + 1]]`` (dense node ids, one per
    distinct prefix); ``num_nodes`` bounds the ids."""

    nodes: NDArray[np.int64]
    offsets: NDArray[np.int64]
    num_nodes: int

    def request_of(self) -> NDArray[np.int64]:
        """The request of every flat position."""
        counts = np.diff(self.offsets)
        return np.repeat(np.arange(counts.size, dtype=np.int64), counts)


def flat_view(values: NDArray[Any]) -> memoryview:
    """``values`` (int64 or float64) for indexing from Python one element at a time, without a
    Python object per element: indexing a memoryview gives an int or a float."""
    kind = np.float64 if np.issubdtype(values.dtype, np.floating) else np.int64
    return memoryview(np.ascontiguousarray(values, dtype=kind))


def block_layout(trace: SimTrace) -> BlockLayout:
    """Node ids of every request's blocks (``block_hashes`` where given, else synthesized)."""
    r_blocks = trace.blocks.astype(np.int64)
    offsets = np.concatenate(([0], np.cumsum(r_blocks))).astype(np.int64)
    n = len(trace)
    if trace.block_hashes is None:
        conv = trace.conversation
        chain = np.zeros(trace.conversations, np.int64)
        np.maximum.at(chain, conv, np.maximum(r_blocks - 1, 0))
        base = np.cumsum(chain) - chain
        req = np.repeat(np.arange(n, dtype=np.int64), r_blocks)
        pos = np.arange(int(offsets[-1]), dtype=np.int64) - offsets[req]
        total_chain = int(chain.sum())
        is_tail = pos == r_blocks[req] - 1
        nodes = np.where(is_tail, total_chain + req, base[conv[req]] + pos)
        return BlockLayout(nodes.astype(np.int64), offsets, total_chain + n)
    if isinstance(trace.block_hashes, BlockHashes):
        nodes, count = trie_nodes(trace.block_hashes.ids, offsets)
        return BlockLayout(nodes, offsets, count)
    return trie_layout(trace)


def trie_layout(trace: SimTrace) -> BlockLayout:
    """:func:`block_layout` by a dict of ``(parent node, id)`` pairs, one request at a time:
    any hashable ids, and requests without ids (a chain of their conversation). Nodes are
    numbered in order of first use, as :func:`trie_nodes` numbers them."""
    r_blocks = trace.blocks.astype(np.int64)
    offsets = np.concatenate(([0], np.cumsum(r_blocks))).astype(np.int64)
    trie: dict[tuple[int, Any], int] = {}
    flat: list[int] = []
    conv_list = trace.conversation.tolist()
    for r, ids in enumerate(trace.block_hashes or ()):
        node = -1
        if ids is None:  # a chain of its conversation, plus a tail block of its own
            count = int(r_blocks[r])
            ids = [("~chain", conv_list[r], p) for p in range(count - 1)]
            ids += [("~tail", r)] if count else []
        for h in ids:
            key = (node, h)
            nxt = trie.get(key)
            if nxt is None:
                nxt = trie[key] = len(trie)
            node = nxt
            flat.append(node)
    return BlockLayout(np.asarray(flat, dtype=np.int64), offsets, len(trie))


def trie_nodes(ids: NDArray[np.int64], offsets: NDArray[np.int64]) -> tuple[NDArray[np.int64], int]:
    """Trie node ids of flat int64 block ids (request r's at ``ids[offsets[r]:offsets[r+1]]``):
    a node per distinct ``(parent node, id)`` pair, numbered in order of first use in the flat
    order (the numbering of :func:`trie_layout`); returns the nodes and their count.

    Vectorized by depth: the pairs at depth p are deduplicated by one sort (a node's depth is
    fixed by its chain, so pairs of different depths never coincide). O(total log) time and
    a few arrays of the flat size (10 M ids: ~2 s, ~250 MB) where the dict took ~8 s and ~1 GB.
    """
    lengths = np.diff(offsets)
    level = np.empty(ids.size, np.int64)
    by_length = np.argsort(-lengths, kind="stable")
    longest_first = -lengths[by_length]  # ascending
    prev = np.full(lengths.size, -1, np.int64)  # each request's node one level up
    firsts: list[NDArray[np.int64]] = []  # per level, each new node's first flat position
    count = 0
    for p in range(int(lengths.max(initial=0))):
        alive = by_length[: int(np.searchsorted(longest_first, -p, side="left"))]
        pos = offsets[alive] + p
        parent, h = prev[alive], ids[pos]
        o = np.lexsort((h, parent))
        ps, hs = parent[o], h[o]
        new = np.ones(o.size, dtype=bool)
        new[1:] = (ps[1:] != ps[:-1]) | (hs[1:] != hs[:-1])
        node = np.empty(o.size, np.int64)
        node[o] = np.cumsum(new) - 1 + count
        count += int(np.count_nonzero(new))
        firsts.append(np.minimum.reduceat(pos[o], np.flatnonzero(new)))
        level[pos] = node
        prev[alive] = node
    # Renumber by first use (flat position), as the one-request-at-a-time dict does.
    first = np.concatenate(firsts) if firsts else np.zeros(0, np.int64)
    renumber = np.empty(count, np.int64)
    renumber[np.argsort(first, kind="stable")] = np.arange(count, dtype=np.int64)
    return renumber[level], count


class Strategy:
    """Eviction order of the block cache; subclass and override :meth:`entry`.

    ``entry(node, occ, now)`` returns ``(key, flip_time)`` for a leaf becoming a candidate at
    time ``now`` (s): ``occ`` is the flat position of the node's latest use (request
    ``layout.request_of()[occ]``); the lowest key is evicted first; at ``flip_time`` (None:
    never) the key is recomputed once. Keys must be tuples that never tie on the node.
    """

    wants_evictions = False
    clock = 0.0  # per-touch value the cache records in ``tclock`` (GDSF's inflation L)
    # Whether the strategy reads ``freq``/``tclock`` of a hit block (LFU, GDSF): without, a hit
    # costs two list stores instead of four (they are still set on insertion).
    wants_counts = True

    def bind(self, sim: BlockCache) -> None:
        """Called once before the run (read the layout and the trace here)."""
        self.sim = sim

    def begin(self, request: int, now: float) -> None:
        """Called before each request is processed."""

    def entry(self, node: int, occ: int, now: float) -> tuple[tuple[Any, ...], float | None]:
        raise NotImplementedError

    def evicted(self, key: tuple[Any, ...]) -> None:
        """Called with the key of each evicted block when ``wants_evictions``."""


class BlockCache:
    """One run of the block cache over a trace (see the module doc)."""

    def __init__(self, trace: SimTrace, layout: BlockLayout | None = None) -> None:
        self.trace = trace
        self.layout = layout if layout is not None else block_layout(trace)
        self.request_of = self.layout.request_of()
        size = self.layout.num_nodes
        self.freq = [0] * size  # uses since the block was inserted
        self.tclock = [0.0] * size  # strategy.clock at the latest use
        self.last_occ = [-1] * size  # flat position of the latest use
        self._queues: tuple[list[Any], list[Any]] = ([], [])

    def queued(self) -> tuple[int, int]:
        """Entries (stale ones included) in the running simulation's candidate heap and flip
        heap: each at most ``4 * capacity + COMPACT_MIN + 1``."""
        return len(self._queues[0]), len(self._queues[1])

    def run(
        self, capacity_blocks: int, strategy: Strategy, progress: Progress | None = None
    ) -> NDArray[np.int64]:
        """Hit blocks per request (trace order) with ``capacity_blocks`` blocks of cache."""
        if capacity_blocks < 0:
            raise ValueError("capacity_blocks must be >= 0")
        cap = int(capacity_blocks)
        # Per flat position: read through a memoryview (8 bytes an entry; a list of 10 M
        # Python ints would take ~360 MB more); per request and per node: lists (fastest).
        nodes, offs = flat_view(self.layout.nodes), self.layout.offsets.tolist()
        times = self.trace.timestamp.tolist()
        size = self.layout.num_nodes
        resident, nchild, ver = bytearray(size), [0] * size, [0] * size
        parent_of = [-1] * size
        freq, tclock, last_occ = self.freq, self.tclock, self.last_occ
        heap: list[tuple[Any, ...]] = []
        flips: list[tuple[float, int, int]] = []
        push, pop = heapq.heappush, heapq.heappop
        strategy.bind(self)
        entry, begin = strategy.entry, strategy.begin
        tell = strategy.evicted if strategy.wants_evictions else None
        counts = strategy.wants_counts
        n = len(offs) - 1
        out = [0] * n
        used = 0

        self._queues = (heap, flips)
        limit = COMPACT_MIN

        def compact() -> None:
            # Drop what a pop would skip (a stale version or an evicted block): a block has at
            # most one entry of its current version in each heap, so what stays is at most the
            # resident blocks, and the heaps stay within 4 * capacity + COMPACT_MIN + 1.
            nonlocal limit
            for queue in (heap, flips):
                queue[:] = [e for e in queue if e[2] == ver[e[1]] and resident[e[1]]]
                heapq.heapify(queue)
            limit = 4 * max(len(heap), len(flips)) + COMPACT_MIN

        def enqueue(nd: int, now: float) -> None:
            key, flip = entry(nd, last_occ[nd], now)
            if len(heap) > limit or len(flips) > limit:
                compact()
            push(heap, (key, nd, ver[nd]))
            if flip is not None:
                push(flips, (flip, nd, ver[nd]))

        for r in range(n):
            a, b, now = offs[r], offs[r + 1], times[r]
            begin(r, now)
            k = a
            while k < b and resident[nodes[k]]:
                k += 1
            out[r] = k - a
            clk = strategy.clock
            if counts:
                for q in range(a, k):
                    nd = nodes[q]
                    ver[nd] += 1
                    last_occ[nd] = q
                    freq[nd] += 1
                    tclock[nd] = clk
            else:
                for q in range(a, k):
                    nd = nodes[q]
                    ver[nd] += 1
                    last_occ[nd] = q
            end = min(b, a + cap)
            parent = nodes[k - 1] if k > a else -1
            flipped = False
            q = k
            while q < end:
                if used >= cap:
                    if not flipped:
                        flipped = True
                        while flips and flips[0][0] <= now:
                            _, nd, v = pop(flips)
                            if v == ver[nd] and resident[nd] and not nchild[nd]:
                                ver[nd] += 1
                                enqueue(nd, now)
                    victim = -1
                    while heap:
                        item = pop(heap)
                        nd = item[1]
                        if item[2] == ver[nd] and resident[nd] and not nchild[nd]:
                            victim = nd
                            break
                    if victim < 0:
                        break  # everything resident is pinned by this request
                    resident[victim] = 0
                    ver[victim] += 1
                    used -= 1
                    if tell is not None:
                        tell(item[0])
                    up = parent_of[victim]
                    if up >= 0:
                        nchild[up] -= 1
                        if not nchild[up] and resident[up] and last_occ[up] < a:
                            enqueue(up, now)
                nd = nodes[q]
                resident[nd] = 1
                used += 1
                ver[nd] += 1
                last_occ[nd] = q
                freq[nd] = 1
                tclock[nd] = clk
                parent_of[nd] = parent
                if parent >= 0:
                    nchild[parent] += 1
                parent = nd
                q += 1
            if parent >= 0 and not nchild[parent]:
                enqueue(parent, now)
            if progress is not None and r % PROGRESS_EVERY == 0:
                progress(r, n)
        if progress is not None:
            progress(n, n)
        return np.asarray(out, dtype=np.int64)


def next_use_times(trace: SimTrace, layout: BlockLayout) -> NDArray[np.float64]:
    """For each flat position, the timestamp (s) of the next request that uses the same block
    (``inf`` if none): what the TB+S oracle knows about the future."""
    flat = layout.nodes
    order = np.lexsort((np.arange(flat.size), flat))
    req = layout.request_of()
    nxt = np.full(flat.size, np.inf)
    same = flat[order[1:]] == flat[order[:-1]]
    nxt[order[:-1][same]] = trace.timestamp[req[order[1:][same]]]
    return nxt
