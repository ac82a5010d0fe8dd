"""The values of the table states a cache's entries are tagged with, one object per state,
shared by every entry of that state, for both adapters (the SGLang strategy's tags, the vLLM
queue's state lists).

The table is looked up once per state and table version, never per entry: a request's state
is resolved to its :class:`StateValues` once (a dict lookup per request after the first), and
when the live table changes every state takes the new table's values at the next use, so
entries tagged before a refresh rank by the refreshed table.

Requests choose their intents, so memory must not depend on them: past ``max_states``
states, a state the table does not list shares the defaults' values (``state`` None), and at
most ``max_requested`` requested ``(intent, turn)`` pairs are remembered per table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from kvcast.exporters.kit.adapters.request_state import HasIndex
from kvcast.exporters.kit.index import PriorityIndex

__all__ = ["MAX_REQUESTED", "MAX_STATES", "StateCache", "StateValues"]

MAX_STATES = 4_096  # states valued per cache; the table's own states always get theirs
MAX_REQUESTED = 65_536  # (intent, turn) pairs as requested, remembered per table


class StateValues:
    """One state's values in the table in use: the median reuse delay (s) and
    ``P(t+1 | i, t)`` (``iac``), the density per age bucket and, per bucket, the next bucket of
    a lower value (``density``)."""

    __slots__ = ("curve", "drop", "median_s", "p", "state")

    def __init__(self, state: tuple[str, int] | None) -> None:
        self.state = state  # None: the table's defaults (an unlisted state past the bound)
        self.median_s = 0.0
        self.p = 0.0
        self.curve: list[float] = []  # density per age bucket (policy density only)
        self.drop: list[int] = []  # per bucket, the next bucket of a lower value (density)

    def revalue(self, index: PriorityIndex, density: bool) -> None:
        """Take this state's values in ``index`` (capping and defaults as the index's)."""
        if self.state is None:
            self.median_s, self.p = index.default_median_s, index.default_p
            curve = index.default_curve() if density else None
        else:
            self.median_s, self.p = index.state(*self.state)
            curve = index.curve(*self.state) if density else None
        if curve is not None:
            self.curve, self.drop = curve.values, curve.drops()


V = TypeVar("V", bound=StateValues)


class StateCache(Generic[V]):
    """``(intent, turn)`` -> the :class:`StateValues` of its state in the live table.

    ``table``: what the adapter ranks by (its ``.index`` is read at each use). ``make``: builds
    the object of a new state (a :class:`StateValues` subclass: the vLLM queue's state lists
    are); ``added``: called with each new object once it is valued; ``changed``: called once the
    table changed and every object took its new values. ``max_states``, ``max_requested``: the
    bounds (default :data:`MAX_STATES`, :data:`MAX_REQUESTED`). Not thread-safe (both engines
    evict on one thread).
    """

    __slots__ = (
        "_added",
        "_changed",
        "_density",
        "_make",
        "_requested",
        "_states",
        "index",
        "max_requested",
        "max_states",
        "table",
    )

    def __init__(
        self,
        table: HasIndex,
        make: Callable[[tuple[str, int] | None], V],
        *,
        density: bool,
        added: Callable[[V], None] | None = None,
        changed: Callable[[], None] | None = None,
        max_states: int | None = None,
        max_requested: int | None = None,
    ) -> None:
        self.table = table
        self._make, self._density = make, density
        self._added, self._changed = added, changed
        self.max_states = MAX_STATES if max_states is None else max_states
        self.max_requested = MAX_REQUESTED if max_requested is None else max_requested
        self.index: PriorityIndex | None = None  # the table the objects' values come from
        self._states: dict[tuple[str, int] | None, V] = {}
        self._requested: dict[tuple[str, int], V] = {}

    def __len__(self) -> int:
        return len(self._states)

    def __iter__(self) -> Iterator[V]:
        return iter(self._states.values())

    def states(self) -> dict[tuple[str, int] | None, V]:
        """A copy of the states valued so far (None: the defaults' shared object)."""
        return dict(self._states)

    def get(self, intent: str, turn: int) -> V:
        """The object of a request's state: turns above the table's ``max_turn`` share its
        state; one dict lookup once the pair was seen with this table."""
        if self.table.index is self.index:
            found = self._requested.get((intent, turn))
            if found is not None:
                return found
        index = self.sync()
        found = self._requested.get((intent, turn))
        if found is not None:
            return found
        state: tuple[str, int] | None = (intent, min(turn, index.max_turn))
        found = self._states.get(state)
        if found is None:
            if len(self._states) >= self.max_states and not index.listed(*state):
                state = None
                found = self._states.get(state)
            if found is None:
                found = self._states[state] = self._make(state)
                found.revalue(index, self._density)
                if self._added is not None:
                    self._added(found)
        if len(self._requested) < self.max_requested:
            self._requested[(intent, turn)] = found
        return found

    def sync(self) -> PriorityIndex:
        """The table now; when it changed, every state takes its new values."""
        index = self.table.index
        if index is not self.index:
            self.index = index
            self._requested.clear()
            for found in self._states.values():
                found.revalue(index, self._density)
            if self._changed is not None:
                self._changed()
        return index
