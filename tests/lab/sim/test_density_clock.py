"""The ``density`` simulators on any clock: the same workload shifted to start at 0, 1e6,
1.7e9 (epoch seconds) or 1e12 seconds gives the same hits, recomputes the same keys, and
keeps its heaps within a bound of the cache's capacity.

The workload's times lie on a grid of 1/1024 s, exact in floating point at every offset up to
2^43 s, so its ages (differences of times) are the same floats at every offset and any
difference in the results comes from the policy's own flip times. Before flip times were
taken with ``kvcast.exporters.kit.ages.flip_time``, a fixed nudge of 1e-9 s was below the clock's
float spacing at 1.7e9 s (2.4e-7 s): a flip came due again at once and re-queued itself
forever, the heaps growing without end (issue 33)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvcast.exporters.kit.index import PriorityIndex
from kvcast.lab.sim import block_cache
from kvcast.lab.sim.block_cache import COMPACT_MIN, BlockCache
from kvcast.lab.sim.block_policies import Density, density_block
from kvcast.lab.sim.conversation_policies import density_conversation
from kvcast.lab.sim.policy_tables import learn_table
from kvcast.lab.sim.trace import SimTrace
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from tests.deadline import deadline

OFFSETS = (0.0, 1e6, 1.7e9, 1e12)  # s: a fresh clock, a host up 12 days, epoch, far beyond


@pytest.fixture(scope="module")
def trace() -> SimTrace:
    found = generate(preset("mixed"), lambda0=1.0, conversations=160, seed=1).sim_trace()
    return dataclasses.replace(found, timestamp=np.round(found.timestamp * 1024) / 1024)


@pytest.fixture(scope="module")
def index(trace: SimTrace) -> PriorityIndex:
    return PriorityIndex({**learn_table(trace, 0.3), "characteristic_time_s": 120.0})


def shifted(trace: SimTrace, offset_s: float) -> SimTrace:
    return dataclasses.replace(trace, timestamp=trace.timestamp + offset_s)


class Watched(Density):
    """The density order, counting its key computations and watching both heaps' sizes at
    each one. ``budget``: the most key computations allowed, so that a flip that comes due
    again at once fails the test instead of running forever."""

    def __init__(self, index: PriorityIndex, budget: int) -> None:
        super().__init__(index)
        self.budget, self.keys, self.peak = budget, 0, 0

    def entry(self, node: int, occ: int, now: float) -> tuple[tuple[object, ...], float | None]:
        self.keys += 1
        if self.keys > self.budget:
            raise AssertionError(f"{self.keys} key computations at t={now}: a flip loops")
        self.peak = max(self.peak, *self.sim.queued())
        return super().entry(node, occ, now)


@pytest.mark.parametrize("capacity", [40, 150, 400])
def test_block_density_gives_the_same_hits_at_every_clock_offset(
    trace: SimTrace, index: PriorityIndex, capacity: int
) -> None:
    # Every block inserted, once per flip of its state's curve at most: generous, and finite.
    budget = int(trace.blocks.sum()) * 50
    runs = []
    for offset in OFFSETS:
        watched = Watched(index, budget)
        hits = BlockCache(shifted(trace, offset)).run(capacity, watched)
        runs.append((hits.tolist(), watched.keys))
        # one entry per resident block and version, 4x after a compaction, plus the slack
        assert watched.peak <= 4 * capacity + COMPACT_MIN + 1
    assert all(run == runs[0] for run in runs)  # the same hits, from the same flips
    assert 0 < sum(runs[0][0]) < int(trace.blocks.sum())  # the cache was full and evicted


def test_the_heap_bound_is_what_keeps_the_heap_small(
    trace: SimTrace, index: PriorityIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workload grows the candidate heap past the bound when stale entries are never
    dropped (a compaction threshold no heap reaches), and the hits do not depend on it."""
    capacity = 400
    kept = Watched(index, 10**9)
    hits = BlockCache(trace).run(capacity, kept).tolist()
    monkeypatch.setattr(block_cache, "COMPACT_MIN", 10**9)
    grown = Watched(index, 10**9)
    assert BlockCache(trace).run(capacity, grown).tolist() == hits
    assert kept.peak <= 4 * capacity + COMPACT_MIN + 1 < grown.peak


def test_conversation_density_gives_the_same_hits_at_every_clock_offset(
    trace: SimTrace, index: PriorityIndex
) -> None:
    with deadline(15.0, "a flip loops: the simulation is still running"):
        runs = [density_conversation(shifted(trace, o), 300, table=index).tolist() for o in OFFSETS]
    assert all(run == runs[0] for run in runs)
    assert sum(runs[0]) > 0


def test_a_learned_table_does_not_depend_on_the_clock(trace: SimTrace) -> None:
    """The table and its T_C learned from the trace itself: a trace ahead of today's wall
    clock (1e12 s) used to have its history rejected as ``future`` and learned nothing."""
    docs = [learn_table(shifted(trace, o), 0.3, capacity_blocks=150) for o in OFFSETS]
    assert all(d["states"] == docs[0]["states"] and d["states"] for d in docs)
    assert all(d["characteristic_time_s"] == docs[0]["characteristic_time_s"] for d in docs)
    runs = [density_block(shifted(trace, o), 150, learn_fraction=0.3).tolist() for o in OFFSETS]
    assert all(run == runs[0] for run in runs)
