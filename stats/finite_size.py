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


class FluctuationModel:
    """Tagged size plus Gaussian displacement fluctuations over an ``EmpiricalModel``.

    ``base`` supplies d(T), T_C and the ceiling; ``delays_s``, ``hit_blocks`` and
    ``tagged_blocks`` are per revisit k (s, blocks, blocks); ``EB2`` is E[B^2] (blocks^2).
    ``partial``: a revisit reuses the prefix that fits, ``min(v_k, (N - D)^+)`` blocks, instead
    of all or nothing (module docstring). h(N) is smooth and increasing in N; a curve costs
    O(points x revisits).
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
    ) -> None:
        self.base = base
        self.partial = partial
        W = np.asarray(delays_s, dtype=np.float64).ravel()
        R = np.broadcast_to(np.asarray(tagged_blocks, dtype=np.float64), W.shape)
        v = np.broadcast_to(np.asarray(hit_blocks, dtype=np.float64), W.shape)
        norm = base.L * base.A_R
        # Partial: the capacity from which revisit k starts to hit (its own size not counted).
        self._key_all = base.displacement(W) + (0.0 if partial else R)
        self._sd_all = np.sqrt(np.maximum(self._variance(W, R, EB2), 0.0))
        self._v_all = np.array(v)
        keep = v > 0  # revisits that reuse nothing do not move h
        self._key, self._sd, self._v = self._key_all[keep], self._sd_all[keep], self._v_all[keep]
        self._norm = norm
        self._weight = v[keep] / norm if norm > 0 else np.zeros(int(keep.sum()))

    def _variance(
        self, W: NDArray[np.float64], R: NDArray[np.float64], EB2: float
    ) -> NDArray[np.float64]:
        """v(W_k) = lam (E[B^2] W_k + (1/L) sum_j R_j^2 min(W_j, W_k)), blocks^2."""
        b = self.base
        if W.size == 0 or b.L <= 0:
            return np.zeros_like(W)
        order = np.argsort(W, kind="stable")
        ws, r2 = W[order], (R * R)[order]
        c_r2w = np.concatenate(([0.0], np.cumsum(r2 * ws)))
        c_r2 = np.concatenate(([0.0], np.cumsum(r2)))
        k = np.searchsorted(ws, W, side="right")
        return b.lam * (EB2 * W + (c_r2w[k] + (c_r2[-1] - c_r2[k]) * W) / b.L)

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
        step = max(1, _CHUNK_CELLS // max(self._key.size, 1))
        for i in range(0, flat.size, step):
            z = flat[i : i + step, None] - self._key[None, :]
            if self.partial:
                sd = self._sd[None, :]
                reused = _expected_excess(z, sd) - _expected_excess(z - self._v[None, :], sd)
                out[i : i + step] = reused.sum(axis=1) / self._norm
                continue
            with np.errstate(divide="ignore", invalid="ignore"):
                p = np.where(self._sd > 0, ndtr(z / self._sd), (z >= 0).astype(np.float64))
            out[i : i + step] = p @ self._weight
        return out.reshape(n.shape)

    def resident_probability(self, capacity: float) -> NDArray[np.float64]:
        """P(D(W_k) + R_k <= N) per revisit k, in input order; partial: the expected share of
        v_k that is resident (1 where v_k is 0 and the revisit's start fits)."""
        z = float(capacity) - self._key_all
        if self.partial:
            reused = _expected_excess(z, self._sd_all) - _expected_excess(
                z - self._v_all, self._sd_all
            )
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
