"""The free lists of kvcast's vLLM queue (:mod:`kvcast.exporters.kit.adapters.vllm_queue`): one
list per table state, a chain of *runs* (the blocks one request freed, behind a run head).

A list is doubly linked through vLLM's own block fields (``prev_free_block`` /
``next_free_block``) between two :class:`Link` ends, as vLLM's ``FreeKVCacheBlockQueue`` is.
Each run starts with a run head, a :class:`Link` that carries the run's list and the time it
was freed, and the run heads are chained to each other as well (``prev_run`` / ``next_run``),
so a list's oldest and newest runs are one step from its ends. A node with a negative
``block_id`` is not a block: that one test is how a walk knows where a run ends.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from kvcast.exporters.kit.adapters.state_values import StateValues

__all__ = [
    "Link",
    "StateList",
    "append_run",
    "chain",
    "drop_run",
    "empty_list",
    "run_blocks",
    "take_run",
]


class Link:
    """A node of a free list that is not a block: a list's two ends, or a run head (the first
    node of a run: the blocks one request freed into a state's list)."""

    __slots__ = (
        "block_id",
        "freed_at",
        "next_free_block",
        "next_run",
        "owner",
        "prev_free_block",
        "prev_run",
    )

    def __init__(self, owner: StateList | None = None, freed_at: float = 0.0) -> None:
        self.block_id = -1  # no block of the pool: how a walk knows it left a run
        self.owner = owner  # a run head's state list; None at a list's ends
        self.freed_at = freed_at  # a run head's: when its request freed it (clock s)
        self.prev_free_block: Any = None
        self.next_free_block: Any = None
        self.prev_run: Link | None = None  # the run heads' own chain (ends included)
        self.next_run: Link | None = None


class StateList(StateValues):
    """The free blocks of one table state, in runs, oldest first, and the state's values
    (:class:`StateValues`: one per state, kept by the queue's ``StateCache``)."""

    __slots__ = ("epochs", "flip_due", "head", "rank", "serial", "tail")

    def __init__(self, state: tuple[str, int] | None) -> None:
        super().__init__(state)  # None: the table's defaults (unlisted intents)
        self.head, self.tail = empty_list()  # runs chain through next_run, oldest first
        self.rank = 0  # position in the IAC order's lists by p
        self.epochs = [0, 0]  # per end: density candidates of another epoch are stale
        self.flip_due = [math.inf, math.inf]  # per end: its earliest flip pending (clock s)
        self.serial = 0  # creation order: the density tie-break between lists


def empty_list() -> tuple[Link, Link]:
    head, tail = Link(), Link()
    head.next_free_block, tail.prev_free_block = tail, head
    head.next_run, tail.prev_run = tail, head
    return head, tail


def take_run(run: Link, wanted: int, popped: list[Any]) -> int:
    """Unlink up to ``wanted`` blocks of a run, oldest first, into ``popped``; return how many
    are still wanted. A run left empty is unlinked too, and its ``owner`` set to None."""
    block = run.next_free_block
    while wanted and block.block_id >= 0:
        following = block.next_free_block
        block.prev_free_block = block.next_free_block = None
        popped.append(block)
        wanted -= 1
        block = following
    if block.block_id >= 0:  # blocks left: the run stays
        run.next_free_block, block.prev_free_block = block, run
    else:
        drop_run(run, block)
    return wanted


def drop_run(run: Link, after: Any) -> None:
    """Unlink an empty run's head (``after``: the node that follows it)."""
    before = run.prev_free_block
    before.next_free_block, after.prev_free_block = after, before
    prev_run, next_run = run.prev_run, run.next_run
    assert prev_run is not None and next_run is not None
    prev_run.next_run, next_run.prev_run = next_run, prev_run
    run.owner = run.prev_free_block = run.next_free_block = run.prev_run = run.next_run = None


def run_blocks(run: Link) -> Iterator[Any]:
    block = run.next_free_block
    while block.block_id >= 0:
        yield block
        block = block.next_free_block


def append_run(state_list: StateList, blocks: Sequence[Any], freed_at: float) -> Link:
    """Chain ``blocks``, in order, behind a new run head at the list's tail; return the head."""
    tail = state_list.tail
    last_run = tail.prev_run
    assert last_run is not None
    run = Link(state_list, freed_at)
    run.prev_run, run.next_run = last_run, tail
    last_run.next_run = tail.prev_run = run
    last_block = tail.prev_free_block
    last_block.next_free_block, run.prev_free_block = run, last_block
    last_block = chain(run, blocks)
    last_block.next_free_block, tail.prev_free_block = tail, last_block
    return run


def chain(after: Any, blocks: Iterable[Any]) -> Any:
    """Link ``blocks``, in order, behind the node ``after``; return the last node linked (the
    caller links what follows it)."""
    last = after
    for block in blocks:
        block.prev_free_block = last
        last.next_free_block = block
        last = block
    return last
