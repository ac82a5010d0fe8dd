"""The ``density`` eviction priority: hit density of a cached block given its state and age.

Pure arithmetic on the standard library: the closed form of one state's score and its
:class:`DensityCurve` on the age grid (``kvcast.exporters.kit.ages``); the index
(``kvcast.exporters.kit.index``) builds one curve per table state, from the law
``kvcast.exporters.kit.laws`` reads off the state's row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvcast.exporters.kit.ages import AGE_BUCKETS, age_bucket, bucket_age

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
# grid of ages (``ages.PER_OCTAVE`` steps per doubling of ``1 + a``), computed once per state and
# table. The curve is made unimodal in age (non-decreasing up to its peak, non-increasing after:
# a running max before, a running min after), the peak at the latest at the 99th percentile of
# the state's delays, so a block that outlived its state's delays only ever loses priority. For
# p < 1 (every smoothed table p) the log-normal's score already has that shape and the envelope
# changes nothing; for p = 1 and narrow delays the reuse hazard would still rise there.

DEFAULT_SIGMA = 1.0  # log-seconds; a state without delays (the IAC paper's log-variance 1)
DEFAULT_HORIZON_S = 600.0  # a table without a characteristic time (no forecast yet)
# The shortest horizon (s). Below about the delays' scale the score turns into the reuse
# hazard at the block's age, which ranks a block just used below one a few seconds older and
# so evicts what was just reused, shared prefixes above all: on both tuning workloads a
# horizon under a minute loses to one of a minute at every capacity where T_C is that short
# (docs/policies.md).
MIN_HORIZON_S = 60.0
MIN_SIGMA = 0.05  # log-seconds: two equal delays fit sigma = 0; keep the law a density
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


def value_changes(values: Sequence[float]) -> list[int]:
    """For each bucket of a curve on the age grid, the next bucket whose value differs
    (``AGE_BUCKETS``: none)."""
    found = [AGE_BUCKETS] * len(values)
    for k in range(len(values) - 2, -1, -1):
        found[k] = k + 1 if values[k + 1] != values[k] else found[k + 1]
    return found


class DensityCurve:
    """One state's hit density (per unit of size) on the age grid, for a horizon.

    ``values[k]`` is :func:`hit_density` at :func:`bucket_age` (k), made unimodal (module
    doc). ``at(age_s)`` is one ``log1p`` and one list index.
    """

    __slots__ = ("_changes", "_drops", "horizon_s", "mu", "p", "sigma", "values")

    def __init__(self, p: float, mu: float, sigma: float, horizon_s: float) -> None:
        self.p, self.mu, self.sigma, self.horizon_s = p, mu, max(sigma, MIN_SIGMA), horizon_s
        raw = [hit_density(bucket_age(k), horizon_s, p, mu, self.sigma) for k in range(AGE_BUCKETS)]
        # Past the 99th percentile of the delays the value only falls (a state with p = 1 and
        # narrow delays would otherwise rank its blocks higher the longer they sit).
        self.values: list[float] = _unimodal(raw, age_bucket(math.exp(mu + _Z99 * self.sigma)))
        self._changes: list[int] | None = None
        self._drops: list[int] | None = None

    def changes(self) -> list[int]:
        """For each bucket, the next bucket whose value differs (``AGE_BUCKETS``: none): when a
        cached block's key must be recomputed (built once per curve)."""
        if self._changes is None:
            self._changes = value_changes(self.values)
        return self._changes

    def drops(self) -> list[int]:
        """For each bucket, the next bucket of a lower value (``AGE_BUCKETS``: none). Until then
        a block's value is at least the one it had: a key that only rises may be revalued
        lazily, when it reaches the front of a heap (built once per curve)."""
        found = self._drops
        if found is None:
            values, found = self.values, [AGE_BUCKETS] * len(self.values)
            waiting: list[int] = []  # buckets whose drop is not found yet, values non-decreasing
            for j, value in enumerate(values):
                while waiting and values[waiting[-1]] > value:
                    found[waiting.pop()] = j
                waiting.append(j)
            self._drops = found
        return found

    def at(self, age_s: float) -> float:
        """Hit density (1/s per unit of size) of a block ``age_s`` seconds old."""
        return self.values[age_bucket(age_s)]

    def __repr__(self) -> str:
        return (
            f"DensityCurve(p={self.p:.3f}, mu={self.mu:.3f}, sigma={self.sigma:.3f}, "
            f"horizon_s={self.horizon_s:g})"
        )
