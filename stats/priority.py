"""The priority table (SPEC section 5): its JSON form, its Redis key, its index and the IAC
eviction priority over it (pure dictionary work). Engines read it through
``kvcast.exporters.client``; the daemon builds it with :func:`table_document`.

A :class:`PriorityIndex` is built once per table version and never changes afterwards, so
readers on any thread can use it without a lock while a refresher builds the next one.

Ordering rule: ``priority(intent, turn, age_s, size_tokens)`` is the tuple
``(1 if age_s < M(i, t) else 0, P(t+1 | i, t), size_tokens)``; candidates are compared
lexicographically and the **lowest tuple is evicted first**: first whatever is past its
state's median reuse delay, among those the least likely to continue, then the smallest.

State lookup: turns above ``max_turn`` (the daemon's ``--max-turn``, 32 unless the table
says otherwise) use the state ``max_turn``, exactly as the daemon counts them. A state the
table does not list, an unknown intent, or an index built without a table gets the table's
defaults (``P = 0.5``, ``M = 150 s``). An intent's highest *listed* turn below ``max_turn``
is not used for deeper turns: its ``P`` is 0 by construction (no conversation of the window
went further), which would evict a conversation that evidently did go further first.

This module imports only the standard library (the engine-side client imports it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvcast.stats.config import StatsConfig
    from kvcast.stats.snapshot import Snapshot

__all__ = [
    "DEFAULT_MAX_TURN",
    "DEFAULT_MEDIAN_REUSE_S",
    "DEFAULT_P_CONTINUE",
    "Priority",
    "PriorityIndex",
    "TableError",
    "redis_table_key",
    "table_content_changed",
    "table_document",
]

DEFAULT_P_CONTINUE = 0.5
DEFAULT_MEDIAN_REUSE_S = 150.0  # seconds
DEFAULT_MAX_TURN = 32  # the daemon's default --max-turn

Priority = tuple[int, float, float]  # (recency bit, P(t+1 | i, t), size in tokens)


def redis_table_key(namespace: str) -> str:
    """The one Redis key the table is published under (a single SET: never half a table)."""
    return f"{namespace}:{{{namespace}}}:table"


def table_document(snapshot: Snapshot, config: StatsConfig, version: int) -> dict[str, Any]:
    """The versioned table: one entry per observed (intent, turn) state, defaults filled in."""
    return {
        "version": version,
        "generated_at": snapshot.generated_at,
        "window_conversations": snapshot.window_conversations,
        # Turns above it share its state: clients cap a node's turn here before looking it up.
        "max_turn": config.max_turn,
        "defaults": {
            "p_continue": config.default_p_continue,
            "median_reuse_s": config.default_median_reuse_s,
        },
        "states": [state.to_dict() for state in snapshot.states],
    }


def table_content_changed(previous: dict[str, Any] | None, current: dict[str, Any]) -> bool:
    """Whether the table's content (everything but version and time stamp) differs."""
    if previous is None:
        return True
    ignore = {"version", "generated_at"}
    return any(previous.get(k) != v for k, v in current.items() if k not in ignore)


class TableError(ValueError):
    """A table document that does not follow SPEC section 5."""


def _probability(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TableError(f"{where}: p_continue must be a number, got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise TableError(f"{where}: p_continue must be in [0, 1], got {value!r}")
    return float(value)


def _median(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TableError(f"{where}: median_reuse_s must be a number, got {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise TableError(f"{where}: median_reuse_s must be finite and > 0, got {value!r}")
    return float(value)


def _turn(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TableError(f"{where}: turn must be an int >= 1, got {value!r}")
    return value


class PriorityIndex:
    """An immutable lookup ``(intent, turn) -> (median reuse delay s, P(t+1 | i, t))``.

    >>> index = PriorityIndex({"version": 3, "defaults": {"p_continue": 0.5,
    ...     "median_reuse_s": 150.0}, "states": [{"intent": "coding", "turn": 1,
    ...     "p_continue": 0.8, "median_reuse_s": 60.0}]})
    >>> index.priority("coding", 1, age_s=10.0, size_tokens=512)
    (1, 0.8, 512)
    >>> index.priority("coding", 1, age_s=90.0, size_tokens=512)  # past its median: evict first
    (0, 0.8, 512)
    >>> index.priority("travel", 4, age_s=10.0, size_tokens=512)  # unlisted: the defaults
    (1, 0.5, 512)
    """

    __slots__ = (
        "_default",
        "_states",
        "default_median_s",
        "default_p",
        "document",
        "generated_at",
        "max_turn",
        "version",
    )

    def __init__(
        self, document: Mapping[str, Any] | None = None, max_turn: int | None = None
    ) -> None:
        """Validate ``document`` (None: defaults only) and precompute the lookup dict.

        ``max_turn``: the daemon's state cap; default: the document's ``max_turn`` key if it
        has one, else 32. Raises :class:`TableError` on a malformed document.
        """
        doc: Mapping[str, Any] = document if document is not None else {}
        if not isinstance(doc, Mapping):
            raise TableError(f"table must be a JSON object, got {type(doc).__name__}")
        version = doc.get("version")
        if document is not None and (isinstance(version, bool) or not isinstance(version, int)):
            raise TableError(f"version must be an int, got {version!r}")
        defaults = doc.get("defaults") or {}
        if not isinstance(defaults, Mapping):
            raise TableError("defaults must be an object")
        self.default_p = _probability(defaults.get("p_continue", DEFAULT_P_CONTINUE), "defaults")
        self.default_median_s = _median(
            defaults.get("median_reuse_s", DEFAULT_MEDIAN_REUSE_S), "defaults"
        )
        cap = max_turn if max_turn is not None else doc.get("max_turn", DEFAULT_MAX_TURN)
        self.max_turn = _turn(cap, "max_turn")
        states = doc.get("states", [])
        if not isinstance(states, Sequence) or isinstance(states, (str, bytes)):
            raise TableError("states must be a list")
        lookup: dict[tuple[str, int], tuple[float, float]] = {}
        for position, row in enumerate(states):
            where = f"states[{position}]"
            if not isinstance(row, Mapping):
                raise TableError(f"{where} must be an object")
            intent = row.get("intent")
            if not isinstance(intent, str):
                raise TableError(f"{where}: intent must be a string, got {intent!r}")
            turn = _turn(row.get("turn"), where)
            lookup[(intent, turn)] = (
                _median(row.get("median_reuse_s"), where),
                _probability(row.get("p_continue"), where),
            )
        self._states = lookup
        self._default = (self.default_median_s, self.default_p)
        self.version: int | None = version if document is not None else None
        self.generated_at: float | None = doc.get("generated_at")
        self.document: Mapping[str, Any] | None = document

    def __len__(self) -> int:
        return len(self._states)

    def __repr__(self) -> str:
        return f"PriorityIndex(version={self.version}, states={len(self._states)})"

    def state(self, intent: str, turn: int) -> tuple[float, float]:
        """``(median reuse delay s, P(t+1 | i, t))`` of a state, capping and defaults applied."""
        found = self._states.get((intent, turn))
        if found is not None:
            return found
        if turn > self.max_turn:
            return self._states.get((intent, self.max_turn), self._default)
        return self._default

    def listed(self, intent: str, turn: int) -> bool:
        """Whether the table has a row for exactly this state (no capping, no defaults)."""
        return (intent, turn) in self._states

    def priority(self, intent: str, turn: int, age_s: float, size_tokens: float) -> Priority:
        """The IAC sort key of a cached node; lowest is evicted first (see the module doc).

        ``age_s``: seconds since the node was cached (or last used); ``size_tokens``: its
        cached tokens.
        """
        found = self._states.get((intent, turn))
        if found is None:
            found = self.state(intent, turn)
        return (1 if age_s < found[0] else 0, found[1], size_tokens)

    def rank(self, candidates: Iterable[tuple[str, int, float, float]]) -> list[int]:
        """Positions of ``(intent, turn, age_s, size_tokens)`` candidates, eviction order first.

        Equal priorities keep their input order (a stable sort).
        """
        get, state, keys = self._states.get, self.state, []
        for intent, turn, age_s, size in candidates:
            found = get((intent, turn)) or state(intent, turn)
            keys.append((1 if age_s < found[0] else 0, found[1], size))
        return sorted(range(len(keys)), key=keys.__getitem__)

    def states(self) -> dict[tuple[str, int], tuple[float, float]]:
        """A copy of the listed states: ``{(intent, turn): (median s, p)}``."""
        return dict(self._states)
