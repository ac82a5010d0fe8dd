"""The mean-field solver: paper reference points, exactness, monotonicity, inversion."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy.integrate import quad

from kvcast.stats.delays import (
    Empirical,
    Exponential,
    LogNormal,
)
from kvcast.stats.meanfield import EmpiricalModel, ParametricModel, single_class_model

SHAREGPT = dict(A_R=38.9092, A_hit=22.5178, A_move=22.5178, E_B=12.9220)
REFERENCE = [(0.5, 0.4253), (1.0, 0.2476), (1.5, 0.1718), (2.0, 0.1312)]


@pytest.mark.parametrize(("lam", "expected"), REFERENCE)
def test_paper_reference_points(lam: float, expected: float) -> None:
    model = ParametricModel(Exponential(135.0), lam=lam, **SHAREGPT)
    h = float(model.hit_ratio(2275))
    assert round(h, 4) == expected
    t = float(model.characteristic_time(2275))
    assert float(model.displacement(t)) == pytest.approx(2275, rel=1e-12)


@pytest.mark.parametrize("dist", [Exponential(135.0), LogNormal(4.6, 1.0), LogNormal(0.5, 2.5)])
def test_parametric_closed_forms(dist: Exponential | LogNormal) -> None:
    for t in (0.0, 0.3, 10.0, 99.5, 500.0, 1e4):
        numeric = quad(lambda u: 1.0 - float(dist.cdf(u)), 0, t, limit=200)[0]
        assert float(dist.tail_integral(t)) == pytest.approx(numeric, rel=1e-8, abs=1e-10)
    for p in (0.01, 0.3, 0.5, 0.99):
        assert float(dist.cdf(dist.ppf(p))) == pytest.approx(p, rel=1e-10)
    assert float(dist.tail_integral(1e9)) == pytest.approx(dist.mean, rel=1e-6)


def test_empirical_distribution() -> None:
    e = Empirical([3.0, 1.0, 2.0, 2.0])
    assert e.cdf([0.5, 1.0, 2.0, 2.5, 3.0]).tolist() == [0.0, 0.25, 0.75, 0.75, 1.0]
    assert float(e.tail_integral(2.0)) == pytest.approx((1 + 2 + 2 + 2) / 4)
    assert float(e.ppf(0.5)) == 2.0 and float(e.ppf(1.0)) == 3.0 and e.mean == 2.0


def _direct_d(W, w, lam, E_B, L, t):  # an independent reference
    return lam * E_B * t + lam / L * float(np.sum(w * np.minimum(W, t)))


def _bisect_tc(W, w, lam, E_B, L, n):
    lo, hi = 0.0, 1.0
    while _direct_d(W, w, lam, E_B, L, hi) < n:
        lo, hi = hi, hi * 2
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _direct_d(W, w, lam, E_B, L, mid) < n:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * hi:
            break
    return hi


_delays = st.one_of(
    st.lists(st.floats(0, 2000, allow_subnormal=False), min_size=0, max_size=60),
    st.lists(st.sampled_from([0.0, 1.0, 5.0, 50.0, 300.0]), min_size=1, max_size=40),
)


@st.composite
def _problems(draw: st.DrawFn) -> dict:
    W = np.array(draw(_delays), dtype=np.float64)
    weights = st.floats(0, 60, allow_nan=False)
    w = np.array(draw(st.lists(weights, min_size=W.size, max_size=W.size)), dtype=np.float64)
    v = np.array(draw(st.lists(weights, min_size=W.size, max_size=W.size)), dtype=np.float64)
    return dict(
        W=W,
        w=w,
        v=v,
        lam=draw(st.floats(0.01, 20)),
        E_B=draw(st.floats(0.05, 80)),
        L=draw(st.integers(1, 500)),
        A_R=draw(st.floats(1, 200)),
        N=draw(st.floats(0.5, 2e5)),
    )


def _model(p: dict) -> EmpiricalModel:
    return EmpiricalModel(
        p["W"], p["w"], p["v"], lam=p["lam"], E_B=p["E_B"], A_R=p["A_R"], L=p["L"]
    )


@settings(max_examples=300, deadline=None)
@given(_problems())
def test_exact_solver_matches_bisection(p: dict) -> None:
    model = _model(p)
    t_c = float(model.characteristic_time(p["N"]))
    args = (p["W"], p["w"], p["lam"], p["E_B"], p["L"])
    assert _direct_d(*args, t_c) == pytest.approx(p["N"], rel=1e-9)
    assert t_c == pytest.approx(_bisect_tc(*args, p["N"]), rel=1e-9)
    assert float(model.displacement(t_c)) == pytest.approx(p["N"], rel=1e-9)
    # h: away from breakpoints, the direct count of resident revisits.
    if p["W"].size == 0 or np.min(np.abs(p["W"] - t_c)) > 1e-7 * max(t_c, 1.0):
        direct_h = float(np.sum(p["v"][p["W"] <= t_c])) / (p["L"] * p["A_R"])
        assert float(model.hit_ratio(p["N"])) == pytest.approx(direct_h, rel=1e-12, abs=1e-15)


@settings(max_examples=200, deadline=None)
@given(_problems(), st.lists(st.floats(0.01, 3e5), min_size=2, max_size=30))
def test_curve_monotone(p: dict, caps: list[float]) -> None:
    model = _model(p)
    caps_sorted = np.sort(np.array(caps))
    t, h = model.curve(caps_sorted)
    assert np.all(np.diff(h) >= 0) and np.all(np.diff(t) >= 0)
    assert np.all(h <= model.upper_bound + 1e-15)


@settings(max_examples=300, deadline=None)
@given(_problems(), st.floats(0.0, 1.0))
def test_required_capacity_inverts(p: dict, frac: float) -> None:
    model = _model(p)
    h_n = float(model.hit_ratio(p["N"]))
    n_back = model.required_capacity(h_n)
    assert n_back is not None and n_back <= p["N"]
    target = frac * model.upper_bound
    assume(target > 0)
    n_req = model.required_capacity(target)
    assert n_req is not None
    assert float(model.hit_ratio(n_req)) >= target
    # smallest: a little less capacity falls short
    if n_req > 1e-6:
        assert float(model.hit_ratio(n_req * (1 - 1e-9))) < target
    assert model.required_capacity(model.upper_bound * 1.000001 + 1e-12) is None


def test_empirical_agrees_with_exponential() -> None:
    rng = np.random.default_rng(7)
    samples = rng.exponential(135.0, size=200_000)
    for lam, _ in REFERENCE:
        par = ParametricModel(Exponential(135.0), lam=lam, **SHAREGPT)
        emp = single_class_model(Empirical(samples), lam=lam, **SHAREGPT)
        assert isinstance(emp, EmpiricalModel)
        assert float(emp.hit_ratio(2275)) == pytest.approx(float(par.hit_ratio(2275)), abs=3e-3)
        t_emp = float(emp.characteristic_time(2275))
        assert t_emp == pytest.approx(float(par.characteristic_time(2275)), rel=1e-2)


def test_parametric_required_capacity_round_trip() -> None:
    model = ParametricModel(LogNormal(4.6, 1.0), lam=1.0, **SHAREGPT)
    for target in (0.05, 0.2, 0.4, 0.55):
        n = model.required_capacity(target)
        assert n is not None
        assert float(model.hit_ratio(n)) == pytest.approx(target, rel=1e-9)
    assert model.required_capacity(model.upper_bound) is None
    t, h = model.curve([100, 1000, 10_000, 100_000])
    assert np.all(np.diff(h) > 0) and np.all(np.diff(t) > 0)


def test_degenerate_models() -> None:
    empty = EmpiricalModel([], [], [], lam=1.0, E_B=10.0, A_R=20.0, L=5)
    assert float(empty.characteristic_time(100)) == pytest.approx(10.0)
    assert float(empty.hit_ratio(100)) == 0.0 and empty.upper_bound == 0.0
    assert empty.required_capacity(0.1) is None
    no_rate = EmpiricalModel([1.0, 2.0], [3, 3], [2, 2], lam=0.0, E_B=10.0, A_R=4.0, L=1)
    assert math.isinf(float(no_rate.characteristic_time(100)))
    assert float(no_rate.hit_ratio(100)) == no_rate.upper_bound == 1.0
    # E_B = 0: the history alone cannot fill a large cache
    never = EmpiricalModel([1.0, 2.0], [3, 3], [2, 2], lam=1.0, E_B=0.0, A_R=4.0, L=1)
    assert math.isinf(float(never.characteristic_time(1e6)))
    par = ParametricModel(Exponential(10), lam=1.0, E_B=0.0, A_R=4.0, A_move=1.0, A_hit=1.0)
    assert math.isinf(float(par.characteristic_time(1e6)))
    zero_ar = EmpiricalModel([1.0], [1.0], [1.0], lam=1.0, E_B=1.0, A_R=0.0, L=1)
    assert float(zero_ar.hit_ratio(10)) == 0.0
    with pytest.raises(ValueError, match="delays"):
        EmpiricalModel([-1.0], [1.0], [1.0], lam=1.0, E_B=1.0, A_R=1.0, L=1)
