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

Policies: ``iac`` is the tuple above (SPEC Eq. 1, exactly); ``density`` ranks by the hit
density below (the probability of reuse within the horizon given the
state and the age, per second of expected residency and per unit of size), lowest first, the
horizon being the table's ``characteristic_time_s`` (the live forecast's ``T_C``). Its key is
``(density, -age_s)``: equal densities (the same state and age bucket) evict the older first.

This module imports only the standard library (the engine-side client imports it); the two
density rankings of many candidates (:mod:`kvcast.stats.ranking`) import numpy on first use
where it is installed (the bucket search and the sort) and run in pure Python where it is not,
with the same result.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kvcast.stats.density import (
    AGE_BUCKETS,
    DEFAULT_HORIZON_S,
    DEFAULT_SIGMA,
    MIN_HORIZON_S,
    PER_OCTAVE,
    DensityCurve,
    age_bucket,
    bucket_age,
    bucket_start,
    hit_density,
    pooled_law,
    residency,
    reuse_within,
    smoothed_p,
)
from kvcast.stats.ranking import BUCKET_SCALE, FAST_MIN_TUPLES, rank_columns, rank_rows
from kvcast.stats.store_url import table_key

if TYPE_CHECKING:
    from kvcast.stats.config import StatsConfig
    from kvcast.stats.snapshot import SharedReuse, Snapshot

__all__ = [
    "AGE_BUCKETS",
    "DEFAULT_HORIZON_S",
    "DEFAULT_MAX_TURN",
    "DEFAULT_MEDIAN_REUSE_S",
    "DEFAULT_P_CONTINUE",
    "DEFAULT_SIGMA",
    "MIN_HORIZON_S",
    "PER_OCTAVE",
    "POLICIES",
    "SHARED_INTENT",
    "DensityCurve",
    "Priority",
    "PriorityIndex",
    "TableError",
    "age_bucket",
    "bucket_age",
    "bucket_start",
    "hit_density",
    "redis_table_key",
    "residency",
    "reuse_within",
    "smoothed_p",
    "table_content_changed",
    "table_document",
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
TC_DIGITS = 3  # significant digits of the published T_C: a table is republished when it
# changes, and T_C moves a little at every refresh without changing the ranking


def redis_table_key(namespace: str) -> str:
    """The one Redis key the table is published under (a single SET: never half a table);
    the layout is :mod:`kvcast.stats.store_url`'s."""
    return table_key(namespace)


def table_document(
    snapshot: Snapshot,
    config: StatsConfig,
    version: int,
    characteristic_time_s: float | None = None,
    instances: int = 1,
) -> dict[str, Any]:
    """The versioned table: one entry per observed (intent, turn) state, defaults filled in.

    ``characteristic_time_s``: the live forecast's ``T_C`` (s), the ``density`` horizon
    (None: not known yet; engines then use :data:`~this module.DEFAULT_HORIZON_S`).
    ``instances``: engine instances behind session-affine routing; each sees the shared
    blocks' references ``instances`` times further apart (the ``shared`` row's gaps).
    """
    t_c = characteristic_time_s
    if t_c is not None and not (math.isfinite(t_c) and t_c > 0):
        t_c = None
    return {
        "version": version,
        "generated_at": snapshot.generated_at,
        "window_conversations": snapshot.window_conversations,
        # Turns above it share its state: clients cap a node's turn here before looking it up.
        "max_turn": config.max_turn,
        "defaults": {
            "p_continue": config.default_p_continue,
            "median_reuse_s": config.default_median_reuse_s,
        },  # (an optional "sigma", log-s, would replace DEFAULT_SIGMA for unfitted states)
        "characteristic_time_s": None if t_c is None else float(f"{t_c:.{TC_DIGITS}g}"),
        "states": [state.to_dict() for state in snapshot.states],
        "shared": _shared_row(snapshot.shared, config, instances),
    }


def _shared_row(shared: SharedReuse | None, config: StatsConfig, instances: int) -> Any:
    """The table's ``shared`` entry: the reuse law of blocks that two or more conversations
    share (a state of its own for the ``density`` policy), or None where the window saw none.

    ``p_continue``: the chance that a reference is followed by another; ``mu``, ``sigma``: the
    log-normal fit of the gaps (log s) as one of ``instances`` instances sees them (stretched
    by ``instances``, as the forecast's shared term does); ``median_reuse_s`` its median, or
    the default where fewer than ``min_delay_samples`` gaps were seen.
    """
    if shared is None:
        return None
    mu = None if shared.mu is None else shared.mu + math.log(max(instances, 1))
    fitted = shared.references >= config.min_delay_samples
    median = math.exp(mu) if fitted and mu is not None else config.default_median_reuse_s
    return {
        "p_continue": shared.p_continue,
        "median_reuse_s": median,
        "mu": mu,
        "sigma": shared.sigma,
        "references": shared.references,
        "lives": shared.lives,
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


def _optional_number(value: Any, where: str, name: str, positive: bool = False) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TableError(f"{where}: {name} must be a finite number or null, got {value!r}")
    if positive and not value > 0:
        raise TableError(f"{where}: {name} must be > 0, got {value!r}")
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
        default_sigma = _optional_number(defaults.get("sigma"), "defaults", "sigma", True)
        self._default_law = (
            self.default_p,
            math.log(self.default_median_s),
            default_sigma if default_sigma is not None else DEFAULT_SIGMA,
        )
        t_c = _optional_number(doc.get("characteristic_time_s"), "table", "characteristic_time_s")
        self.horizon_s = max(
            t_c if t_c is not None and t_c > 0 else DEFAULT_HORIZON_S, MIN_HORIZON_S
        )
        cap = max_turn if max_turn is not None else doc.get("max_turn", DEFAULT_MAX_TURN)
        self.max_turn = _turn(cap, "max_turn")
        states = doc.get("states", [])
        if not isinstance(states, Sequence) or isinstance(states, (str, bytes)):
            raise TableError("states must be a list")
        lookup: dict[tuple[str, int], tuple[float, float]] = {}
        laws: dict[tuple[str, int], tuple[float, float, float]] = {}
        continues: list[tuple[float, float]] = []  # (p, conversations): the unlisted law
        delays: list[tuple[float, float, float]] = []  # (mu, sigma, delays) of fitted rows
        for position, row in enumerate(states):
            where = f"states[{position}]"
            if not isinstance(row, Mapping):
                raise TableError(f"{where} must be an object")
            intent = row.get("intent")
            if not isinstance(intent, str):
                raise TableError(f"{where}: intent must be a string, got {intent!r}")
            turn = _turn(row.get("turn"), where)
            median = _median(row.get("median_reuse_s"), where)
            p = _probability(row.get("p_continue"), where)
            lookup[(intent, turn)] = (median, p)
            law = laws[(intent, turn)] = _law(row, where, median, p, self._default_law[2])
            n = row.get("conversations")
            n = n if isinstance(n, int) and n > 0 else 1
            continues.append((law[0], n))
            if _fitted(row, where, median) is not None:
                delays.append((law[1], law[2], n * law[0]))
        self._states = lookup
        self._laws = laws
        # The density of a state the table does not list: its listed states pooled
        # (stats.density.pooled_law); the defaults only where it lists none.
        self._unlisted_law = pooled_law(continues, delays, self._default_law)
        self._shared_law = _shared_law(doc.get("shared"), self._default_law[2])
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


def _shared_law(row: Any, default_sigma: float) -> tuple[float, float, float] | None:
    """``(p, mu, sigma)`` of the table's ``shared`` entry (None: absent or null), ``p``
    smoothed by the references and lives it was counted from."""
    if row is None:
        return None
    if not isinstance(row, Mapping):
        raise TableError(f"shared must be an object or null, got {type(row).__name__}")
    counts = []
    for name in ("references", "lives"):
        value = row.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TableError(f"shared: {name} must be an int >= 0, got {value!r}")
        counts.append(value)
    median = _median(row.get("median_reuse_s"), "shared")
    p = _probability(row.get("p_continue"), "shared")
    return _law({**row, "conversations": sum(counts)}, "shared", median, p, default_sigma)


def _law(
    row: Mapping[str, Any], where: str, median: float, p: float, default_sigma: float
) -> tuple[float, float, float]:
    """``(p, mu, sigma)`` of a table row for the density policy.

    ``mu = log median_reuse_s`` always, so that the density's median is Eq. 1's (which holds
    the defaults where the delays are too few); ``sigma`` is the row's where its ``mu`` is the
    one the median came from, else the defaults'. ``p`` is smoothed by the conversations.
    """
    sigma = _fitted(row, where, median)
    conversations = row.get("conversations")
    n = conversations if isinstance(conversations, int) and conversations > 0 else None
    return (smoothed_p(p, n), math.log(median), sigma if sigma else default_sigma)


def _fitted(row: Mapping[str, Any], where: str, median: float) -> float | None:
    """The row's ``sigma`` (log-s) where its ``mu`` is the one its median came from (a
    log-normal fitted to its delays), else None."""
    mu = _optional_number(row.get("mu"), where, "mu")
    sigma = _optional_number(row.get("sigma"), where, "sigma")
    if sigma is not None and sigma < 0:
        raise TableError(f"{where}: sigma must be >= 0, got {sigma!r}")
    fitted = mu is not None and sigma is not None and abs(math.exp(mu) - median) <= 1e-6 * median
    return sigma if fitted else None
