"""Mean-field LRU characteristic time and hit ratio (SPEC section 4; mean-field paper C.2).

Units: rates per second, times in seconds, sizes in KV blocks.

Every estimator reduces to one form. With per-instance arrival rate ``lam``, mean final-turn
block count ``E_B``, mean ``sum_j R_j`` ``A_R``, ``L`` conversations, and revisit samples k with
delay ``W_k``, move weight ``w_k`` (blocks moved to MRU) and hit weight ``v_k`` (blocks reused)::

    d(T) = lam * E_B * T + (lam / L) * sum_k w_k * min(W_k, T)      # displacement, blocks
    d(T_C) = N                                                      # characteristic time
    h(T) = sum_k v_k * 1[W_k <= T] / (L * A_R)                      # hit ratio

``EmpiricalModel`` solves it exactly (d is piecewise linear). ``ParametricModel`` is the
single-class form with a parametric F, solved with Brent's method.

Tagged-conversation size (finite-size refinement, ``tagged_blocks``): in Algorithm 1 the
revisited conversation's own ``R_k`` resident blocks count against N, so it is evicted once the
content touched since its last visit exceeds ``N - R_k``: revisit k hits iff
``d(W_k) + R_k <= N`` (the plain form is ``d(W_k) <= N``; the two agree as N grows).
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import brentq

from kvcast.stats.delays import DelayDistribution, Empirical

_EPS = np.finfo(np.float64).eps


class HitRatioModel(Protocol):
    """A capacity -> (characteristic time, hit ratio) map for one workload and rate."""

    @property
    def upper_bound(self) -> float: ...

    def characteristic_time(self, capacity: ArrayLike) -> NDArray[np.float64]: ...

    def hit_ratio_at_time(self, t: ArrayLike) -> NDArray[np.float64]: ...

    def curve(self, capacity: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]: ...

    def required_capacity(self, target: float) -> float | None: ...


def _check_scalar(name: str, value: float, *, positive: bool = False) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        sign = "> 0" if positive else ">= 0"
        raise ValueError(f"{name} must be a finite number {sign}, got {value}")
    return value


class EmpiricalModel:
    """Exact solver of the generic form over revisit samples (see module docstring).

    Build once (sort, O(n log n)); every query is a vectorised ``searchsorted``.
    ``L * A_R`` normalises h; with ``L * A_R == 0`` the hit ratio is 0. ``tagged_blocks``
    (R_k per revisit, blocks) turns on the tagged-size condition ``d(W_k) + R_k <= N``.
    """

    def __init__(
        self,
        delays_s: ArrayLike,
        move_blocks: ArrayLike,
        hit_blocks: ArrayLike,
        *,
        lam: float,
        E_B: float,
        A_R: float,
        L: float,
        tagged_blocks: ArrayLike | None = None,
    ) -> None:
        W = np.asarray(delays_s, dtype=np.float64).ravel()
        w = np.broadcast_to(np.asarray(move_blocks, dtype=np.float64), W.shape)
        v = np.broadcast_to(np.asarray(hit_blocks, dtype=np.float64), W.shape)
        for name, arr in (("delays", W), ("move weights", w), ("hit weights", v)):
            if arr.size and (not np.all(np.isfinite(arr)) or arr.min() < 0):
                raise ValueError(f"{name} must be finite and non-negative")
        self.lam = _check_scalar("lam", lam)
        self.E_B = _check_scalar("E_B", E_B)
        self.A_R = _check_scalar("A_R", A_R)
        self.L = _check_scalar("L", L)
        self.n_samples = int(W.size)

        order = np.argsort(W, kind="stable")
        Ws, ws, vs = W[order], w[order], v[order]
        # Group equal delays so that the breakpoints are strictly increasing.
        starts = np.flatnonzero(np.concatenate(([True], Ws[1:] != Ws[:-1]))) if Ws.size else []
        Wu = Ws[starts] if Ws.size else np.empty(0)
        wu = np.add.reduceat(ws, starts) if Ws.size else np.empty(0)
        vu = np.add.reduceat(vs, starts) if Ws.size else np.empty(0)
        self.breakpoints_s: NDArray[np.float64] = Wu

        a = self.lam / self.L if self.L > 0 else 0.0
        cw = np.concatenate(([0.0], np.cumsum(wu)))  # move weight of the first k groups
        cwW = np.concatenate(([0.0], np.cumsum(wu * Wu)))
        remaining = cw[-1] - cw  # move weight still beyond the k-th breakpoint
        # On segment k (T between breakpoint k-1 and k): d(T) = intercept[k] + slope[k] * T.
        self._slope = self.lam * self.E_B + a * remaining
        self._intercept = a * cwW
        d_at = self._intercept[1:] + self._slope[1:] * Wu
        self._d_at: NDArray[np.float64] = np.maximum.accumulate(d_at) if d_at.size else d_at
        norm = self.L * self.A_R
        cv = np.concatenate(([0.0], np.cumsum(vu)))
        self._hcum: NDArray[np.float64] = cv / norm if norm > 0 else np.zeros_like(cv)
        self._lo = np.concatenate(([0.0], Wu))
        self._hi = np.concatenate((Wu, [np.inf]))
        self.tagged = tagged_blocks is not None
        if self.tagged:
            r = np.broadcast_to(np.asarray(tagged_blocks, dtype=np.float64), W.shape)
            if r.size and (not np.all(np.isfinite(r)) or r.min() < 0):
                raise ValueError("tagged blocks must be finite and non-negative")
            # Revisit k hits iff N >= key_k = d(W_k) + R_k: h(N) is a step function of N.
            key = self.displacement(W) + r
            korder = np.argsort(key, kind="stable")
            self._keys: NDArray[np.float64] = key[korder]
            ck = np.concatenate(([0.0], np.cumsum(v[korder])))
            self._hkeys: NDArray[np.float64] = ck / norm if norm > 0 else np.zeros_like(ck)

    @property
    def upper_bound(self) -> float:
        """h as T -> infinity: sum v / (L * A_R)."""
        return float(self._hcum[-1])

    def displacement(self, t: ArrayLike) -> NDArray[np.float64]:
        """d(T) in blocks."""
        t = np.maximum(np.asarray(t, dtype=np.float64), 0.0)
        k = np.searchsorted(self.breakpoints_s, t, side="right")
        return self._intercept[k] + self._slope[k] * t

    def _segment(self, capacity: NDArray[np.float64]) -> NDArray[np.intp]:
        return np.searchsorted(self._d_at, capacity, side="right")

    def characteristic_time(self, capacity: ArrayLike) -> NDArray[np.float64]:
        """Smallest T_C (s) with d(T_C) = N; inf where the cache never fills (d stays below N)."""
        n = np.asarray(capacity, dtype=np.float64)
        k = np.searchsorted(self._d_at, n, side="left")  # breakpoints with d < N
        slope = self._slope[k]
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(slope > 0, (n - self._intercept[k]) / slope, np.inf)
        return np.clip(t, self._lo[k], self._hi[k])

    def hit_ratio_at_time(self, t: ArrayLike) -> NDArray[np.float64]:
        """h(T) = sum_k v_k 1[W_k <= T] / (L A_R)."""
        k = np.searchsorted(self.breakpoints_s, np.asarray(t, dtype=np.float64), side="right")
        return self._hcum[k]

    def hit_ratio(self, capacity: ArrayLike) -> NDArray[np.float64]:
        """h at capacity N: the samples whose d(W_k) <= N (tagged: + R_k) are still resident."""
        n = np.asarray(capacity, dtype=np.float64)
        if self.tagged:
            return self._hkeys[np.searchsorted(self._keys, n, side="right")]
        return self._hcum[self._segment(n)]

    def curve(self, capacity: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(T_C, h) for every capacity N (vectorised)."""
        n = np.asarray(capacity, dtype=np.float64)
        return self.characteristic_time(n), self.hit_ratio(n)

    def required_capacity(self, target: float) -> float | None:
        """Smallest N (blocks) with h(N) >= target; None when target > upper_bound.

        h is a step function: find the breakpoint where the cumulative hit weight crosses the
        target; N is d at that breakpoint. A target equal to the ceiling is reachable here
        (the empirical F reaches 1 at the largest delay).
        """
        if target <= 0:
            return 0.0
        cum, at = (self._hkeys, self._keys) if self.tagged else (self._hcum, self._d_at)
        j = int(np.searchsorted(cum, target, side="left"))
        if j >= cum.size:
            return None
        return 0.0 if j == 0 else float(at[j - 1])


class ParametricModel:
    """Single class with a distribution F (SPEC section 4, the paper's estimator)::

    d(T) = lam * E_B * T + lam * A_move * int_0^T (1 - F),  h = A_hit / A_R * F(T_C)

    ``A_move`` is A_H_hash in the paper (A_H to count what Algorithm 1 moves).
    """

    def __init__(
        self,
        delay: DelayDistribution,
        *,
        lam: float,
        E_B: float,
        A_R: float,
        A_move: float,
        A_hit: float,
    ) -> None:
        self.delay = delay
        self.lam = _check_scalar("lam", lam)
        self.E_B = _check_scalar("E_B", E_B)
        self.A_R = _check_scalar("A_R", A_R)
        self.A_move = _check_scalar("A_move", A_move)
        self.A_hit = _check_scalar("A_hit", A_hit)

    @property
    def upper_bound(self) -> float:
        return self.A_hit / self.A_R if self.A_R > 0 else 0.0

    def displacement(self, t: ArrayLike) -> NDArray[np.float64]:
        t = np.asarray(t, dtype=np.float64)
        return self.lam * (self.E_B * t + self.A_move * self.delay.tail_integral(t))

    def _solve_one(self, n: float) -> float:
        if n <= 0:
            return 0.0
        rate = self.lam * (self.E_B + self.A_move)
        if rate <= 0:
            return math.inf

        def f(t: float) -> float:
            return float(self.displacement(t)) - n

        lo = hi = n / rate  # d(T) <= rate * T, so T_C >= n / rate
        for _ in range(200):
            if f(hi) >= 0:
                break
            lo, hi = hi, hi * 2.0
        else:
            return math.inf  # E_B == 0 and the history alone never fills N
        if f(lo) >= 0:
            return lo
        return float(brentq(f, lo, hi, xtol=1e-12, rtol=4 * _EPS, maxiter=500))

    def characteristic_time(self, capacity: ArrayLike) -> NDArray[np.float64]:
        n = np.asarray(capacity, dtype=np.float64)
        return np.vectorize(self._solve_one, otypes=[np.float64])(n)

    def hit_ratio_at_time(self, t: ArrayLike) -> NDArray[np.float64]:
        t = np.asarray(t, dtype=np.float64)
        f = np.where(np.isinf(t), 1.0, self.delay.cdf(np.where(np.isinf(t), 0.0, t)))
        return self.upper_bound * f

    def hit_ratio(self, capacity: ArrayLike) -> NDArray[np.float64]:
        return self.hit_ratio_at_time(self.characteristic_time(capacity))

    def curve(self, capacity: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        t = self.characteristic_time(capacity)
        return t, self.hit_ratio_at_time(t)

    def required_capacity(self, target: float) -> float | None:
        """N = d(F^-1(target / upper_bound)), exact; None when target >= upper_bound."""
        if target <= 0:
            return 0.0
        if target >= self.upper_bound:
            return None
        t = float(self.delay.ppf(target / self.upper_bound))
        return float(self.displacement(t)) if math.isfinite(t) else None


def single_class_model(
    delay: DelayDistribution,
    *,
    lam: float,
    E_B: float,
    A_R: float,
    A_move: float,
    A_hit: float,
) -> HitRatioModel:
    """Single-class model: exact ``EmpiricalModel`` for an empirical F, Brent otherwise."""
    if isinstance(delay, Empirical):
        n = delay.n
        return EmpiricalModel(
            delay.samples, A_move / n, A_hit / n, lam=lam, E_B=E_B, A_R=A_R, L=1.0
        )
    return ParametricModel(delay, lam=lam, E_B=E_B, A_R=A_R, A_move=A_move, A_hit=A_hit)
