"""Eviction policies of the block-level prefix cache, listed in ``kvcast.lab.sim.registry``.

Every key below is compared lexicographically, the **lowest leaf is evicted first**; ``r`` is
the request that used the block last (its index in trace order), ``pos`` the block's place in
that request's chain (``-pos``: deeper first among equals), ``t_r`` that request's time (s).

- ``lru``: ``(r, -pos)``: least recently used first.
- ``lfu``: ``(uses since inserted, r, -pos)``.
- ``gdsf``: ``(L + uses, r, -pos)`` with cost = size = 1 block, ``L`` the key of the last
  eviction at the block's latest use (LFU with dynamic aging).
- ``iac``: ``(1[now - t_r < M(i, t)], P(t+1 | i, t), size, t_r, r, -pos)`` for the intent i and
  turn t of request r (SPEC section 5, as ``exporters.kit.adapters.vllm`` orders blocks); the table
  is ``table=`` (a document or :class:`PriorityIndex`), else learned from the first
  ``learn_fraction`` of the trace (:func:`~kvcast.lab.sim.policy_tables.learn_table`).
- ``iac-rolling``: the same, the table re-learned causally every ``refresh_s`` s of event time.
- ``density``: ``(d(i, t, now - t_r) / size, t_r, r, -pos)``, ``d`` the hit density of
  ``kvcast.exporters.kit.index`` on its age grid (the client's :meth:`PriorityIndex.priority` with
  ``policy="density"``, exactly), the horizon the table's ``characteristic_time_s``: the
  forecast's ``T_C`` at the simulated capacity, learned with the table from the first
  ``learn_fraction`` of the trace (or ``horizon_s=`` given). The key is recomputed whenever the
  block's age enters an age bucket where its value changes (a flip time), so the heap orders
  by the score at the time of each eviction, not an approximation of it. A block that a
  second conversation used is shared: where the table carries the shared blocks' reuse law
  (its ``shared`` entry), ``d`` is that law's (``SHARED_INTENT``), with the age since the
  block's latest use.
- ``tbs``: the TB+S oracle: ``(1[next_use - now < threshold_s], size, -next_use, -pos, r)``,
  ``next_use`` the time of the block's next use (``inf``: none).

``size``: ``"block"`` (default: every block the same size, so the term never decides) or
``"request"`` (``R_r`` blocks of the request that used it last: the IAC paper's node size). With
block sizes and the farthest-next-use tie-break, ``tbs`` orders exactly as Belady's MIN (the
threshold then only splits the order where it would split anyway). ``iac`` with a table of
equal states orders exactly as ``lru``: the recency bit expires in order of last use.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvcast.exporters.kit.ages import AGE_BUCKETS, age_bucket, flip_time
from kvcast.exporters.kit.index import PriorityIndex
from kvcast.lab.sim.block_cache import (
    BlockCache,
    BlockLayout,
    Progress,
    Strategy,
    flat_view,
    next_use_times,
)
from kvcast.lab.sim.policy_tables import RollingTable, intent_labels, table_index
from kvcast.lab.sim.trace import SimTrace
from kvcast.stats.config import StatsConfig

SIZES = ("block", "request")
INF = float("inf")


class LRU(Strategy):
    wants_counts = False

    def entry(self, node: int, occ: int, now: float) -> tuple[Any, float | None]:
        # The key (r, -pos) as one int, r * stride - pos (0 <= pos < stride): the same order,
        # compared faster in the heap than a tuple.
        r = self.req[occ]
        return r * self.stride + self.off[r] - occ, None

    def bind(self, sim: BlockCache) -> None:
        super().bind(sim)
        self.req = flat_view(sim.request_of)
        self.off = sim.layout.offsets.tolist()
        self.stride = int(sim.trace.blocks.max(initial=0)) + 1


class LFU(LRU):
    wants_counts = True

    def entry(self, node: int, occ: int, now: float) -> tuple[tuple[Any, ...], float | None]:
        r = self.req[occ]
        return (self.sim.freq[node], r, self.off[r] - occ), None


class GDSF(LRU):
    wants_evictions = True
    wants_counts = True

    def entry(self, node: int, occ: int, now: float) -> tuple[tuple[Any, ...], float | None]:
        r = self.req[occ]
        return (self.sim.tclock[node] + self.sim.freq[node], r, self.off[r] - occ), None

    def evicted(self, key: tuple[Any, ...]) -> None:
        self.clock = max(self.clock, key[0])


def _sizes(trace: SimTrace, size: str) -> list[int]:
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}, got {size!r}")
    return trace.blocks.tolist() if size == "request" else [1] * len(trace)


class _ByState(LRU):
    """A table-driven order: each request's time (s), size term, intent and turn, as columns."""

    size_mode: str

    def bind(self, sim: BlockCache) -> None:
        super().bind(sim)
        trace = sim.trace
        self.times = trace.timestamp.tolist()
        self.sizes = _sizes(trace, self.size_mode)
        self.labels = intent_labels(trace)
        self.turns = trace.turn.tolist()


class IAC(_ByState):
    """IAC order over a fixed table, or a :class:`RollingTable` consulted as requests arrive."""

    def __init__(self, table: PriorityIndex | RollingTable, size: str = "block") -> None:
        self.table = table
        self.size_mode = size

    def bind(self, sim: BlockCache) -> None:
        super().bind(sim)
        self.state: list[tuple[float, float]] = [(0.0, 0.0)] * len(sim.trace)

    def begin(self, request: int, now: float) -> None:
        table = self.table
        if isinstance(table, RollingTable):
            table.observe(request)
            index = table.index
        else:
            index = table
        self.state[request] = index.state(self.labels[request], self.turns[request])

    def entry(self, node: int, occ: int, now: float) -> tuple[tuple[Any, ...], float | None]:
        r = self.req[occ]
        median, p = self.state[r]
        t_r = self.times[r]
        fresh = now - t_r < median
        key = (1 if fresh else 0, p, self.sizes[r], t_r, r, self.off[r] - occ)
        return key, (t_r + median if fresh else None)


class Density(_ByState):
    """The ``density`` order over a fixed table (see the module doc)."""

    def __init__(self, table: PriorityIndex, size: str = "block") -> None:
        self.table = table
        self.size_mode = size

    def bind(self, sim: BlockCache) -> None:
        super().bind(sim)
        trace = sim.trace
        self.curves: list[Any] = [None] * len(trace)
        self.change: list[list[int]] = [[]] * len(trace)
        # Per node: the conversation that used it last; a node a second conversation used
        # is shared, valued by the table's shared law where it has one (the engine-side
        # client's SHARED_INTENT curve).
        self.user = [-1] * sim.layout.num_nodes
        self.shared_nodes: set[int] = set()
        self.nodes = flat_view(sim.layout.nodes)
        self.offs = sim.layout.offsets.tolist()
        self.conv = trace.conversation.tolist()
        shared_curve = self.table.shared_curve()
        self.shared_values, self.shared_changes = shared_curve.values, shared_curve.changes()

    def begin(self, request: int, now: float) -> None:
        if self.table.has_shared:
            c, user, shared_nodes = self.conv[request], self.user, self.shared_nodes
            for nd in self.nodes[self.offs[request] : self.offs[request + 1]]:
                if user[nd] != c:
                    if user[nd] >= 0:
                        shared_nodes.add(nd)
                    user[nd] = c
        curve = self.table.curve(self.labels[request], self.turns[request])
        self.curves[request] = curve.values
        self.change[request] = curve.changes()

    def entry(self, node: int, occ: int, now: float) -> tuple[tuple[Any, ...], float | None]:
        r = self.req[occ]
        t_r = self.times[r]
        k = age_bucket(now - t_r)
        if node in self.shared_nodes:
            value, nxt = self.shared_values[k], self.shared_changes[k]
        else:
            value, nxt = self.curves[r][k], self.change[r][k]
        # flip_time: strictly after now on any clock (a flip due at now again would loop)
        flip = flip_time(t_r, nxt) if nxt < AGE_BUCKETS else None
        return (value / self.sizes[r], t_r, r, self.off[r] - occ), flip


class TBS(LRU):
    """The TB+S oracle; knows every block's next use."""

    def __init__(self, threshold_s: float, size: str, next_use: NDArray[np.float64]) -> None:
        if not threshold_s > 0:
            raise ValueError("threshold_s must be > 0")
        self.threshold = float(threshold_s)
        self.size_mode = size
        self.next_use = flat_view(next_use)

    def bind(self, sim: BlockCache) -> None:
        super().bind(sim)
        self.sizes = _sizes(sim.trace, self.size_mode)

    def entry(self, node: int, occ: int, now: float) -> tuple[tuple[Any, ...], float | None]:
        r = self.req[occ]
        nxt = self.next_use[occ]
        soon = nxt - now < self.threshold
        key = (1 if soon else 0, self.sizes[r], -nxt, self.off[r] - occ, r)
        return key, (None if soon or nxt == INF else nxt - self.threshold)


def _run(
    trace: SimTrace,
    capacity_blocks: int,
    strategy: Strategy,
    layout: BlockLayout | None,
    progress: Progress | None,
) -> NDArray[np.int64]:
    return BlockCache(trace, layout).run(capacity_blocks, strategy, progress)


def lru_block(
    trace: SimTrace,
    capacity_blocks: int,
    *,
    layout: BlockLayout | None = None,
    progress: Progress | None = None,
) -> NDArray[np.int64]:
    """Block-level LRU with prefix sharing; hit blocks per request."""
    return _run(trace, capacity_blocks, LRU(), layout, progress)


def lfu_block(
    trace: SimTrace,
    capacity_blocks: int,
    *,
    layout: BlockLayout | None = None,
    progress: Progress | None = None,
) -> NDArray[np.int64]:
    """Block-level LFU (uses since insertion; ties least recently used first)."""
    return _run(trace, capacity_blocks, LFU(), layout, progress)


def gdsf_block(
    trace: SimTrace,
    capacity_blocks: int,
    *,
    layout: BlockLayout | None = None,
    progress: Progress | None = None,
) -> NDArray[np.int64]:
    """Block-level GDSF (cost = size = 1 block: LFU with dynamic aging)."""
    return _run(trace, capacity_blocks, GDSF(), layout, progress)


def iac_block(
    trace: SimTrace,
    capacity_blocks: int,
    *,
    table: dict[str, Any] | PriorityIndex | None = None,
    learn_fraction: float = 0.2,
    config: StatsConfig | None = None,
    size: str = "block",
    layout: BlockLayout | None = None,
    progress: Progress | None = None,
) -> NDArray[np.int64]:
    """IAC with ``table``, or with a table learned from the first ``learn_fraction`` of the
    trace's conversations (by first-turn time; the default matches the 0.2 warm-up)."""
    index = table_index(trace, table, learn_fraction, config)
    return _run(trace, capacity_blocks, IAC(index, size), layout, progress)


def iac_rolling_block(
    trace: SimTrace,
    capacity_blocks: int,
    *,
    refresh_s: float = 600.0,
    config: StatsConfig | None = None,
    size: str = "block",
    layout: BlockLayout | None = None,
    progress: Progress | None = None,
) -> NDArray[np.int64]:
    """IAC whose table is re-learned causally every ``refresh_s`` seconds of event time
    (``config``: the statistics settings: window, completion timeout, ...)."""
    rolling = RollingTable(trace, config, refresh_s)
    return _run(trace, capacity_blocks, IAC(rolling, size), layout, progress)


def density_block(
    trace: SimTrace,
    capacity_blocks: int,
    *,
    table: dict[str, Any] | PriorityIndex | None = None,
    learn_fraction: float = 0.2,
    horizon_s: float | None = None,
    config: StatsConfig | None = None,
    size: str = "block",
    layout: BlockLayout | None = None,
    progress: Progress | None = None,
) -> NDArray[np.int64]:
    """The ``density`` policy with ``table``, or with a table (and its ``T_C`` at
    ``capacity_blocks``) learned from the first ``learn_fraction`` of the conversations;
    ``horizon_s`` replaces the table's horizon (s), as given: no floor."""
    index = table_index(
        trace, table, learn_fraction, config, capacity_blocks=capacity_blocks, horizon_s=horizon_s
    )
    return _run(trace, capacity_blocks, Density(index, size), layout, progress)


def tbs_block(
    trace: SimTrace,
    capacity_blocks: int,
    *,
    threshold_s: float = 600.0,
    size: str = "block",
    layout: BlockLayout | None = None,
    progress: Progress | None = None,
) -> NDArray[np.int64]:
    """The TB+S oracle with a reuse threshold of ``threshold_s`` seconds."""
    lay = layout if layout is not None else BlockCache(trace).layout
    strategy = TBS(threshold_s, size, next_use_times(trace, lay))
    return _run(trace, capacity_blocks, strategy, lay, progress)
