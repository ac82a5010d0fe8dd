"""A tiered block-level prefix cache: a GPU tier and further tiers below it (host, disk).

Sizes in KV blocks; requests in trace order, blocks identified by their whole prefix as in
:mod:`kvcast.lab.sim.block_cache` (the same :class:`BlockLayout`). Every tier is an LRU list:
a block's recency key is ``(request of its latest use, -position in that request)``, the lowest
key leaves a tier first (so a chain's tail goes before its head, as the plain cache's leaf rule
orders it). A request's hit is the longest prefix of its chain resident in **any** tier; each
hit block is *served from* the topmost tier holding it.

- ``exclusive`` (demotion on eviction, promotion on hit; SGLang HiCache's host pool, an
  offloading connector): a block lives in one tier. A touched block moves to the GPU tier; a
  full tier demotes its least recent block to the tier below (the lowest tier drops it). A block
  of the running request is pinned in the GPU tier: when the GPU tier holds nothing else, the
  request's further blocks go straight to the first tier with room (its head stays on the GPU).
- ``inclusive`` (write-through): every tier sees every access and keeps its own LRU of its own
  capacity; a GPU eviction leaves the copies below in place, a hit below is copied up.

This module simulates the lists themselves; it does not compute tiers from single-LRU runs
(``tests/lab/sim/test_tiered_cache.py`` holds it to those: exclusive tier k serves exactly
LRU(N1+..+Nk) - LRU(N1+..+N(k-1)) of the plain simulator, inclusive tier k LRU(Nk) -
LRU(N(k-1)), the stack-inclusion identities of docs/validation.md, section "Tiers").

Cost: O(R * tiers) heap operations per request (a few seconds per million blocks).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvcast.lab.sim.block_cache import (
    COMPACT_MIN,
    PROGRESS_EVERY,
    BlockLayout,
    Progress,
    block_layout,
)
from kvcast.lab.sim.measurement import measured_requests
from kvcast.lab.sim.trace import SimTrace

TIER_MODES = ("exclusive", "inclusive")


def _check(capacities: Sequence[int], mode: str) -> list[int]:
    if mode not in TIER_MODES:
        raise ValueError(f"tier mode must be one of {', '.join(TIER_MODES)}, got {mode!r}")
    caps = [int(c) for c in capacities]
    if not caps or any(c < 1 or c != float(x) for c, x in zip(caps, capacities, strict=True)):
        raise ValueError(
            f"every tier capacity must be a whole number >= 1 blocks, got {capacities}"
        )
    return caps


class _Tier:
    """One LRU list: a min-heap of ``(key, node)`` with stale entries skipped (lazy deletion)."""

    __slots__ = ("cap", "heap", "limit", "used")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.used = 0
        self.heap: list[tuple[int, int]] = []
        self.limit = 4 * cap + COMPACT_MIN


def tiered_block_hits(
    trace: SimTrace,
    capacities: Sequence[int],
    mode: str = "exclusive",
    layout: BlockLayout | None = None,
    progress: Progress | None = None,
) -> NDArray[np.int64]:
    """Blocks served per request and tier, shape ``(requests, tiers)``; tier 0 is the GPU.

    ``capacities``: blocks per tier, top (GPU) first.
    """
    caps = _check(capacities, mode)
    lay = layout if layout is not None else block_layout(trace)
    nodes, offs = lay.nodes.tolist(), lay.offsets.tolist()
    n = len(offs) - 1
    run = _exclusive if mode == "exclusive" else _inclusive
    served = run(nodes, offs, lay.num_nodes, caps, progress)
    if progress is not None:
        progress(n, n)
    return np.asarray(served, dtype=np.int64).reshape(n, len(caps))


def _exclusive(
    nodes: list[int], offs: list[int], size: int, caps: list[int], progress: Progress | None
) -> list[int]:
    tiers = [_Tier(c) for c in caps]
    k_tiers = len(tiers)
    n = len(offs) - 1
    served = [0] * (n * k_tiers)
    where = [-1] * size  # the tier holding the block, -1: none
    key_of = [0] * size  # its recency key (see the module doc), valid while resident
    push, pop = heapq.heappush, heapq.heappop

    def enqueue(t: int, key: int, nd: int) -> None:
        tier = tiers[t]
        if len(tier.heap) > tier.limit:  # drop what a pop would skip
            tier.heap[:] = [e for e in tier.heap if where[e[1]] == t and key_of[e[1]] == e[0]]
            heapq.heapify(tier.heap)
            tier.limit = 4 * len(tier.heap) + COMPACT_MIN
        push(tier.heap, (key, nd))

    def put(nd: int, key: int, t: int) -> None:
        where[nd], key_of[nd] = t, key
        tiers[t].used += 1
        enqueue(t, key, nd)

    def least(t: int) -> tuple[int, int]:
        """The tier's least recent block (key, node); the tier is full, so one exists."""
        heap = tiers[t].heap
        while True:
            key, nd = heap[0]
            if where[nd] == t and key_of[nd] == key:
                return key, nd
            pop(heap)

    def place(nd: int, key: int, first: int) -> bool:
        """Insert ``nd`` at the top, demoting down the stack; False if no tier could take it.

        ``first``: the running request's lowest key; blocks with a key >= it are pinned.
        """
        original = nd
        t = 0
        while t < k_tiers:
            tier = tiers[t]
            if tier.used < tier.cap:
                put(nd, key, t)
                return True
            vkey, victim = least(t)
            if vkey >= first:  # the tier holds only the running request's blocks
                t += 1  # what we carry is older than all of them: it belongs further down
                continue
            pop(tier.heap)
            tier.used -= 1
            where[victim] = -1
            put(nd, key, t)
            nd, key = victim, vkey  # the victim is demoted, its recency kept
            t += 1
        where[nd] = -1  # what is carried off the lowest tier is dropped
        return nd != original

    for r in range(n):
        a, b = offs[r], offs[r + 1]
        base = r * k_tiers
        k = a
        while k < b and where[nodes[k]] >= 0:
            served[base + where[nodes[k]]] += 1
            k += 1
        for q in range(a, b):
            nd = nodes[q]
            key = a + b - 1 - q  # (r, -pos): above every earlier request, the head highest
            t = where[nd]
            if t == 0:
                key_of[nd] = key
                enqueue(0, key, nd)
                continue
            if t > 0:  # promotion: it leaves its tier first
                where[nd] = -1
                tiers[t].used -= 1
            if not place(nd, key, a):
                break  # no tier has room for more of this request
        if progress is not None and r % PROGRESS_EVERY == 0:
            progress(r, n)
    return served


def _inclusive(
    nodes: list[int], offs: list[int], size: int, caps: list[int], progress: Progress | None
) -> list[int]:
    tiers = [_Tier(c) for c in caps]
    k_tiers = len(tiers)
    n = len(offs) - 1
    served = [0] * (n * k_tiers)
    held = [bytearray(size) for _ in tiers]  # held[t][node]: the tier has a copy
    keys = [[0] * size for _ in tiers]
    push, pop = heapq.heappush, heapq.heappop
    for r in range(n):
        a, b = offs[r], offs[r + 1]
        base = r * k_tiers
        for q in range(a, b):
            nd = nodes[q]
            top = next((t for t in range(k_tiers) if held[t][nd]), -1)
            if top < 0:
                break
            served[base + top] += 1
        for t in range(k_tiers):  # write-through: every tier sees the whole request
            tier, has, key_t = tiers[t], held[t], keys[t]
            heap = tier.heap
            for q in range(a, b):
                nd = nodes[q]
                key = a + b - 1 - q
                if not has[nd]:
                    if tier.used >= tier.cap:
                        while True:
                            vkey, victim = heap[0]
                            if has[victim] and key_t[victim] == vkey:
                                break
                            pop(heap)
                        if vkey >= a:
                            break  # only this request's blocks are left: the rest stays out
                        pop(heap)
                        has[victim] = 0
                        tier.used -= 1
                    has[nd] = 1
                    tier.used += 1
                key_t[nd] = key
                if len(heap) > tier.limit:
                    heap[:] = [e for e in heap if has[e[1]] and key_t[e[1]] == e[0]]
                    heapq.heapify(heap)
                    tier.limit = 4 * len(heap) + COMPACT_MIN
                push(heap, (key, nd))
        if progress is not None and r % PROGRESS_EVERY == 0:
            progress(r, n)
    return served


@dataclass(frozen=True)
class TierSim:
    """One tier's measured figures: ``hit_ratio`` = blocks served from it / input blocks."""

    name: str
    capacity_blocks: int
    hit_blocks: int
    hit_ratio: float


@dataclass(frozen=True)
class TieredResult:
    """A tiered run over the measured conversations (as :func:`registry.measure` measures)."""

    tier_mode: str
    tiers: tuple[TierSim, ...]
    hit_ratio: float  # all tiers together
    hit_blocks: int
    input_blocks: int
    measured_conversations: int
    measured_requests: int
    requests: int
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def measure_tiers(
    trace: SimTrace,
    served: NDArray[np.int64],
    names: Sequence[str],
    capacities: Sequence[int],
    mode: str,
    warmup_fraction: float = 0.2,
    cooldown_fraction: float = 0.2,
    elapsed_s: float = 0.0,
    requests: NDArray[np.bool_] | None = None,
) -> TieredResult:
    """Per-tier hit ratios of ``served`` (from :func:`tiered_block_hits`) over whole measured
    conversations (``warmup_fraction`` / ``cooldown_fraction`` of the first-turn times), or
    over the ``requests`` given (a mask over the trace's requests; the fractions unused)."""
    if requests is None:
        mask, n_conv = measured_requests(
            trace.conversation, trace.timestamp, trace.conversations, warmup_fraction,
            cooldown_fraction,
        )  # fmt: skip
    else:
        mask, n_conv = requests, len(np.unique(trace.conversation[requests]))
    per_tier = served[mask].sum(axis=0) if served.size else np.zeros(len(names), np.int64)
    total_in = int(trace.blocks[mask].sum())
    tiers = tuple(
        TierSim(name, int(c), int(h), int(h) / total_in if total_in else 0.0)
        for name, c, h in zip(names, capacities, per_tier.tolist(), strict=True)
    )
    hit = int(per_tier.sum())
    return TieredResult(
        tier_mode=mode,
        tiers=tiers,
        hit_ratio=hit / total_in if total_in else 0.0,
        hit_blocks=hit,
        input_blocks=total_in,
        measured_conversations=n_conv,
        measured_requests=int(mask.sum()),
        requests=len(trace),
        elapsed_s=elapsed_s,
    )
