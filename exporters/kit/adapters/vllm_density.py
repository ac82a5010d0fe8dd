"""The ``density`` order of kvcast's vLLM queue: one heap over the ends of the state lists
(:mod:`kvcast.exporters.kit.adapters.vllm_lists`).

A block's key is the client's (``PriorityIndex.priority(..., policy="density")`` with the size
of one block): its state's density at the age since its run was freed, ties oldest first. A
state's density is unimodal in age and its list is ordered by age, so the list's lowest run is
at one of its two ends: the heap holds each list's oldest run and, if another, its newest, as
*candidates*, and taking the lowest candidate run by run takes the blocks in key order.

A candidate's key changes as its run ages. Where the key falls (the run's age enters a bucket
of a lower value) it is revalued on time, from a second heap of *flips*; where it rises, the
stale key is a lower bound and is revalued only when it reaches the front of the heap. A young
run, whose value rises, costs no flips. Candidates are never removed: an end's *epoch* counts
its changes, and a candidate of another epoch is stale and skipped (and dropped in bulk once
the heap is mostly stale). A flip only says "revalue this end then": an end with a flip due
no later than its new candidate's needs no other (a list's newer runs fall later). Flip times
come from :func:`kvcast.exporters.kit.ages.flip_time`: strictly after the time they are computed at
on any clock (``time.monotonic()`` of a long-running host included), so a flip handled at
``now`` is never due at ``now`` again.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator
from typing import Any

from kvcast.exporters.kit.adapters.vllm_lists import Link, StateList, run_blocks, take_run
from kvcast.exporters.kit.ages import AGE_BUCKETS, age_bucket, flip_time

__all__ = ["HEAD", "TAIL", "DensityHeap"]

HEAD, TAIL = 0, 1  # the ends of a state list a candidate stands for


class DensityHeap:
    """The candidates of every state list, lowest key first. Times are clock seconds."""

    __slots__ = ("_flips", "_heap", "_limit")

    def __init__(self) -> None:
        # (value, freed at, list serial, end, epoch, list, run head): the key is the first three
        self._heap: list[tuple[Any, ...]] = []
        # (when an end's key may fall: clock s, list serial, end, list)
        self._flips: list[tuple[Any, ...]] = []
        self._limit = 1024  # entries, stale ones included, before a compaction

    def rebuild(self, lists: Iterable[StateList], now: float) -> None:
        """Every list's candidates anew (the lists' values changed)."""
        self._heap, self._flips = [], []
        for state_list in lists:
            state_list.flip_due[HEAD] = state_list.flip_due[TAIL] = math.inf
            self.push_ends(state_list, now)

    def push_ends(self, state_list: StateList, now: float) -> None:
        """Make the list's candidates current: its oldest run and, if another, its newest."""
        self.push_end(state_list, HEAD, now)
        self.push_end(state_list, TAIL, now)

    def push_end(self, state_list: StateList, end: int, now: float) -> None:
        """Make one end's candidate current: the run at that end, valued at its age now. A
        list of one run has only a head candidate."""
        epochs = state_list.epochs
        epochs[end] += 1
        run = state_list.head.next_run
        if run is state_list.tail:  # empty: neither end stands for a run
            epochs[TAIL - end] += 1
            return
        last = state_list.tail.prev_run
        if last is run:  # one run
            if end == TAIL:
                return
            epochs[TAIL] += 1
        elif end == TAIL:
            run = last
        assert run is not None
        self._push(state_list, end, run, now - run.freed_at)

    def push_new_tail(self, state_list: StateList, run: Link) -> None:
        """The candidate of a run just appended behind others (age 0, bucket 0): :meth:`push_end`
        for the tail, unrolled, as it runs once per freed request."""
        if len(self._heap) > self._limit:
            self._compact()
        epochs = state_list.epochs
        epochs[TAIL] += 1
        freed_at, epoch, serial = run.freed_at, epochs[TAIL], state_list.serial
        entry = (state_list.curve[0], freed_at, serial, TAIL, epoch, state_list, run)
        heapq.heappush(self._heap, entry)
        later = state_list.drop[0]
        if later < AGE_BUCKETS:
            when = flip_time(freed_at, later)
            if when < state_list.flip_due[TAIL]:
                state_list.flip_due[TAIL] = when
                heapq.heappush(self._flips, (when, serial, TAIL, state_list))

    def _push(self, state_list: StateList, end: int, run: Link, age_s: float) -> None:
        if len(self._heap) > self._limit:
            self._compact()
        freed_at = run.freed_at
        k = age_bucket(age_s)
        epoch, serial = state_list.epochs[end], state_list.serial
        heapq.heappush(
            self._heap, (state_list.curve[k], freed_at, serial, end, epoch, state_list, run)
        )
        later = state_list.drop[k]
        if later < AGE_BUCKETS:
            when = flip_time(freed_at, later)
            if when < state_list.flip_due[end]:
                state_list.flip_due[end] = when
                heapq.heappush(self._flips, (when, serial, end, state_list))

    def _compact(self) -> None:
        """Drop the stale candidates the heap is mostly made of."""
        self._heap = [e for e in self._heap if e[4] == e[5].epochs[e[3]]]
        heapq.heapify(self._heap)
        self._limit = 4 * len(self._heap) + 1024

    def pop(self, wanted: int, popped: list[Any], now: float) -> None:
        """Take ``wanted`` blocks into ``popped``, lowest key first (a run at a time)."""
        # self._heap and self._flips are read anew each time: _push may compact them.
        while self._flips and self._flips[0][0] <= now:  # keys that fell: revalued on time
            when, _, end, state_list = heapq.heappop(self._flips)
            if when == state_list.flip_due[end]:
                state_list.flip_due[end] = math.inf
            self.push_end(state_list, end, now)
        while wanted:
            if not self._heap:
                raise RuntimeError("num_free_blocks is out of sync with the free lists")
            entry = heapq.heappop(self._heap)
            value, freed_at, _, end, epoch, state_list, run = entry
            if epoch != state_list.epochs[end]:
                continue
            if state_list.curve[age_bucket(now - freed_at)] != value:
                self.push_end(state_list, end, now)  # it rose: the key was a lower bound
                continue
            wanted = take_run(run, wanted, popped)
            if run.owner is None:  # the run is gone: the end it was at has another
                self.push_end(state_list, end, now)
            else:  # wanted is 0: the rest of the run stays, its key unchanged
                heapq.heappush(self._heap, entry)


def density_order(lists: Iterable[StateList], now: float) -> Iterator[Any]:
    """The blocks of ``lists`` in the order :meth:`DensityHeap.pop` takes them, taking nothing
    (a sort of every run by its key: how the heap's order is checked)."""
    runs: list[tuple[tuple[float, float, int], Link]] = []
    for state_list in lists:
        run = state_list.head.next_run
        while run is not state_list.tail:
            assert run is not None
            value = state_list.curve[age_bucket(now - run.freed_at)]
            runs.append(((value, run.freed_at, state_list.serial), run))
            run = run.next_run
    runs.sort(key=lambda item: item[0])
    for _, run in runs:
        yield from run_blocks(run)
