"""Finite-size refinement of the mean-field forecast: fluctuations of the displacement.

Units: blocks, seconds, conversations per second.

The mean-field forecast replaces ``D(W)``, the blocks of the other conversations touched in the
last W seconds (all of them ahead of a revisited conversation in LRU order), by its mean d(W).
Conversations arrive as a Poisson process and contribute independently, so ``D(W)`` is a
Poisson superposition: a conversation contributes ``R_j`` while within W of its j-th request,
and the variance is (Campbell's theorem)::

    v(W) = lam * (E[B^2] * W + (1 / L) * sum_k R_k^2 * min(W_k, W))

With the tagged size, revisit k hits iff ``D(W_k) + R_k <= N``; taking ``D`` Gaussian::

    h(N) = sum_k v_k * Phi((N - R_k - d(W_k)) / sqrt(v(W_k))) / (L * A_R)

``E[B^2]`` (final-turn blocks squared) is rebuilt from the per-turn revisit records, assuming a
turn's size does not depend on whether the conversation continues (exact for the generator).

**Partial residency** (``partial=True``, the ``partial`` refinement). The rule above is all or
nothing: a conversation's R_k blocks are resident only if all of them fit behind ``D``. A
block-level prefix cache evicts a chain's tail first (SGLang's radix tree evicts leaves; vLLM
frees a request's blocks tail first), so the conversation keeps the *prefix* that fits:
``clip(N - D, 0, R_k)`` blocks, of which it reuses at most ``v_k``. Where one context is a
sizeable fraction of the cache (agent traffic: contexts of 100+ K tokens against a cache of a
few of them) that prefix is most of what is hit, and the all-or-nothing rule forecasts 0 where
LRU hits. With ``X = N - D`` Gaussian of mean ``N - d(W_k)`` and variance ``v(W_k)``::

    E[min(v_k, X^+)] = G(N - d(W_k)) - G(N - d(W_k) - v_k),
    G(m) = m Phi(m / s) + s phi(m / s),  s = sqrt(v(W_k))

(``G(m) = E[(m + s Z)^+]``; ``G(m) - G(m - v)`` is the integral of ``Phi(x / s)`` over
``[m - v, m]``, so h is smooth and increasing in N), and ``h(N)`` is their sum over revisits
over ``L A_R``. For small contexts it reduces to the tagged rule with fluctuations, the
conversation's own size counted as half (``v_k Phi((N - d - v_k / 2) / s)`` to first order).

**Grouped revisits** (``partial`` on more than ``GROUP_MIN_REVISITS`` revisits). A curve point
costs a pass over the revisits; the sum is smooth in (d, s, v), so revisits close in all three
are summed as one: bins of ``log s`` (ratio ``1 + eps``; s is increasing in W, so these are
delay bins) and, inside one, of d and v (width ``eps`` times the bin's smallest s). Each group
is evaluated at its exact means of d, s and v, times its count, plus the second-order term of
each of its two G's from its exact second moments: with the exact means the first-order
terms cancel, so what is left is of third order in the bin's width. ``G(m, s)`` is jointly
convex (Hessian ``phi(z) / s * [[1, -z], [-z, z^2]]``, z = m / s): for each of the two sums
(over ``G(N - d)`` and ``G(N - d - v)``) both the true remainder and the second-order term lie
in ``[0, A S_mm + B S_ss]`` per group, with S the group's sums of squared deviations of the
position (d, or d + v) and of s, A the supremum of ``phi(z) / s`` and B of ``z^2 phi(z) / s``
over the group's box; h's error is at most the sum of the two over ``L A_R``
(``grouping_error_bound``, evaluated per capacity). That bound is loose (up to 0.024 on the
100,000 revisits of the speed test with eps = 1/4); the error itself is 1e-6 there (480
groups) and falls as eps^3 (7e-6 at eps = 1/2 on 227 groups; 9e-4 there without the
second-order terms). On drawn samples (``tests/stats/test_partial_grouping.py``) it stays
below 1e-4; eps = 1/2 reached 1.04e-4 on a narrow delay law (a few large groups spanning
sizes of 1-284 blocks against s of 90-150), 8e-6 at eps = 1/4.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import brentq
from scipy.special import ndtr

from kvcast.stats.meanfield import EmpiricalModel
from kvcast.stats.sample import WorkloadSample

_SQRT_2PI = float(np.sqrt(2.0 * np.pi))
# Capacities evaluated per chunk of the vectorised Phi sum (bounds memory to ~16 MB).
_CHUNK_CELLS = 2_000_000
# Partial on fewer revisits is summed exactly: 100 points cost a few ms there already.
GROUP_MIN_REVISITS = 4096
# Bin width of the grouped sum, in standard deviations of D (and the log-ratio of s bins);
# 1/2 missed 1e-4 on a drawn sample (module docstring).
GROUP_WIDTH = 0.25
_Z2PHI_MAX = float(2.0 * np.exp(-1.0) / _SQRT_2PI)  # max of z^2 phi(z), at z = sqrt(2)


def final_blocks_second_moment(sample: WorkloadSample) -> float:
    """Estimate E[B^2] (blocks^2) per conversation from the revisit records and ``sum_B``.

    Conversations of intent c that end at turn t (``C(t) - C(t+1)``, with ``C(t+1)`` the
    revisits leaving turn t) get the mean ``R_t^2`` of those revisits; those ending at a turn
    nobody left (the last seen) share the rest of ``sum_B`` evenly.
    """
    L = sample.conversations
    if L <= 0:
        return 0.0
    intent = np.asarray(sample.intent, dtype=np.intp)
    turn = np.asarray(sample.turn, dtype=np.intp)
    r = np.asarray(sample.prev_blocks, dtype=np.float64)
    total = 0.0
    for c, mom in enumerate(sample.by_intent):
        if mom.conversations <= 0:
            continue
        sel = intent == c
        t, rc = turn[sel], r[sel]
        size = int(t.max()) + 2 if t.size else 2
        left = np.bincount(t, minlength=size).astype(np.float64)  # revisits leaving turn t
        s1 = np.bincount(t, weights=rc, minlength=size)
        s2 = np.bincount(t, weights=rc * rc, minlength=size)
        reach = np.concatenate(([0.0, float(mom.conversations)], left[1:-1]))  # C(t), t >= 0
        ends = np.maximum(reach - left, 0.0)
        known = left > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            m1 = np.where(known, s1 / left, 0.0)
            m2 = np.where(known, s2 / left, 0.0)
        n_known = float(np.sum(ends[known]))
        sum_b = float(np.sum(ends * m1))
        total += float(np.sum(ends * m2))
        missing = mom.conversations - n_known
        if missing > 0:
            b = max(mom.sum_B - sum_b, 0.0) / missing
            total += missing * b * b
    return total / L


def _expected_excess(m: NDArray[np.float64], sd: NDArray[np.float64]) -> NDArray[np.float64]:
    """``G(m) = E[(m + sd Z)^+]`` elementwise (blocks), Z standard normal; ``max(m, 0)`` at sd 0."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = m / sd
        g = m * ndtr(z) + sd * np.exp(-0.5 * z * z) / _SQRT_2PI
    return np.where(sd > 0, g, np.maximum(m, 0.0))


def _phi(z: NDArray[np.float64]) -> NDArray[np.float64]:
    return np.exp(-0.5 * z * z) / _SQRT_2PI


def prefix_reused(
    m: NDArray[np.float64], sd: NDArray[np.float64], v: NDArray[np.float64]
) -> NDArray[np.float64]:
    """``E[min(v, (m + sd Z)^+)] = G(m) - G(m - v)`` (blocks), written as
    ``clip(m, 0, v) + sd (psi(|m| / sd) - psi(|m - v| / sd))`` with ``psi(z) = phi(z) - z
    Phi(-z)``: the difference of two G's of large m loses the blocks to rounding (1e-8 of 3e6
    blocks at 75,000 blocks), which made the curve step down where it is flat."""
    ramp = np.clip(m, 0.0, v)
    with np.errstate(divide="ignore", invalid="ignore"):
        a, b = np.abs(m) / sd, np.abs(m - v) / sd
        excess = sd * ((_phi(a) - a * ndtr(-a)) - (_phi(b) - b * ndtr(-b)))
    return np.where(sd > 0, ramp + excess, ramp)


class RevisitGroups:
    """Revisits binned by (s, d, v) for the grouped partial sum (module docstring).

    ``d``, ``sd``, ``v`` per revisit (blocks); ``width`` is eps. Per group: ``count`` and the
    exact means ``d``, ``sd``, ``v``; for the error bound, the sums of squared deviations of d,
    d + v and s and their cross sums with s (the second-order term), the largest deviation of
    each position, and the smallest and largest s.
    """

    def __init__(
        self,
        d: NDArray[np.float64],
        sd: NDArray[np.float64],
        v: NDArray[np.float64],
        width: float = GROUP_WIDTH,
    ) -> None:
        positive = sd > 0
        with np.errstate(divide="ignore"):
            s_bin = np.where(positive, np.floor(np.log(sd) / math.log1p(width)), -(2**40))
        # Positions in units of eps times the bin's smallest s; a bin of s = 0 (no
        # fluctuation: G is the ramp, exact but at its kink) uses whole blocks.
        cell = np.where(positive, width * np.exp(s_bin * math.log1p(width)), 1.0)
        keys = (s_bin.astype(np.int64), np.floor(d / cell).astype(np.int64),
                np.floor(v / cell).astype(np.int64))  # fmt: skip
        order = np.lexsort(keys[::-1])
        new = np.ones(order.size, dtype=bool)
        new[1:] = np.any([np.diff(k[order]) != 0 for k in keys], axis=0)
        inv = np.empty(order.size, dtype=np.intp)
        inv[order] = np.cumsum(new) - 1
        starts = np.flatnonzero(new)  # group g's members are order[starts[g]:starts[g + 1]]
        self.count = np.bincount(inv).astype(np.float64)
        n = self.count
        self.d = np.bincount(inv, weights=d) / n
        self.sd = np.bincount(inv, weights=sd) / n
        self.v = np.bincount(inv, weights=v) / n
        dd, ds, dv = d - self.d[inv], sd - self.sd[inv], v - self.v[inv]
        self.ss_d = np.bincount(inv, weights=dd * dd)
        self.ss_dv = np.bincount(inv, weights=(dd + dv) ** 2)
        self.ss_s = np.bincount(inv, weights=ds * ds)
        self.sp_d = -np.bincount(inv, weights=dd * ds)  # m = N - d: dm = -dd
        self.sp_dv = -np.bincount(inv, weights=(dd + dv) * ds)
        self.max_d = np.maximum.reduceat(np.abs(dd)[order], starts)
        self.max_dv = np.maximum.reduceat(np.abs(dd + dv)[order], starts)
        self.sd_min = np.minimum.reduceat(sd[order], starts)
        self.sd_max = np.maximum.reduceat(sd[order], starts)
        self.abs_d = np.bincount(inv, weights=np.abs(dd))
        self.abs_dv = np.bincount(inv, weights=np.abs(dd + dv))

    def __len__(self) -> int:
        return int(self.count.size)

    def reused(self, capacity: NDArray[np.float64]) -> NDArray[np.float64]:
        """Sum over revisits of G(N - d) - G(N - d - v) per capacity (blocks): per group,
        count times the term at the means plus the second-order terms of its two G's."""
        m = capacity[:, None] - self.d[None, :]
        sd, v = self.sd[None, :], self.v[None, :]
        first = self._curvature(m, sd, self.ss_d, self.sp_d)
        second = self._curvature(m - v, sd, self.ss_dv, self.sp_dv)
        # Row sums, not a matrix product: BLAS rounds a row differently with other rows beside
        # it, and h(N) must not depend on which other capacities are asked with it.
        return (prefix_reused(m, sd, v) * self.count).sum(axis=1) + (first - second).sum(axis=1)

    def _curvature(
        self,
        m: NDArray[np.float64],
        sd: NDArray[np.float64],
        ss_m: NDArray[np.float64],
        sp: NDArray[np.float64],
    ) -> NDArray[np.float64]:
        """The second-order term of sum_k G(m_k, s_k) about the group's means:
        phi(z) / (2 s) (S_mm - 2 z S_ms + z^2 S_ss), with z = m / s (0 where s = 0)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            z = m / sd
            t = _phi(z) / (2.0 * sd) * (ss_m - 2.0 * z * sp + z * z * self.ss_s)
        return np.where(sd > 0, t, 0.0)

    def error_bound(self, capacity: NDArray[np.float64]) -> NDArray[np.float64]:
        """Bound on |grouped - exact| of ``reused`` per capacity (blocks; module docstring)."""
        first = self._part(capacity[:, None] - self.d[None, :], self.max_d, self.ss_d, self.abs_d)
        second = self._part(
            capacity[:, None] - (self.d + self.v)[None, :], self.max_dv, self.ss_dv, self.abs_dv
        )
        return first.sum(axis=1) + second.sum(axis=1)

    def _part(
        self,
        m: NDArray[np.float64],
        spread: NDArray[np.float64],
        ss_m: NDArray[np.float64],
        abs_m: NDArray[np.float64],
    ) -> NDArray[np.float64]:
        """Per (capacity, group): sum_k G(m_k, s_k) - n G(m, s) and its second-order term both
        lie in [0, A S_mm + B S_ss], A = sup phi(z) / s, B = sup z^2 phi(z) / s over the box."""
        c = np.maximum(np.abs(m) - spread[None, :], 0.0)  # the smallest |m| in the box
        lo, hi = self.sd_min[None, :], self.sd_max[None, :]
        with np.errstate(divide="ignore", invalid="ignore"):
            # phi(c / s) / s rises in s up to s = c, then falls: its sup on [lo, hi].
            s_star = np.clip(c, lo, hi)
            a = np.where(s_star > 0, _phi(c / s_star) / s_star, np.inf)
            z_lo = c / hi  # z^2 phi(z) falls beyond sqrt(2)
            b = np.where(z_lo >= math.sqrt(2.0), z_lo * z_lo * _phi(z_lo), _Z2PHI_MAX) / lo
            gap = a * ss_m[None, :] + np.where(self.ss_s[None, :] > 0, b * self.ss_s[None, :], 0.0)
        # s = 0 throughout: G is the ramp, linear off its kink (no gap) and at most
        # half the absolute deviations across it.
        ramp = np.where(c > 0, 0.0, 0.5 * abs_m[None, :])
        return np.where(hi > 0, gap, ramp)


class FluctuationModel:
    """Tagged size plus Gaussian displacement fluctuations over an ``EmpiricalModel``.

    ``base`` supplies d(T), T_C and the ceiling; ``delays_s``, ``hit_blocks`` and
    ``tagged_blocks`` are per revisit k (s, blocks, blocks); ``EB2`` is E[B^2] (blocks^2).
    ``partial``: a revisit reuses the prefix that fits, ``min(v_k, (N - D)^+)`` blocks, instead
    of all or nothing (module docstring). h(N) is smooth and increasing in N; a curve costs
    O(points x revisits), or O(points x groups) where partial groups its revisits (more than
    ``GROUP_MIN_REVISITS`` of them and ``group_width`` not None: ``grouping_error_bound``).
    """

    def __init__(
        self,
        base: EmpiricalModel,
        delays_s: ArrayLike,
        hit_blocks: ArrayLike,
        tagged_blocks: ArrayLike,
        *,
        EB2: float,
        partial: bool = False,
        group_width: float | None = GROUP_WIDTH,
    ) -> None:
        self.base = base
        self.partial = partial
        W = np.asarray(delays_s, dtype=np.float64).ravel()
        R = np.broadcast_to(np.asarray(tagged_blocks, dtype=np.float64), W.shape)
        v = np.broadcast_to(np.asarray(hit_blocks, dtype=np.float64), W.shape)
        norm = base.L * base.A_R
        order = np.argsort(W, kind="stable")
        self._sorted_W, r2 = W[order], (R * R)[order]
        self._c_r2w = np.concatenate(([0.0], np.cumsum(r2 * self._sorted_W)))
        self._c_r2 = np.concatenate(([0.0], np.cumsum(r2)))
        self._EB2 = EB2
        # Partial: the capacity from which revisit k starts to hit (its own size not counted).
        self._key_all = base.displacement(W) + (0.0 if partial else R)
        self._sd_all = self.displacement_sd(W)
        self._v_all = np.array(v)
        keep = v > 0  # revisits that reuse nothing do not move h
        self._key, self._sd, self._v = self._key_all[keep], self._sd_all[keep], self._v_all[keep]
        self._norm = norm
        self._weight = v[keep] / norm if norm > 0 else np.zeros(int(keep.sum()))
        self.groups: RevisitGroups | None = None
        if partial and group_width is not None and self._key.size > GROUP_MIN_REVISITS:
            groups = RevisitGroups(self._key, self._sd, self._v, group_width)
            if len(groups) < self._key.size // 2:  # else the exact sum costs about as much
                self.groups = groups

    def displacement_sd(self, delays_s: ArrayLike) -> NDArray[np.float64]:
        """Standard deviation (blocks) of D(W), the blocks of the other conversations touched
        in the last W seconds, at each delay W (s): the square root of
        v(W) = lam (E[B^2] W + (1/L) sum_j R_j^2 min(W_j, W)) over this model's revisits j."""
        W = np.asarray(delays_s, dtype=np.float64)
        b = self.base
        if W.size == 0 or b.L <= 0 or self._sorted_W.size == 0:
            return np.zeros_like(W)
        k = np.searchsorted(self._sorted_W, W, side="right")
        c_r2w, c_r2 = self._c_r2w, self._c_r2
        variance = b.lam * (self._EB2 * W + (c_r2w[k] + (c_r2[-1] - c_r2[k]) * W) / b.L)
        return np.sqrt(np.maximum(variance, 0.0))

    @property
    def upper_bound(self) -> float:
        return self.base.upper_bound

    def characteristic_time(self, capacity: ArrayLike) -> NDArray[np.float64]:
        return self.base.characteristic_time(capacity)

    def hit_ratio_at_time(self, t: ArrayLike) -> NDArray[np.float64]:
        return self.base.hit_ratio_at_time(t)

    def hit_ratio(self, capacity: ArrayLike) -> NDArray[np.float64]:
        """h(N) = sum_k v_k Phi((N - key_k) / sd_k) / (L A_R), a point mass where sd_k = 0;
        partial: sum_k (G(N - key_k) - G(N - key_k - v_k)) / (L A_R)."""
        n = np.asarray(capacity, dtype=np.float64)
        flat = n.ravel()
        out = np.empty(flat.size)
        if self._key.size == 0 or self._norm <= 0:
            out[:] = 0.0
            return out.reshape(n.shape)
        if self.groups is not None:
            step = max(1, _CHUNK_CELLS // len(self.groups))
            for i in range(0, flat.size, step):
                out[i : i + step] = self.groups.reused(flat[i : i + step]) / self._norm
            return out.reshape(n.shape)
        step = max(1, _CHUNK_CELLS // max(self._key.size, 1))
        for i in range(0, flat.size, step):
            z = flat[i : i + step, None] - self._key[None, :]
            if self.partial:
                reused = prefix_reused(z, self._sd[None, :], self._v[None, :])
                out[i : i + step] = reused.sum(axis=1) / self._norm
                continue
            with np.errstate(divide="ignore", invalid="ignore"):
                p = np.where(self._sd > 0, ndtr(z / self._sd), (z >= 0).astype(np.float64))
            out[i : i + step] = (p * self._weight).sum(axis=1)  # per row, as in reused()
        return out.reshape(n.shape)

    def grouping_error_bound(self, capacity: ArrayLike) -> NDArray[np.float64]:
        """Bound on |h(N) grouped - h(N) summed exactly| per capacity (0 where not grouped)."""
        n = np.asarray(capacity, dtype=np.float64)
        if self.groups is None or self._norm <= 0:
            return np.zeros(n.shape)
        flat = n.ravel()
        out = np.empty(flat.size)
        step = max(1, _CHUNK_CELLS // len(self.groups))
        for i in range(0, flat.size, step):
            out[i : i + step] = self.groups.error_bound(flat[i : i + step]) / self._norm
        return out.reshape(n.shape)

    def resident_probability(self, capacity: float) -> NDArray[np.float64]:
        """P(D(W_k) + R_k <= N) per revisit k, in input order; partial: the expected share of
        v_k that is resident (1 where v_k is 0 and the revisit's start fits). Where the
        revisits are grouped, the exact shares are scaled to the grouped sum, so that the
        per-intent parts add up to ``hit_ratio`` (they differ by the grouping error)."""
        z = float(capacity) - self._key_all
        if self.partial:
            reused = prefix_reused(z, self._sd_all, self._v_all)
            total = float(reused.sum())
            if self.groups is not None and total > 0:
                reused *= float(self.groups.reused(np.array([float(capacity)]))[0]) / total
            with np.errstate(divide="ignore", invalid="ignore"):
                return np.where(self._v_all > 0, reused / self._v_all, (z >= 0).astype(float))
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self._sd_all > 0, ndtr(z / self._sd_all), (z >= 0).astype(np.float64))

    def curve(self, capacity: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        return self.characteristic_time(capacity), self.hit_ratio(capacity)

    def required_capacity(self, target: float) -> float | None:
        """Smallest N with h(N) >= target (Brent on the smooth h); None at or above the ceiling."""
        if target <= 0:
            return 0.0
        if target >= self.upper_bound or self._key.size == 0:
            return None
        hi = float(np.max(self._key + self._v + 10.0 * self._sd)) + 1.0
        if float(self.hit_ratio(hi)) < target:
            return None
        if float(self.hit_ratio(0.0)) >= target:
            return 0.0
        x = float(brentq(lambda x: float(self.hit_ratio(x)) - target, 0.0, hi, xtol=1e-6))
        while float(self.hit_ratio(x)) < target:  # land on the reaching side of the root
            x += 1e-6 * max(1.0, x)
        whole = math.floor(x)  # a root within the solver's tolerance above a whole block
        return float(whole) if float(self.hit_ratio(whole)) >= target else x
