"""The two orders in which kvcast's vLLM queue hands out its tagged blocks, one small class
each (as SGLang writes its eviction policies, one class per policy): :class:`IACOrder` (SPEC
section 5's tuple, its size term dropped) and :class:`DensityOrder` (the ``density`` key).

The queue (:mod:`kvcast.exporters.kit.adapters.vllm_queue`) owns the state lists
(:mod:`kvcast.exporters.kit.adapters.vllm_lists`) and tells its order what happens to them: a
list was added, the table's values changed, a run was appended or lost at an end of its list;
the order takes blocks (:meth:`TaggedOrder.pop`) and lists them without taking
(:meth:`TaggedOrder.order`). Times are the queue's clock seconds.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

from kvcast.exporters.kit.adapters.vllm_density import HEAD, DensityHeap, density_order
from kvcast.exporters.kit.adapters.vllm_lists import Link, StateList, run_blocks, take_run

__all__ = ["DensityOrder", "IACOrder", "TaggedOrder", "order_for"]


class TaggedOrder(ABC):
    """The order of the tagged blocks over the queue's state lists (:attr:`lists`)."""

    __slots__ = ("lists",)

    keeps_marks = False  # whether the order ranks shared blocks by the table's shared law

    def __init__(self) -> None:
        self.lists: list[StateList] = []

    def add(self, state_list: StateList) -> None:
        """A new state's list (empty, valued by the table in use)."""
        self.lists.append(state_list)

    @abstractmethod
    def revalued(self, now: float) -> None:
        """Every list took the values of a new table."""

    @abstractmethod
    def appended(self, state_list: StateList, run: Link, was_empty: bool, now: float) -> None:
        """A run was appended at the tail of ``state_list`` (its first one if ``was_empty``)."""

    def removed(self, state_list: StateList, at_end: bool, now: float) -> None:  # noqa: B027
        """A run left ``state_list`` by a cache hit (``at_end``: its oldest or newest run);
        nothing to do by default."""

    @abstractmethod
    def pop(self, wanted: int, popped: list[Any], now: float) -> None:
        """Take ``wanted`` blocks into ``popped``, first to evict first."""

    @abstractmethod
    def order(self, now: float) -> Iterator[Any]:
        """The blocks :meth:`pop` would take, in order, taking nothing."""


class IACOrder(TaggedOrder):
    """Past their state's median reuse delay first, among those the state least likely to
    continue first (``P(t+1 | i, t)``), then the rest by the same probability; within a state
    the order they were freed in. One pass over the lists per :meth:`pop` at most, and less:
    two bounds spare it the lists that cannot give a block."""

    __slots__ = ("_low_rank", "_stale_from")

    def __init__(self) -> None:
        super().__init__()
        # No list's first block passes its median before _stale_from (clock s); the lists by
        # p before _low_rank are empty.
        self._stale_from = -math.inf
        self._low_rank = 0

    def add(self, state_list: StateList) -> None:
        self.lists.append(state_list)
        self._rank()

    def revalued(self, now: float) -> None:
        self._rank()

    def _rank(self) -> None:
        self.lists.sort(key=lambda lst: lst.p)
        for rank, state_list in enumerate(self.lists):
            state_list.rank = rank
        self._stale_from, self._low_rank = -math.inf, 0

    def appended(self, state_list: StateList, run: Link, was_empty: bool, now: float) -> None:
        if was_empty:  # a new first block: update the bounds
            self._stale_from = min(self._stale_from, now + state_list.median_s)
            self._low_rank = min(self._low_rank, state_list.rank)

    def pop(self, wanted: int, popped: list[Any], now: float) -> None:
        by_p = self.lists
        if now >= self._stale_from:
            # Past their median first, lowest P first: a list's oldest block is its first, so
            # each list gives blocks from its head until one is still within its median.
            stale_from = math.inf
            for state_list in by_p:
                wanted, due = self._take(state_list, wanted, popped, now)
                stale_from = min(stale_from, due)
                if not wanted:
                    stale_from = now  # stopped early: the next call looks again
                    break
            self._stale_from = stale_from
            if not wanted:
                return
        for rank in range(self._low_rank, len(by_p)):  # then the rest, lowest P first
            wanted, _ = self._take(by_p[rank], wanted, popped, None)
            if not wanted:
                self._low_rank = rank
                return
        raise RuntimeError("num_free_blocks is out of sync with the free lists")

    @staticmethod
    def _take(
        state_list: StateList, wanted: int, popped: list[Any], now: float | None
    ) -> tuple[int, float]:
        """Unlink up to ``wanted`` blocks from the list's oldest runs into ``popped``; with
        ``now`` (clock s), only blocks past their median then. Returns what is still wanted and
        when the list's new first block passes its median (inf: none, or no ``now``)."""
        tail, median_s = state_list.tail, state_list.median_s
        run = state_list.head.next_run
        while wanted and run is not tail:
            assert run is not None
            if now is not None and run.freed_at + median_s > now:
                return wanted, run.freed_at + median_s
            following = run.next_run
            wanted = take_run(run, wanted, popped)
            run = following
        return wanted, math.inf

    def order(self, now: float) -> Iterator[Any]:
        resume: dict[int, Link] = {}
        for state_list in self.lists:
            run = state_list.head.next_run
            while run is not state_list.tail:
                assert run is not None
                if run.freed_at + state_list.median_s > now:
                    break
                yield from run_blocks(run)
                run = run.next_run
            resume[id(state_list)] = run
        for state_list in self.lists:
            run = resume[id(state_list)]
            while run is not state_list.tail:
                assert run is not None
                yield from run_blocks(run)
                run = run.next_run


class DensityOrder(TaggedOrder):
    """Lowest hit density first (``PriorityIndex.priority(..., policy="density")`` with the
    size of one block), ties oldest first, from a heap over the lists' ends
    (:class:`~kvcast.exporters.kit.adapters.vllm_density.DensityHeap`): O(log states) per run
    taken. Shared blocks wait in the list of ``SHARED_INTENT``."""

    __slots__ = ("_heap",)

    keeps_marks = True

    def __init__(self) -> None:
        super().__init__()
        self._heap = DensityHeap()  # the lists' ends, lowest key first

    def revalued(self, now: float) -> None:
        self._heap.rebuild(self.lists, now)

    def appended(self, state_list: StateList, run: Link, was_empty: bool, now: float) -> None:
        if was_empty:
            self._heap.push_end(state_list, HEAD, now)
        else:
            self._heap.push_new_tail(state_list, run)

    def removed(self, state_list: StateList, at_end: bool, now: float) -> None:
        if at_end:  # an end of the list has another run
            self._heap.push_ends(state_list, now)

    def pop(self, wanted: int, popped: list[Any], now: float) -> None:
        self._heap.pop(wanted, popped, now)

    def order(self, now: float) -> Iterator[Any]:
        return density_order(self.lists, now)


def order_for(policy: str) -> TaggedOrder:
    """The order of ``policy`` (``iac`` or ``density``)."""
    return DensityOrder() if policy == "density" else IACOrder()
