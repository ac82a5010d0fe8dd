"""The ``partial`` refinement: a revisit reuses the prefix of its conversation that still fits.

A block-level prefix cache evicts a chain's tail first, so a conversation pushed back by ``D``
blocks of others keeps ``clip(N - D, 0, R)`` of its blocks. Checked against the Gaussian
expectation computed by quadrature, against the sum it reduces to without fluctuations, against
the all-or-nothing rule it bounds from above, and against block-level LRU where one context is
a sizeable share of the cache (the agent regime of issue 33).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

from kvcast.lab.reports.big_context_validation import tool_loop
from kvcast.lab.reports.samples import sample_from_events
from kvcast.lab.sim.registry import get_policy
from kvcast.lab.workload.generator import generate
from kvcast.stats.estimators import sample_model
from kvcast.stats.finite_size import FluctuationModel, _expected_excess
from kvcast.stats.meanfield import EmpiricalModel


@settings(max_examples=60, deadline=None)
@given(
    m=st.floats(-500, 500),
    sd=st.floats(0.5, 300),
    v=st.floats(0.0, 400),
)
def test_the_reused_blocks_are_the_gaussian_expectation(m: float, sd: float, v: float) -> None:
    def reused(x: float) -> float:
        return min(v, max(x, 0.0)) * stats.norm.pdf(x, m, sd)

    truth, _ = integrate.quad(reused, m - 12 * sd, m + 12 * sd, points=[0.0, v], limit=200)
    got = _expected_excess(np.array([m]), np.array([sd])) - _expected_excess(
        np.array([m - v]), np.array([sd])
    )
    assert float(got[0]) == pytest.approx(truth, abs=1e-6 * max(1.0, v))


revisits = st.lists(st.tuples(st.floats(0.1, 500), st.floats(1, 300)), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(rows=revisits)
def test_without_fluctuations_it_is_the_prefix_that_fits(rows: list) -> None:
    W = np.array([w for w, _ in rows])
    R = np.array([r for _, r in rows])
    v = np.maximum(R - 1, 0)
    base = EmpiricalModel(W, R, v, lam=0.5, E_B=20.0, A_R=R.mean() + 20, L=len(rows))
    # E[B^2] = 0 and no tagged sizes: zero variance, so D is its mean d(W_k).
    model = FluctuationModel(base, W, v, np.zeros_like(R), EB2=0.0, partial=True)
    d = base.displacement(W)
    for n in (0.0, 10.0, float(np.median(d)), float(d.max() + R.max()), 1e6):
        brute = sum(min(vk, max(0.0, n - dk)) for vk, dk in zip(v, d, strict=True))
        expected = brute / (base.L * base.A_R)
        assert float(model.hit_ratio(n)) == pytest.approx(expected, rel=1e-9, abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(rows=revisits, eb2=st.floats(0, 1e5))
def test_it_is_increasing_bounded_and_never_below_all_or_nothing(rows: list, eb2: float) -> None:
    W = np.array([w for w, _ in rows])
    R = np.array([r for _, r in rows])
    v = np.maximum(R - 1, 0)
    base = EmpiricalModel(W, R, v, lam=0.5, E_B=20.0, A_R=R.mean() + 20, L=len(rows))
    partial = FluctuationModel(base, W, v, R, EB2=eb2, partial=True)
    whole = FluctuationModel(base, W, v, R, EB2=eb2)
    caps = np.linspace(0, float(base.displacement(W).max() + 4 * R.max()), 60)
    h = partial.hit_ratio(caps)
    assert np.all(np.diff(h) >= -1e-12)
    assert np.all(h <= partial.upper_bound + 1e-12)
    assert np.all(h >= whole.hit_ratio(caps) - 1e-12)  # the prefix that fits >= all or nothing
    target = float(h[len(h) // 2])
    if 0 < target < partial.upper_bound:
        n = partial.required_capacity(target)
        assert n is not None and float(partial.hit_ratio(n)) >= target


def test_big_contexts_hit_the_prefix_that_fits_as_block_level_lru_does() -> None:
    duration = 20_000.0
    trace = generate(tool_loop(), lambda0=0.05, duration_s=duration, seed=1,
                     block_size=1024)  # fmt: skip
    sample = sample_from_events(trace.events(), 1024)
    sim = trace.sim_trace()
    steady = sim.timestamp >= 0.2 * duration  # by request time, once the stream is stationary
    partial = sample_model(sample, 0.05, "state", "whole", "partial")
    whole = sample_model(sample, 0.05, "state", "whole", "tagged")
    lru = get_policy("lru", "block")
    for capacity in (125, 250, 500, 1000):  # about 3 to 22 mean contexts
        hits = lru(sim, capacity)
        simulated = hits[steady].sum() / sim.blocks[steady].sum()
        assert float(partial.hit_ratio(capacity)) == pytest.approx(simulated, abs=0.02)
    # the all-or-nothing rule forecasts no hit at all where LRU hits one input block in five
    assert float(whole.hit_ratio(125)) == 0.0


@settings(max_examples=60, deadline=None)
@given(rows=revisits, queries=st.lists(st.floats(0.0, 800), min_size=1, max_size=10))
def test_the_displacement_spread_is_campbells_at_any_delay(rows: list, queries: list) -> None:
    """v(W) = lam (E[B^2] W + (1/L) sum_j R_j^2 min(W_j, W)), summed here revisit by revisit."""
    W = np.array([w for w, _ in rows])
    R = np.array([r for _, r in rows])
    v = np.maximum(R - 1, 0)
    lam, EB2 = 0.5, 900.0
    base = EmpiricalModel(W, R, v, lam=lam, E_B=20.0, A_R=R.mean() + 20, L=len(rows))
    model = FluctuationModel(base, W, v, R, EB2=EB2, partial=True)
    for t in queries:
        brute = lam * (EB2 * t + sum(r * r * min(w, t) for w, r in rows) / len(rows))
        assert float(model.displacement_sd([t])[0]) == pytest.approx(np.sqrt(brute), rel=1e-9)
