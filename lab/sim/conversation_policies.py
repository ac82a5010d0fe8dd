"""Whole-content (conversation-level) caches with an eviction order: ``iac`` and ``density``.

The model is Algorithm 1's (``kvcast.lab.sim.lru``), sizes in KV blocks: a request of
conversation c with ``R_j`` blocks hits iff c is resident and reuses ``max(R_prev - 1, 0)``
blocks (capped at ``R_j``); then c's content becomes ``R_j`` and whole conversations are evicted
while the resident total exceeds N, lowest key first. The conversation just served is evicted
only when it alone exceeds N (as Algorithm 1's MRU entry is). Keys, for the state (intent i,
turn t) of c's latest request at time ``t_c``:

- ``iac``: ``(1[now - t_c < M(i, t)], P(t+1 | i, t), t_c, c)`` (SPEC Eq. 1, size term dropped:
  ``size="request"`` puts ``R`` there);
- ``density``: ``(d(i, t, now - t_c) / size, t_c, c)``, ``d`` the table's hit density per
  block on its age grid (``kvcast.exporters.kit.index``); ``size`` 1 (``"block"``: every block of a
  conversation is worth the same, so ranking conversations ranks their blocks) or ``R``.

Keys that change with age are recomputed at their flip times (IAC: when the median passes;
density: when the age enters a bucket of another value), so every eviction sees current keys.
With a table of equal states ``iac`` orders exactly as Algorithm 1's LRU.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvcast.exporters.kit.ages import AGE_BUCKETS, age_bucket, flip_time
from kvcast.exporters.kit.index import PriorityIndex
from kvcast.lab.sim.block_policies import _sizes
from kvcast.lab.sim.policy_tables import intent_labels, table_index
from kvcast.lab.sim.trace import SimTrace
from kvcast.stats.config import StatsConfig

# key(request r of the conversation, now) -> (sort key without the conversation, flip time)
KeyFn = Callable[[int, float], tuple[tuple[Any, ...], float | None]]


def run_conversation_cache(trace: SimTrace, capacity_blocks: int, key: KeyFn) -> NDArray[np.int64]:
    """Algorithm 1 with eviction by ``key`` (lowest first); hit blocks per request."""
    if capacity_blocks < 0:
        raise ValueError("capacity_blocks must be >= 0")
    conv = trace.conversation.tolist()
    size = trace.blocks.tolist()
    times = trace.timestamp.tolist()
    cap = int(capacity_blocks)
    content = [0] * trace.conversations  # resident blocks (0: not resident)
    latest = [-1] * trace.conversations  # request that set the content
    ver = [0] * trace.conversations
    heap: list[tuple[Any, ...]] = []
    flips: list[tuple[float, int, int]] = []
    push, pop = heapq.heappush, heapq.heappop
    out = [0] * len(size)
    total = 0

    def enqueue(c: int, now: float) -> None:
        k, flip = key(latest[c], now)
        push(heap, (k, c, ver[c]))
        if flip is not None:
            push(flips, (flip, c, ver[c]))

    for r, (c, blocks) in enumerate(zip(conv, size, strict=True)):
        now = times[r]
        prev = content[c]
        if prev:
            total -= prev
            if prev > 1:
                out[r] = min(prev - 1, blocks)
        content[c], latest[c] = blocks, r
        ver[c] += 1
        total += blocks
        while flips and flips[0][0] <= now:
            _, d, v = pop(flips)
            if v == ver[d] and content[d]:
                ver[d] += 1
                enqueue(d, now)
        while total > cap:
            victim = -1
            while heap:
                _, d, v = pop(heap)
                if v == ver[d] and content[d]:
                    victim = d
                    break
            if victim < 0:
                victim = c  # nothing else resident: the request alone exceeds N
            total -= content[victim]
            content[victim] = 0
            ver[victim] += 1
            if victim == c:
                break
        if content[c]:
            enqueue(c, now)
    return np.asarray(out, dtype=np.int64)


def iac_conversation(
    trace: SimTrace,
    capacity_blocks: int,
    *,
    table: dict[str, Any] | PriorityIndex | None = None,
    learn_fraction: float = 0.2,
    config: StatsConfig | None = None,
    size: str = "block",
) -> NDArray[np.int64]:
    """Whole conversations evicted by the IAC tuple (table learned as ``iac`` block does)."""
    index = table_index(trace, table, learn_fraction, config, capacity_blocks=capacity_blocks)
    labels, turns, times = intent_labels(trace), trace.turn.tolist(), trace.timestamp.tolist()
    sizes = _sizes(trace, size)

    def key(r: int, now: float) -> tuple[tuple[Any, ...], float | None]:
        median, p = index.state(labels[r], turns[r])
        fresh = now - times[r] < median
        return (1 if fresh else 0, p, sizes[r], times[r]), (times[r] + median if fresh else None)

    return run_conversation_cache(trace, capacity_blocks, key)


def density_conversation(
    trace: SimTrace,
    capacity_blocks: int,
    *,
    table: dict[str, Any] | PriorityIndex | None = None,
    learn_fraction: float = 0.2,
    horizon_s: float | None = None,
    config: StatsConfig | None = None,
    size: str = "block",
) -> NDArray[np.int64]:
    """Whole conversations evicted by hit density (table and ``T_C`` learned as the block
    policy's are; ``horizon_s`` replaces the table's horizon, as given)."""
    index = table_index(
        trace, table, learn_fraction, config, capacity_blocks=capacity_blocks, horizon_s=horizon_s
    )
    labels, turns, times = intent_labels(trace), trace.turn.tolist(), trace.timestamp.tolist()
    sizes = _sizes(trace, size)

    def key(r: int, now: float) -> tuple[tuple[Any, ...], float | None]:
        curve = index.curve(labels[r], turns[r])
        change = curve.changes()
        k = age_bucket(now - times[r])
        nxt = change[k]
        flip = flip_time(times[r], nxt) if nxt < AGE_BUCKETS else None
        return (curve.values[k] / sizes[r], times[r]), flip

    return run_conversation_cache(trace, capacity_blocks, key)
