"""The ``density`` score (kvcast.exporters.kit.density, read by .index): its definition,
bounds, shape and the table fields it reads. Reference values come from numerical
integration of the definition (scipy's quad over the log-normal), never from the closed form
under test."""

from __future__ import annotations

import math
from itertools import pairwise

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

from kvcast.exporters.kit.ages import AGE_BUCKETS, age_bucket, bucket_age, bucket_start, flip_time
from kvcast.exporters.kit.checks import TableError
from kvcast.exporters.kit.density import (
    DEFAULT_HORIZON_S,
    DEFAULT_SIGMA,
    DensityCurve,
    hit_density,
    residency,
    reuse_within,
)
from kvcast.exporters.kit.index import PriorityIndex
from kvcast.exporters.kit.laws import pooled_law, smoothed_p

probabilities = st.floats(0.0, 1.0, allow_subnormal=False)
mus = st.floats(-1.0, 9.0)  # log-seconds: medians from 0.4 s to 2.25 h
sigmas = st.floats(0.1, 3.0)
horizons = st.floats(0.5, 20_000.0)
ages = st.floats(0.0, 200_000.0)


def brute(age: float, horizon: float, p: float, mu: float, sigma: float) -> tuple[float, float]:
    """(P(reuse in the horizon | none by the age), E[min(T - a, H) | T > a]) by quadrature of
    the definition: T = W with probability p (W log-normal), never otherwise. Integrated over
    u = log x (where the law is a smooth normal), split at mu + k sigma."""
    law = stats.norm(mu, sigma)
    lo, hi = math.log(max(age, 1e-12)), math.log(age + horizon)
    cuts = [mu + k * sigma for k in range(-8, 9) if lo < mu + k * sigma < hi]
    edges = [lo, *cuts, hi]

    def quad(f) -> float:
        return sum(integrate.quad(f, u, v, limit=200, epsabs=0)[0] for u, v in pairwise(edges))

    mass = quad(law.pdf)
    held = quad(lambda u: (1 - p * law.cdf(u)) * math.exp(u)) + (
        min(age, 1e-12) if age < 1e-12 else 0
    )
    alive = 1 - p * (law.cdf(math.log(age)) if age > 0 else 0.0)
    return p * mass / alive, held / alive


@settings(max_examples=40, deadline=None)
@given(ages, horizons, probabilities, mus, sigmas)
def test_the_score_is_its_definition_integrated(age, horizon, p, mu, sigma) -> None:
    alive = 1 - p * stats.norm(mu, sigma).cdf(math.log(age)) if age > 0 else 1.0
    assume(alive > 1e-9)  # a block that is certainly reused by now has no conditional law
    want_p, want_e = brute(age, horizon, p, mu, sigma)
    assert reuse_within(age, horizon, p, mu, sigma) == pytest.approx(want_p, rel=1e-6, abs=1e-12)
    assert residency(age, horizon, p, mu, sigma) == pytest.approx(want_e, rel=1e-6, abs=1e-9)
    if want_p > 1e-12:
        assert hit_density(age, horizon, p, mu, sigma, size=3.0) == pytest.approx(
            want_p / want_e / 3.0, rel=1e-5
        )


@settings(max_examples=300, deadline=None)
@given(ages, horizons, probabilities, mus, sigmas, st.floats(0.5, 8192.0))
def test_bounds(age, horizon, p, mu, sigma, size) -> None:
    assume(1 - p * stats.norm(mu, sigma).cdf(math.log(age)) > 1e-9 if age > 0 else True)
    reuse = reuse_within(age, horizon, p, mu, sigma)
    held = residency(age, horizon, p, mu, sigma)
    density = hit_density(age, horizon, p, mu, sigma, size)
    assert 0.0 <= reuse <= p + 1e-12  # never likelier than continuing at all
    assert 0.0 < held <= horizon
    # E[min(T - a, H)] >= H P(T - a > H): the block holds its space at least that long.
    assert held >= horizon * (1 - reuse) * (1 - 1e-9)
    assert density >= 0.0
    if reuse < 1.0:
        assert density <= reuse / (horizon * (1 - reuse) * size) * (1 + 1e-9)
    assert density * size * horizon >= reuse * (1 - 1e-9) - 1e-300  # residency <= H


def test_a_state_that_never_continues_has_no_density() -> None:
    assert hit_density(10.0, 60.0, 0.0, 4.0, 1.0) == 0.0
    assert reuse_within(10.0, 60.0, 0.0, 4.0, 1.0) == 0.0
    assert residency(10.0, 60.0, 0.0, 4.0, 1.0) == 60.0  # it holds the whole horizon


def test_density_falls_with_size_and_rises_with_p() -> None:
    base = hit_density(30.0, 120.0, 0.5, 4.0, 1.0, size=1.0)
    assert hit_density(30.0, 120.0, 0.5, 4.0, 1.0, size=4.0) == pytest.approx(base / 4)
    assert hit_density(30.0, 120.0, 0.8, 4.0, 1.0) > base > hit_density(30.0, 120.0, 0.2, 4.0, 1.0)


@settings(max_examples=200, deadline=None)
@given(st.floats(0.0, 0.9), mus, sigmas, horizons, st.floats(0.0, 6.0), st.floats(0.0, 3.0))
def test_raw_score_decays_with_age_past_the_delays(p, mu, sigma, horizon, past, step) -> None:
    """Past the 99th percentile of the delays, an older block is worth no more than a
    younger one of the same state: dead blocks age (the fix for IAC's pile-up). (With p near
    1 a narrow log-normal's reuse hazard still rises there: a state that always continues is
    "about to come back"; the table's p never gets there, see the smoothing, and the curve's
    envelope guarantees the decay anyway: next test.)"""
    a = math.exp(mu + 2.33 * sigma) * (1 + past)
    older = a * (1 + step) + 1.0
    assert hit_density(older, horizon, p, mu, sigma) <= hit_density(a, horizon, p, mu, sigma) * (
        1 + 1e-9
    )


@settings(max_examples=60, deadline=None)
@given(probabilities, mus, sigmas, horizons)
def test_a_curve_knows_where_its_value_changes_and_where_it_drops(p, mu, sigma, horizon) -> None:
    """What a cached block's key needs to be recomputed: eagerly at a change, or (a key that
    only rises being a lower bound) lazily until the next drop."""
    curve = DensityCurve(p, mu, sigma, horizon)
    assert curve.changes() == [
        next((j for j in range(k + 1, AGE_BUCKETS) if curve.values[j] != curve.values[k]),
             AGE_BUCKETS) for k in range(AGE_BUCKETS)
    ]  # fmt: skip
    assert curve.drops() == [
        next((j for j in range(k + 1, AGE_BUCKETS) if curve.values[j] < curve.values[k]),
             AGE_BUCKETS) for k in range(AGE_BUCKETS)
    ]  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(probabilities, mus, sigmas, horizons)
def test_curve_never_rises_past_the_delays(p, mu, sigma, horizon) -> None:
    curve = DensityCurve(p, mu, sigma, horizon)
    start = age_bucket(math.exp(mu + 2.33 * sigma))
    tail = curve.values[start:]
    assert all(a >= b for a, b in pairwise(tail))
    assert tail[-1] < tail[0] or tail[0] == 0.0  # and it does fall


def test_dead_blocks_fall_below_fresh_blocks_of_an_unlikely_state() -> None:
    """IAC keeps an hour-old block of a P = 0.9 state over a fresh block of a P = 0.3 state
    whose median is 5 minutes; density does not."""
    old_likely = hit_density(3600.0, 300.0, 0.9, math.log(20.0), 1.0)
    fresh_unlikely = hit_density(5.0, 300.0, 0.3, math.log(300.0), 1.0)
    assert old_likely < fresh_unlikely


@settings(max_examples=60, deadline=None)
@given(st.floats(0.0, 0.9), mus, sigmas, horizons)
def test_curve_is_the_score_on_the_grid_and_unimodal(p, mu, sigma, horizon) -> None:
    curve = DensityCurve(p, mu, sigma, horizon)
    raw = [hit_density(bucket_age(k), horizon, p, mu, sigma) for k in range(AGE_BUCKETS)]
    peak = max(range(AGE_BUCKETS), key=curve.values.__getitem__)
    assert all(a <= b for a, b in pairwise(curve.values[: peak + 1]))
    assert all(a >= b for a, b in pairwise(curve.values[peak:]))
    # The envelope changes nothing where the score is unimodal already (the log-normal case):
    assert curve.values == pytest.approx(raw, rel=1e-12, abs=1e-300)


def test_a_state_that_always_continues_still_ages() -> None:
    curve = DensityCurve(1.0, 0.0, 0.25, 1.0)  # the reuse hazard rises past the delays
    start = age_bucket(math.exp(2.33 * 0.25))
    assert curve.values[start + 1] <= curve.values[start]
    assert hit_density(bucket_age(start + 1), 1.0, 1.0, 0.0, 0.25) > hit_density(
        bucket_age(start), 1.0, 1.0, 0.0, 0.25
    )  # what the envelope corrects


def test_age_grid() -> None:
    assert age_bucket(0.0) == 0 and age_bucket(-1.0) == 0
    for k in range(AGE_BUCKETS - 1):
        assert bucket_start(k) <= bucket_age(k) < bucket_start(k + 1)
        assert age_bucket(bucket_age(k)) == k
        assert age_bucket(bucket_start(k + 1) * (1 + 1e-9)) == k + 1
    assert age_bucket(1e300) == AGE_BUCKETS - 1
    # Steps of 2^(1/8) - 1 = 9% of (1 + age): a curve's value never jumps further than that.
    assert bucket_start(9) / bucket_start(8) - 1 < 0.2


def _before(x: float) -> float:
    return math.nextafter(x, -math.inf)


@pytest.mark.parametrize("clock_s", [0.0, 1e6, 1.7e9, 1e12])
@pytest.mark.parametrize("fraction", [0.0, 0.1, 0.37, 0.999])
def test_flip_times_are_strictly_later_at_any_clock_magnitude(
    clock_s: float, fraction: float
) -> None:
    """At every bucket boundary: the flip time's age is in the bucket (or later), and every
    earlier time at which the age is still in a lower bucket comes before it (so a flip
    handled at ``now`` is never due at ``now`` again); and it is the earliest such time but
    for the rounding of the sum. A nudge of 1e-9 s failed this from 1.7e9 s on (issue 33)."""
    origin = clock_s + fraction * 1000.0
    for k in range(1, AGE_BUCKETS):
        flip = flip_time(origin, k)
        assert age_bucket(flip - origin) >= k
        # the latest float at which the age is still below bucket k lies before the flip
        now = flip
        while age_bucket(now - origin) >= k:
            now = _before(now)
        assert now < flip and age_bucket(now - origin) < k
        assert age_bucket(_before(_before(flip)) - origin) < k  # at most one step late


def test_laplace_smoothing_keeps_every_state_mortal() -> None:
    assert smoothed_p(1.0, 3) == pytest.approx(4 / 5)
    assert smoothed_p(0.0, 3) == pytest.approx(1 / 5)
    assert smoothed_p(0.7, 10_000) == pytest.approx(0.7, abs=1e-4)
    assert smoothed_p(0.7, None) == 0.7


def doc(*rows: dict[str, object], **extra: object) -> dict[str, object]:
    return {"version": 1, "defaults": {"p_continue": 0.5, "median_reuse_s": 150.0},
            "states": list(rows), **extra}  # fmt: skip


def row(intent: str, turn: int, p: float, median: float, mu: float | None, sigma: float | None,
        conversations: int = 50) -> dict[str, object]:  # fmt: skip
    return {"intent": intent, "turn": turn, "p_continue": p, "median_reuse_s": median, "mu": mu,
            "sigma": sigma, "conversations": conversations, "delay_samples": 20}  # fmt: skip


def test_index_reads_the_law_and_horizon_from_the_table() -> None:
    index = PriorityIndex(
        doc(
            row("code", 1, 0.9, math.exp(3.0), 3.0, 0.7),
            row("chat", 1, 0.4, 150.0, 1.0, 0.2),  # thin delays: the median is the default
            row("chat", 2, 0.4, math.exp(5.0), None, None),
            characteristic_time_s=90.0,
        )
    )
    assert index.horizon_s == 90.0
    assert index.law("code", 1) == pytest.approx((smoothed_p(0.9, 50), 3.0, 0.7))
    # mu always from the median Eq. 1 uses; sigma only where it belongs to that median.
    assert index.law("chat", 1) == pytest.approx((smoothed_p(0.4, 50), math.log(150.0), 1.0))
    assert index.law("chat", 2)[2] == DEFAULT_SIGMA
    # An unlisted state: the listed states pooled (p over all three, the delays of the one
    # fitted law), not the defaults' made-up law.
    pooled_p = (smoothed_p(0.9, 50) + 2 * smoothed_p(0.4, 50)) / 3
    assert index.law("travel", 3) == pytest.approx((pooled_p, 3.0, 0.7))
    age = 40.0
    want = hit_density(bucket_age(age_bucket(age)), 90.0, *index.law("code", 1), size=64)
    assert index.density("code", 1, age, 64) == pytest.approx(want, rel=1e-12)
    assert index.priority("code", 1, age, 64, policy="density") == (
        index.density("code", 1, age, 64),
        -age,
    )
    assert index.priority("code", 1, age, 64) == index.priority("code", 1, age, 64, policy="iac")


def test_without_a_characteristic_time_the_default_horizon() -> None:
    assert PriorityIndex(doc()).horizon_s == DEFAULT_HORIZON_S
    assert PriorityIndex(None).horizon_s == DEFAULT_HORIZON_S
    assert PriorityIndex(doc(characteristic_time_s=None)).horizon_s == DEFAULT_HORIZON_S


@pytest.mark.parametrize(
    "bad",
    [
        {"characteristic_time_s": "soon"},
        {"characteristic_time_s": math.inf},
        {"defaults": {"p_continue": 0.5, "median_reuse_s": 150.0, "sigma": 0.0}},
        {"states": [row("x", 1, 0.5, 10.0, 2.3, -1.0)]},
        {"states": [row("x", 1, 0.5, 10.0, "2", 1.0)]},
    ],
)
def test_malformed_density_fields_are_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(TableError):
        PriorityIndex({**doc(), **bad})


def test_rank_orders_as_priority_with_older_first_on_ties() -> None:
    index = PriorityIndex(
        doc(row("code", 1, 0.9, 20.0, math.log(20.0), 0.8), row("chat", 1, 0.3, 300.0,
            math.log(300.0), 1.2), characteristic_time_s=120.0)
    )  # fmt: skip
    same = bucket_age(40)  # two ages in one bucket: equal densities
    candidates = [
        ("code", 1, 2.0, 16), ("code", 1, 5000.0, 16), ("chat", 1, 30.0, 16),
        ("chat", 1, same, 16), ("chat", 1, same * 1.001, 16), ("other", 4, 10.0, 16),
        ("code", 40, 3.0, 32),
    ]  # fmt: skip
    keys = [index.priority(*c, policy="density") for c in candidates]
    assert index.rank(candidates, policy="density") == sorted(
        range(len(candidates)), key=keys.__getitem__
    )
    assert keys[4] < keys[3]  # tie on the density: the older goes first
    assert index.rank(candidates) == index.rank(candidates, policy="iac")
    with pytest.raises(ValueError, match="policy"):
        index.rank(candidates, policy="lru")


def test_an_unlisted_state_pools_the_listed_ones() -> None:
    # p: the conversations' mean; log W: the mixture's mean and variance, by delays (n p).
    law = pooled_law([(0.8, 30), (0.2, 10)], [(2.0, 0.5, 24.0), (4.0, 1.0, 2.0)], (0.5, 5.0, 1.0))
    mu = (2.0 * 24 + 4.0 * 2) / 26
    var = ((0.25 + (2.0 - mu) ** 2) * 24 + (1.0 + (4.0 - mu) ** 2) * 2) / 26
    assert law == pytest.approx((0.65, mu, math.sqrt(var)))
    # No fitted delays: the defaults' law of W; nothing listed: the defaults.
    assert pooled_law([(0.8, 30)], [], (0.5, 5.0, 1.0)) == (0.8, 5.0, 1.0)
    assert pooled_law([], [], (0.5, 5.0, 1.0)) == (0.5, 5.0, 1.0)
    empty = PriorityIndex(doc(characteristic_time_s=90.0))
    assert empty.law("travel", 3) == pytest.approx((0.5, math.log(150.0), DEFAULT_SIGMA))
    listed = PriorityIndex(doc(row("code", 1, 0.9, math.exp(3.0), 3.0, 0.7)))
    assert listed.default_curve().values == listed.curve("travel", 3).values
    assert listed.curve("travel", 3).values == listed.curve("code", 1).values
