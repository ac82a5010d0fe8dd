"""The index engines rank by: a priority table (SPEC section 5) read into an immutable
lookup, and the IAC and ``density`` eviction priorities over it (pure dictionary work).
Engines read the table through ``kvcast.exporters.kit.client``; the daemon writes it with
``kvcast.stats.table.table_document``.

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

Policies: ``iac`` is the tuple above (SPEC Eq. 1, exactly); ``density`` ranks by the hit
density of ``kvcast.exporters.kit.density`` (the probability of reuse within the horizon
given the state and the age, per second of expected residency and per unit of size), lowest
first, the horizon being the table's ``characteristic_time_s`` (the live forecast's ``T_C``),
each state's law read by ``kvcast.exporters.kit.laws``. Its key is ``(density, -age_s)``:
equal densities (the same state and age bucket) evict the older first.

This module imports only the standard library; the two density rankings of many candidates
(:mod:`kvcast.exporters.kit.ranking`) import numpy on first use where it is installed (the
bucket search and the sort) and run in pure Python where it is not, with the same result.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvcast.exporters.kit.ages import AGE_BUCKETS, BUCKET_SCALE
from kvcast.exporters.kit.checks import (
    TableError,
    checked_median,
    checked_optional,
    checked_p,
    checked_turn,
)
from kvcast.exporters.kit.density import (
    DEFAULT_HORIZON_S,
    DEFAULT_SIGMA,
    MIN_HORIZON_S,
    DensityCurve,
)
from kvcast.exporters.kit.laws import Law, fitted_sigma, pooled_law, row_law, shared_law
from kvcast.exporters.kit.ranking import FAST_MIN_TUPLES, rank_columns, rank_rows

__all__ = [
    "DEFAULT_MAX_TURN",
    "DEFAULT_MEDIAN_REUSE_S",
    "DEFAULT_P_CONTINUE",
    "POLICIES",
    "SHARED_INTENT",
    "DensityKey",
    "Priority",
    "PriorityIndex",
]

DEFAULT_P_CONTINUE = 0.5
DEFAULT_MEDIAN_REUSE_S = 150.0  # seconds
DEFAULT_MAX_TURN = 32  # the daemon's default --max-turn
# The pseudo-intent of a block that two or more conversations share (a system prompt, a tool
# set): under ``density`` it is valued by the table's ``shared`` law, not by its last user's
# state. Not a taxonomy name (a colon), so no request's own intent can take it.
SHARED_INTENT = "kvcast:shared"

Priority = tuple[int, float, float]  # (recency bit, P(t+1 | i, t), size in tokens)
DensityKey = tuple[float, float]  # (hit density per token, -age s)
POLICIES = ("iac", "density")


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
        "_curves",
        "_default",
        "_default_law",
        "_laws",
        "_shared_law",
        "_states",
        "_unlisted_law",
        "_values",
        "default_median_s",
        "default_p",
        "document",
        "generated_at",
        "horizon_s",
        "max_turn",
        "version",
    )

    def __init__(
        self,
        document: Mapping[str, Any] | None = None,
        max_turn: int | None = None,
        horizon_s: float | None = None,
    ) -> None:
        """Validate ``document`` (None: defaults only) and precompute the lookup dict.

        ``max_turn``: the daemon's state cap; default: the document's ``max_turn`` key if it
        has one, else 32. ``horizon_s``: density's horizon (s), used as given (an experiment's;
        default: the document's ``characteristic_time_s``, at least ``MIN_HORIZON_S``). Raises
        :class:`TableError` on a malformed document, ``ValueError`` on a horizon that is not a
        finite number > 0.
        """
        if horizon_s is not None and not (math.isfinite(horizon_s) and horizon_s > 0):
            raise ValueError(f"horizon_s must be a finite number of seconds > 0, got {horizon_s}")
        doc: Mapping[str, Any] = document if document is not None else {}
        if not isinstance(doc, Mapping):
            raise TableError(f"table must be a JSON object, got {type(doc).__name__}")
        version = doc.get("version")
        if document is not None and (isinstance(version, bool) or not isinstance(version, int)):
            raise TableError(f"version must be an int, got {version!r}")
        defaults = doc.get("defaults") or {}
        if not isinstance(defaults, Mapping):
            raise TableError("defaults must be an object")
        self.default_p = checked_p(defaults.get("p_continue", DEFAULT_P_CONTINUE), "defaults")
        self.default_median_s = checked_median(
            defaults.get("median_reuse_s", DEFAULT_MEDIAN_REUSE_S), "defaults"
        )
        default_sigma = checked_optional(defaults.get("sigma"), "defaults", "sigma", True)
        self._default_law = (
            self.default_p,
            math.log(self.default_median_s),
            default_sigma if default_sigma is not None else DEFAULT_SIGMA,
        )
        t_c = checked_optional(doc.get("characteristic_time_s"), "table", "characteristic_time_s")
        self.horizon_s = (
            float(horizon_s)
            if horizon_s is not None
            else max(t_c if t_c is not None and t_c > 0 else DEFAULT_HORIZON_S, MIN_HORIZON_S)
        )
        cap = max_turn if max_turn is not None else doc.get("max_turn", DEFAULT_MAX_TURN)
        self.max_turn = checked_turn(cap, "max_turn")
        states = doc.get("states", [])
        if not isinstance(states, Sequence) or isinstance(states, (str, bytes)):
            raise TableError("states must be a list")
        lookup: dict[tuple[str, int], tuple[float, float]] = {}
        laws: dict[tuple[str, int], Law] = {}
        continues: list[tuple[float, float]] = []  # (p, conversations): the unlisted law
        delays: list[tuple[float, float, float]] = []  # (mu, sigma, delays) of fitted rows
        for position, row in enumerate(states):
            where = f"states[{position}]"
            if not isinstance(row, Mapping):
                raise TableError(f"{where} must be an object")
            intent = row.get("intent")
            if not isinstance(intent, str):
                raise TableError(f"{where}: intent must be a string, got {intent!r}")
            turn = checked_turn(row.get("turn"), where)
            median = checked_median(row.get("median_reuse_s"), where)
            p = checked_p(row.get("p_continue"), where)
            lookup[(intent, turn)] = (median, p)
            law = laws[(intent, turn)] = row_law(row, where, median, p, self._default_law[2])
            n = row.get("conversations")
            n = n if isinstance(n, int) and n > 0 else 1
            continues.append((law[0], n))
            if fitted_sigma(row, where, median) is not None:
                delays.append((law[1], law[2], n * law[0]))
        self._states = lookup
        self._laws = laws
        # The density of a state the table does not list: its listed states pooled
        # (laws.pooled_law); the defaults only where it lists none.
        self._unlisted_law = pooled_law(continues, delays, self._default_law)
        self._shared_law = shared_law(doc.get("shared"), self._default_law[2])
        # Built on first use, per state (a few hundred erfc each); a race builds one twice.
        self._curves: dict[tuple[str, int] | None, DensityCurve] = {}
        self._values: dict[tuple[str, int], list[float]] = {}  # their values, for rank()
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

    def iac_priority(self, intent: str, turn: int, age_s: float, size_tokens: float) -> Priority:
        """The IAC sort key of a cached node; lowest is evicted first (see the module doc).

        ``age_s``: seconds since the node was cached (or last used); ``size_tokens``: its
        cached tokens.
        """
        found = self._states.get((intent, turn))
        if found is None:
            found = self.state(intent, turn)
        return (1 if age_s < found[0] else 0, found[1], size_tokens)

    def rank(
        self, candidates: Iterable[tuple[str, int, float, float]], policy: str = "iac"
    ) -> list[int]:
        """Positions of ``(intent, turn, age_s, size_tokens)`` candidates, eviction order first.

        Equal priorities keep their input order (a stable sort); under ``density`` equal
        densities go oldest first, as :meth:`priority` orders them.
        """
        if policy == "density":
            return self._rank_density(candidates)
        if policy != "iac":
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        get, state, keys = self._states.get, self.state, []
        for intent, turn, age_s, size in candidates:
            found = get((intent, turn)) or state(intent, turn)
            keys.append((1 if age_s < found[0] else 0, found[1], size))
        return sorted(range(len(keys)), key=keys.__getitem__)

    @staticmethod
    def rank_by_density(
        curves: Sequence[Sequence[float]],
        ages_s: Sequence[float],
        sizes: Sequence[float] | None = None,
    ) -> list[int]:
        """Positions of candidates in density eviction order, from columns: each candidate's
        curve values (``curve(intent, turn).values``, resolved once per request, as the
        adapters do), its age (s) and optionally its size (default 1 each).

        The key is ``curve[age_bucket(age)] / size``: ages at or below 0 (and NaN) take the
        first bucket, ages past the grid its last. Equal keys keep the input order (a stable
        sort), so pass candidates oldest first for the tie-break of :meth:`priority`.

        The engine's hot path: from 64 candidates up and where numpy is installed, the
        buckets (a search in the table of exact bucket starts), the division and the sort run
        in numpy; any input it cannot take exactly (a non-finite age or key, a zero size, a
        short column) goes the pure-Python way, which gives the same order or error.
        """
        return rank_columns(curves, ages_s, sizes)

    def _rank_density(self, candidates: Iterable[tuple[str, int, float, float]]) -> list[int]:
        rows = candidates if isinstance(candidates, (list, tuple)) else list(candidates)
        if len(rows) >= FAST_MIN_TUPLES:  # numpy's way where it can (None: it cannot)
            try:
                intents, turns, ages_s, sizes = zip(*rows, strict=True)
                values = list(map(self._values.get, zip(intents, turns, strict=True)))
                if not all(values):  # states not met yet: their curves (built, remembered)
                    for j in [j for j, found in enumerate(values) if found is None]:
                        values[j] = self._curve_values(intents[j], turns[j])
            except (TypeError, ValueError):
                pass  # the Python ranking raises what it must
            else:
                order = rank_rows(values, ages_s, sizes)
                if order is not None:
                    return order
        return self._rank_density_python(rows)

    def _curve_values(self, intent: str, turn: int) -> list[float]:
        """``curve(intent, turn).values``, remembered for :meth:`rank` up to the same bound."""
        values = self.curve(intent, turn).values
        if len(self._values) < _MAX_CURVES + len(self._laws):
            self._values[(intent, turn)] = values
        return values

    def _rank_density_python(
        self, candidates: Iterable[tuple[str, int, float, float]]
    ) -> list[int]:
        """The reference ranking (and the one without numpy): key ``(curve value at the
        age's bucket / size, -age)``, a stable sort."""
        get, curve, log1p = self._curves.get, self.curve, math.log1p
        scale, last = BUCKET_SCALE, AGE_BUCKETS - 1
        keys: list[tuple[float, float]] = []
        append = keys.append
        for intent, turn, age_s, size in candidates:
            found = get((intent, turn)) or curve(intent, turn)
            k = int(log1p(age_s) * scale) if age_s > 0.0 else 0
            append((found.values[k if k < last else last] / size, -age_s))
        return sorted(range(len(keys)), key=keys.__getitem__)

    def states(self) -> dict[tuple[str, int], tuple[float, float]]:
        """A copy of the listed states: ``{(intent, turn): (median s, p)}``."""
        return dict(self._states)

    # -- the density policy ------------------------------------------------------------------

    @property
    def has_shared(self) -> bool:
        """Whether the table carries the shared blocks' reuse law (its ``shared`` entry)."""
        return self._shared_law is not None

    def law(self, intent: str, turn: int) -> tuple[float, float, float]:
        """``(p, mu, sigma)`` the density of a state uses: ``p`` smoothed by its
        conversations, ``mu = log M(i, t)``, ``sigma`` of its delays or the defaults'.
        :data:`SHARED_INTENT` (any turn): the table's ``shared`` law. Else, and for a state it does
        not list: its listed states pooled (the defaults where it lists none)."""
        if intent == SHARED_INTENT:
            return self._shared_law or self._unlisted_law
        found = self._laws.get((intent, turn))
        if found is None and turn > self.max_turn:
            found = self._laws.get((intent, self.max_turn))
        return found if found is not None else self._unlisted_law

    def curve(self, intent: str, turn: int) -> DensityCurve:
        """The state's :class:`DensityCurve` over this table's horizon (capping and defaults
        as :meth:`state`; every unlisted state shares the defaults' curve;
        :data:`SHARED_INTENT` gets :meth:`shared_curve`)."""
        found = self._curves.get((intent, turn))
        if found is not None:
            return found
        found = self.shared_curve() if intent == SHARED_INTENT else self._state_curve(intent, turn)
        # Remember the (intent, turn) asked for, up to a bound: requests choose them.
        if len(self._curves) < _MAX_CURVES + len(self._laws):
            self._curves[(intent, turn)] = found
        return found

    def _state_curve(self, intent: str, turn: int) -> DensityCurve:
        key = (intent, turn)
        if key not in self._laws and turn > self.max_turn:
            key = (intent, self.max_turn)
        if key not in self._laws:
            return self.default_curve()
        found = self._curves.get(key)
        if found is None:
            found = self._curves[key] = DensityCurve(*self._laws[key], self.horizon_s)
        return found

    def shared_curve(self) -> DensityCurve:
        """The curve of a block that other conversations share (the table's ``shared`` law;
        the defaults' curve where the table has none)."""
        if self._shared_law is None:
            return self.default_curve()
        found = self._curves.get((SHARED_INTENT, 0))
        if found is None:
            found = self._curves[(SHARED_INTENT, 0)] = DensityCurve(
                *self._shared_law, self.horizon_s
            )
        return found

    def default_curve(self) -> DensityCurve:
        """The curve of every state the table does not list: its listed states' law pooled,
        the defaults' law where it lists none."""
        found = self._curves.get(None)
        if found is None:
            found = self._curves[None] = DensityCurve(*self._unlisted_law, self.horizon_s)
        return found

    def density(self, intent: str, turn: int, age_s: float, size_tokens: float = 1.0) -> float:
        """Hit density (1/s per token) of a cached node: the ``density`` policy's value."""
        return self.curve(intent, turn).at(age_s) / size_tokens

    def priority(
        self,
        intent: str,
        turn: int,
        age_s: float,
        size_tokens: float,
        policy: str = "iac",
    ) -> Priority | DensityKey:
        """The sort key of a cached node under ``policy``; lowest is evicted first.

        ``iac``: the tuple of SPEC Eq. 1 (module doc); ``density``: ``(hit density per token,
        -age_s)``. ``age_s``: seconds since the node was cached (or last used); ``size_tokens``:
        its cached tokens.
        """
        if policy == "iac":  # inlined: the hot path of Eq. 1 engines
            found = self._states.get((intent, turn))
            if found is None:
                found = self.state(intent, turn)
            return (1 if age_s < found[0] else 0, found[1], size_tokens)
        if policy == "density":
            curve = self._curves.get((intent, turn)) or self.curve(intent, turn)
            k = int(math.log1p(age_s) * BUCKET_SCALE) if age_s > 0.0 else 0
            return (curve.values[k if k < AGE_BUCKETS else AGE_BUCKETS - 1] / size_tokens, -age_s)
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")


_MAX_CURVES = 65_536  # unlisted (intent, turn) pairs remembered per table
