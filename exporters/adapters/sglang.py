"""SGLang radix-cache eviction by the IAC priority (SGLang is not a dependency of kvcast).

SGLang's ``RadixCache.evict`` heapifies ``(eviction_strategy.get_priority(node), node)`` over
its evictable leaves, pops the lowest, frees ``len(node.value)`` tokens, and pushes the parent
once it has become a leaf. :class:`IACStrategy` is such a strategy: its ``get_priority``
returns the IAC tuple ``(1[age < M(i, t)], P(t+1 | i, t), size)``, lowest evicted first.

What it reads from a node (names as in SGLang's ``TreeNode``):

- ``last_access_time``: ``time.monotonic()`` seconds when the node was cached or last used;
  the age is ``now - last_access_time`` (the attribute is configurable, e.g. ``creation_time``);
- ``value``: the node's KV indices, one per token, so ``len(value)`` is its size in tokens;
- ``iac_intent`` / ``iac_turn``: the state of the request that last cached or reused it,
  set by the engine with :func:`tag_path` after inserting a request. An untagged node (no
  request metadata) gets the table's defaults. A custom ``state_of`` may replace the tags.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from kvcast.stats.priority import Priority, PriorityIndex

__all__ = ["INTENT_ATTR", "TURN_ATTR", "IACStrategy", "TreeNodeLike", "install", "tag_path"]

INTENT_ATTR = "iac_intent"
TURN_ATTR = "iac_turn"


class TreeNodeLike(Protocol):
    """The part of SGLang's ``TreeNode`` the strategy relies on."""

    parent: Any  # None at the root
    value: Any  # sized: one KV index per cached token
    last_access_time: float  # time.monotonic() seconds


class HasIndex(Protocol):
    """A :class:`~kvcast.exporters.client.TableClient`, or anything holding the live index."""

    index: PriorityIndex


class _Fixed:
    __slots__ = ("index",)

    def __init__(self, index: PriorityIndex) -> None:
        self.index = index


def _tag_state(node: Any) -> tuple[Any, int]:
    return getattr(node, INTENT_ATTR, None), getattr(node, TURN_ATTR, 0)


def tag_path(node: Any, intent: str, turn: int) -> int:
    """Tag ``node`` and its ancestors (not the root) with a request's state; returns the count.

    Call it with the last node of a request's cached prefix once the request is inserted: the
    whole path now waits for that conversation's next turn, so it takes that request's state.
    """
    tagged = 0
    while node is not None and node.parent is not None:
        setattr(node, INTENT_ATTR, intent)
        setattr(node, TURN_ATTR, turn)
        tagged += 1
        node = node.parent
    return tagged


class IACStrategy:
    """An SGLang ``EvictionStrategy``: ``get_priority(node) -> (recency, p_continue, size)``.

    ``table``: a ``TableClient`` (its current index is read on every call, so a refreshed
    table applies from the next eviction) or a fixed :class:`PriorityIndex`. ``clock`` must be
    the clock of ``time_attr`` (SGLang: ``time.monotonic``).
    """

    def __init__(
        self,
        table: HasIndex | PriorityIndex,
        *,
        clock: Callable[[], float] = time.monotonic,
        time_attr: str = "last_access_time",
        state_of: Callable[[Any], tuple[Any, int]] = _tag_state,
    ) -> None:
        self._table: HasIndex = _Fixed(table) if isinstance(table, PriorityIndex) else table
        self._clock = clock
        self._time_attr = time_attr
        self._state_of = state_of

    def get_priority(self, node: Any, now_time: float | None = None) -> Priority:
        """The node's IAC sort key at ``now_time`` (default: now); lowest is evicted first."""
        intent, turn = self._state_of(node)
        now = self._clock() if now_time is None else now_time
        age_s = now - getattr(node, self._time_attr)
        return self._table.index.priority(intent, turn, age_s, len(node.value))


def install(radix_cache: Any, table: HasIndex | PriorityIndex, **options: Any) -> IACStrategy:
    """Make a live SGLang ``RadixCache`` evict by IAC; returns the strategy.

    Replaces ``radix_cache.eviction_strategy``; where SGLang is importable the strategy is
    also registered as a virtual subclass of its ``EvictionStrategy``.
    """
    try:
        from sglang.srt.mem_cache.evict_policy import EvictionStrategy
    except ImportError:
        pass
    else:
        EvictionStrategy.register(IACStrategy)
    strategy = IACStrategy(table, **options)
    radix_cache.eviction_strategy = strategy
    return strategy
