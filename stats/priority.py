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

This module imports only the standard library (the engine-side client imports it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from operator import getitem, mul, truediv
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvcast.stats.config import StatsConfig
    from kvcast.stats.snapshot import Snapshot

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
    "shared_rate",
    "smoothed_p",
    "table_content_changed",
    "table_document",
]

DEFAULT_P_CONTINUE = 0.5
DEFAULT_MEDIAN_REUSE_S = 150.0  # seconds
DEFAULT_MAX_TURN = 32  # the daemon's default --max-turn

Priority = tuple[int, float, float]  # (recency bit, P(t+1 | i, t), size in tokens)
DensityKey = tuple[float, float]  # (hit density per token, -age s)
POLICIES = ("iac", "density")
TC_DIGITS = 3  # significant digits of the published T_C: a table is republished when it
# changes, and T_C moves a little at every refresh without changing the ranking


# -- the density score ----------------------------------------------------------------------
# The ``density`` eviction priority: hit density of a cached block given its state and age.
#
# A block of state ``(i, t)`` (the intent and turn of the request that used it last), idle for
# ``a`` seconds, is reused when its conversation sends turn ``t + 1``. The table's model of that
# (SPEC section 3): the conversation continues with probability ``p = P(t+1 | i, t)`` and then
# after a delay ``W`` that is log-normal, ``log W ~ N(mu, sigma^2)`` (``F`` its CDF); so the time to
# reuse ``T`` has survival ``S(x) = 1 - p F(x)`` (``T = inf`` with probability ``1 - p``). With a
# horizon ``H`` (seconds; the forecast's characteristic time ``T_C``):
#
# - ``reuse_within(a)  = P(T <= a + H | T > a)   = p (F(a + H) - F(a)) / (1 - p F(a))``;
# - ``residency(a)     = E[min(T - a, H) | T > a] = integral_a^{a+H} S(x) dx / S(a)`` (seconds);
# - ``hit_density(a)   = reuse_within(a) / (residency(a) * size)``: expected hits per second of
#   the space the block holds over the horizon, per unit of size. ``S(a)`` cancels:
#   ``p (F(a + H) - F(a)) / (size * ((1 - p) H + p integral_a^{a+H} (1 - F)))``.
#
# ``integral_a^b (1 - F) = m(b) - m(a)`` with ``m(y) = E[min(W, y)] = y (1 - F(y)) +
# e^(mu + sigma^2/2) Phi((log y - mu - sigma^2) / sigma)``: closed form, a few ``erfc``. The
# derivation and the choices (horizon, smoothing of ``p``, defaults) are in ``docs/policies.md``.
#
# Engines need it per candidate in O(1): :class:`DensityCurve` holds a state's score on a fixed
# grid of ages (:data:`PER_OCTAVE` steps per doubling of ``1 + a``), computed once per state and
# table. The curve is made unimodal in age (non-decreasing up to its peak, non-increasing after:
# a running max before, a running min after), the peak at the latest at the 99th percentile of
# the state's delays, so a block that outlived its state's delays only ever loses priority. For
# p < 1 (every smoothed table p) the log-normal's score already has that shape and the envelope
# changes nothing; for p = 1 and narrow delays the reuse hazard would still rise there.
#
# Standard library only: the engine-side client imports it.

DEFAULT_SIGMA = 1.0  # log-seconds; a state without delays (the IAC paper's log-variance 1)
DEFAULT_HORIZON_S = 600.0  # a table without a characteristic time (no forecast yet)
# The shortest horizon (s). Below about the delays' scale the score turns into the reuse
# hazard at the block's age, which ranks a block just used below one a few seconds older and
# so evicts what was just reused, shared prefixes above all: on both tuning workloads a
# horizon under a minute loses to one of a minute at every capacity where T_C is that short
# (docs/policies.md).
MIN_HORIZON_S = 60.0
MIN_SIGMA = 0.05  # log-seconds: two equal delays fit sigma = 0; keep the law a density
PER_OCTAVE = 8  # age buckets per doubling of (1 + age s): steps of 9%
AGE_BUCKETS = PER_OCTAVE * 31  # up to 2^31 s of age; older ages share the last bucket
_SCALE = PER_OCTAVE / math.log(2.0)
_SQRT2 = math.sqrt(2.0)
_Z99 = 2.33  # the standard normal's 99th percentile


def _sf(x: float, mu: float, sigma: float) -> float:
    """``1 - F(x)`` of the log-normal, from erfc so the far tail keeps its digits."""
    if x <= 0.0:
        return 1.0
    return 0.5 * math.erfc((math.log(x) - mu) / (sigma * _SQRT2))


def _mass(a: float, b: float, mu: float, sigma: float) -> float:
    """``F(b) - F(a)``, ``a <= b``: from the tail on the side of the median they lie on, so
    neither a far-tail nor a near-zero probability is lost to ``1 - 1``."""
    if a > 0.0 and math.log(a) >= mu:
        return _sf(a, mu, sigma) - _sf(b, mu, sigma)
    return _cdf(b, mu, sigma) - _cdf(a, mu, sigma)


def _cdf(x: float, mu: float, sigma: float) -> float:
    """``F(x)`` of the log-normal, from erfc so the lower tail keeps its digits."""
    if x <= 0.0:
        return 0.0
    return 0.5 * math.erfc(-(math.log(x) - mu) / (sigma * _SQRT2))


def _upper(z: float) -> float:
    """``1 - Phi(z)``, the standard normal's upper tail."""
    return 0.5 * math.erfc(z / _SQRT2)


def _tail_integral(a: float, b: float, mu: float, sigma: float) -> float:
    """``integral_a^b (1 - F(x)) dx`` in seconds, ``0 <= a <= b``, closed form.

    ``m(b) - m(a)`` with ``m(y) = y S(y) + E[W; W <= y]``, rearranged so that no two large
    terms cancel where ``a`` is far in the tail: ``b S(b) - a S(a) + e^(mu + s^2/2)
    (Q(z_a) - Q(z_b))``, ``Q`` the upper normal tail, ``z_y = (log y - mu - s^2) / s``.
    """
    mean = math.exp(mu + 0.5 * sigma * sigma)
    s2 = sigma * sigma
    q_a = 1.0 if a <= 0.0 else _upper((math.log(a) - mu - s2) / sigma)
    q_b = _upper((math.log(b) - mu - s2) / sigma) if b > 0.0 else 1.0
    value = b * _sf(b, mu, sigma) - a * _sf(a, mu, sigma) + mean * (q_a - q_b)
    return min(max(value, 0.0), b - a)  # rounding must not leave [0, b - a]


def _checked(age_s: float, horizon_s: float, p: float, sigma: float) -> None:
    if not age_s >= 0.0:
        raise ValueError(f"age_s must be >= 0, got {age_s}")
    if not (horizon_s > 0.0 and math.isfinite(horizon_s)):
        raise ValueError(f"horizon_s must be finite and > 0, got {horizon_s}")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must lie in [0, 1], got {p}")
    if not sigma > 0.0:
        raise ValueError(f"sigma must be > 0, got {sigma}")


def reuse_within(age_s: float, horizon_s: float, p: float, mu: float, sigma: float) -> float:
    """``P(reuse in (a, a + H] | no reuse by a)``: a probability."""
    _checked(age_s, horizon_s, p, sigma)
    alive = 1.0 - p + p * _sf(age_s, mu, sigma)  # 1 - p F(a)
    reused = p * _mass(age_s, age_s + horizon_s, mu, sigma)
    return 0.0 if alive <= 0.0 else min(1.0, max(reused, 0.0) / alive)


def residency(age_s: float, horizon_s: float, p: float, mu: float, sigma: float) -> float:
    """``E[min(T - a, H) | T > a]``: seconds the block holds its space within the horizon."""
    _checked(age_s, horizon_s, p, sigma)
    alive = 1.0 - p + p * _sf(age_s, mu, sigma)
    if alive <= 0.0:
        return 0.0
    inside = (1.0 - p) * horizon_s + p * _tail_integral(age_s, age_s + horizon_s, mu, sigma)
    return min(horizon_s, inside / alive)


def hit_density(
    age_s: float, horizon_s: float, p: float, mu: float, sigma: float, size: float = 1.0
) -> float:
    """``reuse_within / (residency * size)``: hits per second per unit of size (1/s/size).

    Computed from the unconditioned integrals (``S(a)`` cancels), so it stays finite and
    accurate far into the tail; 0 where the state never continues (``p = 0``).
    """
    _checked(age_s, horizon_s, p, sigma)
    if not size > 0.0:
        raise ValueError(f"size must be > 0, got {size}")
    end = age_s + horizon_s
    reused = p * _mass(age_s, end, mu, sigma)
    held = (1.0 - p) * horizon_s + p * _tail_integral(age_s, end, mu, sigma)
    if held <= 0.0:
        return 0.0
    return max(reused, 0.0) / (held * size)


def smoothed_p(p_continue: float, conversations: int | None) -> float:
    """``P(t+1 | i, t)`` by Laplace's rule of succession over the state's conversations.

    A state whose few conversations all continued has ``p = 1``: the model would then say
    its blocks are never dead, however old; ``(k + 1) / (n + 2)`` keeps every state mortal
    and leaves well-observed states as they are. ``conversations`` None or 0: unchanged.
    """
    if not conversations:
        return p_continue
    return (p_continue * conversations + 1.0) / (conversations + 2.0)


def age_bucket(age_s: float) -> int:
    """The bucket of an age (s): ``floor(PER_OCTAVE * log2(1 + a))``, clipped to the grid."""
    if not age_s > 0.0:
        return 0
    k = int(math.log1p(age_s) * _SCALE)
    return k if k < AGE_BUCKETS else AGE_BUCKETS - 1


def bucket_age(k: int) -> float:
    """The age (s) a bucket is valued at: the geometric middle of its ``1 + a`` range."""
    return 2.0 ** ((k + 0.5) / PER_OCTAVE) - 1.0


def bucket_start(k: int) -> float:
    """The first age (s) of bucket ``k``; ``bucket_start(k + 1)`` is where its value changes."""
    return 2.0 ** (k / PER_OCTAVE) - 1.0


def _unimodal(values: Sequence[float], last_peak: int) -> list[float]:
    """Non-decreasing up to the maximum (at the latest at bucket ``last_peak``), non-increasing
    after it (a running max before, a running min after)."""
    out = list(values)
    peak = max(range(min(last_peak, len(out) - 1) + 1), key=out.__getitem__)
    for k in range(1, peak + 1):
        out[k] = max(out[k], out[k - 1])
    for k in range(peak + 1, len(out)):
        out[k] = min(out[k], out[k - 1])
    return out


def shared_rate(recent_uses: float, since_last_s: float, horizon_s: float) -> float:
    """Reuse rate (1/s) of a block that other conversations share, from its uses by another
    conversation than the one before: ``recent_uses`` is their count discounted by
    ``e^(-elapsed / H)`` up to the latest of them, ``since_last_s`` (s) the time since that
    one; the rate is ``recent_uses e^(-since_last / H) / H`` with ``since_last_s`` valued on
    the age grid (at its bucket's :func:`bucket_age`).

    A block that many conversations reuse (a system prompt, a tool set) is reused at a rate of
    its own, which its last user's state knows nothing of; for a Poisson stream of rate
    ``lambda`` the hit density is ``lambda`` itself (``P = 1 - e^(-lambda H)``, ``E = P /
    lambda``), so this rate adds to the state's density. Discounting over one horizon follows
    a rate that changes (a document that is read for a while and then never again).
    """
    if recent_uses <= 0.0:
        return 0.0
    return recent_uses * math.exp(-bucket_age(age_bucket(since_last_s)) / horizon_s) / horizon_s


class DensityCurve:
    """One state's hit density (per unit of size) on the age grid, for a horizon.

    ``values[k]`` is :func:`hit_density` at :func:`bucket_age` (k), made unimodal (module
    doc). ``at(age_s)`` is one ``log1p`` and one list index.
    """

    __slots__ = ("_changes", "horizon_s", "mu", "p", "sigma", "values")

    def __init__(self, p: float, mu: float, sigma: float, horizon_s: float) -> None:
        self.p, self.mu, self.sigma, self.horizon_s = p, mu, max(sigma, MIN_SIGMA), horizon_s
        raw = [hit_density(bucket_age(k), horizon_s, p, mu, self.sigma) for k in range(AGE_BUCKETS)]
        # Past the 99th percentile of the delays the value only falls (a state with p = 1 and
        # narrow delays would otherwise rank its blocks higher the longer they sit).
        self.values: list[float] = _unimodal(raw, age_bucket(math.exp(mu + _Z99 * self.sigma)))
        self._changes: list[int] | None = None

    def changes(self) -> list[int]:
        """For each bucket, the next bucket whose value differs (``AGE_BUCKETS``: none): when a
        cached block's key must be recomputed (built once per curve)."""
        found = self._changes
        if found is None:
            values, found = self.values, [AGE_BUCKETS] * len(self.values)
            for k in range(len(values) - 2, -1, -1):
                found[k] = k + 1 if values[k + 1] != values[k] else found[k + 1]
            self._changes = found
        return found

    def at(self, age_s: float) -> float:
        """Hit density (1/s per unit of size) of a block ``age_s`` seconds old."""
        return self.values[age_bucket(age_s)]

    def __repr__(self) -> str:
        return (
            f"DensityCurve(p={self.p:.3f}, mu={self.mu:.3f}, sigma={self.sigma:.3f}, "
            f"horizon_s={self.horizon_s:g})"
        )


def redis_table_key(namespace: str) -> str:
    """The one Redis key the table is published under (a single SET: never half a table)."""
    return f"{namespace}:{{{namespace}}}:table"


def table_document(
    snapshot: Snapshot,
    config: StatsConfig,
    version: int,
    characteristic_time_s: float | None = None,
) -> dict[str, Any]:
    """The versioned table: one entry per observed (intent, turn) state, defaults filled in.

    ``characteristic_time_s``: the live forecast's ``T_C`` (s), the ``density`` horizon
    (None: not known yet; engines then use :data:`~this module.DEFAULT_HORIZON_S`).
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
        "_states",
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
            laws[(intent, turn)] = _law(row, where, median, p, self._default_law[2])
        self._states = lookup
        self._laws = laws
        # Built on first use, per state (a few hundred erfc each); a race builds one twice.
        self._curves: dict[tuple[str, int] | None, DensityCurve] = {}
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
        adapters do), its age (s, >= 0) and optionally its size (default 1 each).

        The engine's hot path: no tuple per candidate, the loops run in C (``map``). Equal
        densities keep the input order, so pass candidates oldest first for the tie-break of
        :meth:`priority`.
        """
        buckets = map(int, map(mul, map(math.log1p, ages_s), repeat(_BUCKET_SCALE)))
        keys = list(map(getitem, curves, buckets))
        if sizes is not None:
            keys = list(map(truediv, keys, sizes))
        return sorted(range(len(keys)), key=keys.__getitem__)

    def _rank_density(self, candidates: Iterable[tuple[str, int, float, float]]) -> list[int]:
        get, curve, log1p = self._curves.get, self.curve, math.log1p
        scale, last = _BUCKET_SCALE, AGE_BUCKETS - 1
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

    def law(self, intent: str, turn: int) -> tuple[float, float, float]:
        """``(p, mu, sigma)`` the density of a state uses: ``p`` smoothed by its
        conversations, ``mu = log M(i, t)``, ``sigma`` of its delays or the defaults'."""
        found = self._laws.get((intent, turn))
        if found is None and turn > self.max_turn:
            found = self._laws.get((intent, self.max_turn))
        return found if found is not None else self._default_law

    def curve(self, intent: str, turn: int) -> DensityCurve:
        """The state's :class:`DensityCurve` over this table's horizon (capping and defaults
        as :meth:`state`; every unlisted state shares the defaults' curve)."""
        found = self._curves.get((intent, turn))
        if found is not None:
            return found
        key = (intent, turn)
        if key not in self._laws and turn > self.max_turn:
            key = (intent, self.max_turn)
        if key in self._laws:
            found = self._curves.get(key)
            if found is None:
                found = self._curves[key] = DensityCurve(*self._laws[key], self.horizon_s)
        else:
            found = self.default_curve()
        # Remember the (intent, turn) asked for, up to a bound: requests choose them.
        if len(self._curves) < _MAX_CURVES + len(self._laws):
            self._curves[(intent, turn)] = found
        return found

    def default_curve(self) -> DensityCurve:
        """The curve of every state the table does not list (the defaults' law)."""
        found = self._curves.get(None)
        if found is None:
            found = self._curves[None] = DensityCurve(*self._default_law, self.horizon_s)
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
            k = int(math.log1p(age_s) * _BUCKET_SCALE) if age_s > 0.0 else 0
            return (curve.values[k if k < AGE_BUCKETS else AGE_BUCKETS - 1] / size_tokens, -age_s)
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")


_BUCKET_SCALE = PER_OCTAVE / math.log(2.0)  # the age grid of age_bucket
_MAX_CURVES = 65_536  # unlisted (intent, turn) pairs remembered per table


def _law(
    row: Mapping[str, Any], where: str, median: float, p: float, default_sigma: float
) -> tuple[float, float, float]:
    """``(p, mu, sigma)`` of a table row for the density policy.

    ``mu = log median_reuse_s`` always, so that the density's median is Eq. 1's (which holds
    the defaults where the delays are too few); ``sigma`` is the row's where its ``mu`` is the
    one the median came from, else the defaults'. ``p`` is smoothed by the conversations.
    """
    mu = _optional_number(row.get("mu"), where, "mu")
    sigma = _optional_number(row.get("sigma"), where, "sigma")
    if sigma is not None and sigma < 0:
        raise TableError(f"{where}: sigma must be >= 0, got {sigma!r}")
    fitted = mu is not None and sigma is not None and abs(math.exp(mu) - median) <= 1e-6 * median
    conversations = row.get("conversations")
    n = conversations if isinstance(conversations, int) and conversations > 0 else None
    return (smoothed_p(p, n), math.log(median), sigma if fitted and sigma else default_sigma)
