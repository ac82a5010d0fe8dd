"""The grouped sum of the ``partial`` refinement: revisits close in delay and size summed as one.

Checked against the exact sum over revisits on drawn samples (within its derived bound and
within 1e-4 of the hit ratio), for the shape of the curve it gives (increasing, under the
ceiling), and for its cost: the number of groups a curve point sums over, not a timing.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

from kvcast.stats.estimators import revisit_weights, sample_model
from kvcast.stats.finite_size import (
    GROUP_MIN_REVISITS,
    FluctuationModel,
    final_blocks_second_moment,
    prefix_reused,
)
from kvcast.stats.meanfield import EmpiricalModel
from kvcast.stats.sample import IntentMoments, WorkloadSample

TOLERANCE = 1e-4  # of the hit ratio: the grouped sum against the exact one (finite_size docs)


@settings(max_examples=60, deadline=None)
@given(m=st.floats(-2000, 2000), sd=st.floats(0.5, 300), v=st.floats(0.0, 400))
def test_the_rounding_safe_form_is_the_gaussian_expectation(m: float, sd: float, v: float) -> None:
    def reused(x: float) -> float:
        return min(v, max(x, 0.0)) * stats.norm.pdf(x, m, sd)

    truth, _ = integrate.quad(reused, m - 12 * sd, m + 12 * sd, points=[0.0, v], limit=200)
    got = prefix_reused(np.array([m]), np.array([sd]), np.array([v]))
    assert float(got[0]) == pytest.approx(truth, abs=1e-6 * max(1.0, v))


def drawn_models(
    seed: int, n: int, lam: float, delay_mu: float, delay_sigma: float, blocks: float, eb2: float
) -> tuple[FluctuationModel, FluctuationModel]:
    """(grouped, exact) partial models of one drawn sample of n revisits."""
    rng = np.random.default_rng(seed)
    W = rng.lognormal(delay_mu, delay_sigma, n)
    R = np.ceil(rng.lognormal(np.log(blocks), 0.8, n))
    v = np.maximum(R - 1.0, 0.0)
    conversations = n / 4.0
    base = EmpiricalModel(
        W, R, v, lam=lam, E_B=blocks, A_R=(R.sum() + conversations * blocks) / conversations,
        L=conversations,
    )  # fmt: skip
    eb2 = eb2 * blocks * blocks
    grouped = FluctuationModel(base, W, v, R, EB2=eb2, partial=True)
    exact = FluctuationModel(base, W, v, R, EB2=eb2, partial=True, group_width=None)
    return grouped, exact


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(GROUP_MIN_REVISITS + 1, 12_000),
    lam=st.floats(0.005, 2.0),
    delay_mu=st.floats(0.0, 6.0),
    delay_sigma=st.floats(0.2, 2.0),
    blocks=st.floats(2.0, 300.0),
    eb2=st.floats(0.0, 3.0),
)
def test_the_grouped_sum_is_the_exact_one_within_its_bound(
    seed: int, n: int, lam: float, delay_mu: float, delay_sigma: float, blocks: float, eb2: float
) -> None:
    grouped, exact = drawn_models(seed, n, lam, delay_mu, delay_sigma, blocks, eb2)
    assert grouped.groups is not None or exact.groups is None  # grouped unless it would not pay
    top = float(np.max(exact._key + exact._v + 4.0 * exact._sd))
    caps = np.concatenate((np.linspace(0.0, top, 60), np.quantile(exact._key, [0.1, 0.5, 0.9])))
    got, truth = grouped.hit_ratio(caps), exact.hit_ratio(caps)
    bound = grouped.grouping_error_bound(caps)
    rounding = 1e-12 * max(1.0, float(np.max(truth)))
    assert np.all(np.abs(got - truth) <= bound + rounding)
    assert np.max(np.abs(got - truth)) <= TOLERANCE


def chat_100k() -> WorkloadSample:
    """The 100,000 revisits of tests/stats/test_forecast.py::test_curve_speed_100k."""
    rng = np.random.default_rng(12)
    n = 100_000
    return WorkloadSample(
        ("a",),
        (IntentMoments(30_000, 1e6, 6e5, 5e5, 3e5, 1.3e5),),
        rng.exponential(135, n),
        rng.integers(1, 60, n),
        np.zeros(n, np.int32),
        np.ones(n, np.int32),
        1.0,
    )


@pytest.mark.parametrize("variant", ["sample", "state"])
def test_a_curve_point_sums_at_most_one_group_per_hundred_revisits(variant: str) -> None:
    sample = chat_100k()
    model = sample_model(sample, 1.0, variant, "whole", "partial")
    assert isinstance(model, FluctuationModel) and model.groups is not None
    assert len(model.groups) <= 1_000  # 480 (sample) and 277 (state) measured
    caps = np.linspace(100, 100_000, 100)
    h = model.hit_ratio(caps)
    assert np.all(np.diff(h) >= 0)
    assert np.all(h <= model.upper_bound + 1e-12)
    W, _, v = revisit_weights(sample, variant, "whole")
    exact = FluctuationModel(
        model.base, W, v, np.asarray(sample.prev_blocks, np.float64),
        EB2=final_blocks_second_moment(sample), partial=True, group_width=None,
    )  # fmt: skip
    few = caps[::10]
    assert model.hit_ratio(few) == pytest.approx(exact.hit_ratio(few), abs=TOLERANCE)


@pytest.mark.parametrize(
    ("refinement", "grouped"), [("partial", True), ("partial", False), ("fluctuation", False)]
)
def test_a_capacitys_hit_ratio_is_the_same_whatever_is_asked_beside_it(
    refinement: str, grouped: bool
) -> None:
    """The forecast's hit ratio at N and its GPU tier's share (h at N among the tiers' reaches)
    are one number: h(N) asked alone, in a curve or in a chunk is bit for bit the same."""
    sample = chat_100k()
    model = sample_model(sample, 1.0, "state", "whole", refinement)
    assert isinstance(model, FluctuationModel)
    if not grouped:
        W, _, v = revisit_weights(sample, "state", "whole")
        model = FluctuationModel(
            model.base, W[:5_000], v[:5_000], np.asarray(sample.prev_blocks[:5_000], np.float64),
            EB2=final_blocks_second_moment(sample), partial=refinement == "partial",
            group_width=None,
        )  # fmt: skip
    assert (model.groups is not None) == grouped
    caps = np.linspace(100.0, 20_000.0, 37)
    together = model.hit_ratio(caps)
    alone = np.array([float(model.hit_ratio(c)) for c in caps])
    in_threes = np.concatenate([model.hit_ratio(caps[i : i + 3]) for i in range(0, caps.size, 3)])
    assert np.array_equal(together, alone) and np.array_equal(together, in_threes)
