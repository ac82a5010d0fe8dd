"""The parametric delay laws' density and median (kvcast.stats.delays), in seconds."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import quad

from kvcast.stats.delays import Exponential, LogNormal

LAWS = [Exponential(135.0), Exponential(0.2), LogNormal(4.6, 1.0), LogNormal(0.5, 2.5)]


@pytest.mark.parametrize("law", LAWS, ids=lambda law: law.describe())
def test_the_density_integrates_to_the_cdf(law: Exponential | LogNormal) -> None:
    for t in (0.05, 1.0, 30.0, 99.5, 600.0):
        mass = quad(lambda u: float(law.pdf(u)), 0.0, t, limit=200)[0]
        assert mass == pytest.approx(float(law.cdf(t)), rel=1e-7, abs=1e-12)


@pytest.mark.parametrize("law", LAWS, ids=lambda law: law.describe())
def test_the_density_is_zero_off_the_positive_axis_and_vectorised(
    law: Exponential | LogNormal,
) -> None:
    dens = law.pdf(np.array([-5.0, 0.0, 2.0]))
    assert dens.shape == (3,)
    assert dens[:2].tolist() == [0.0, 0.0]
    assert dens[2] > 0


@pytest.mark.parametrize("law", LAWS, ids=lambda law: law.describe())
def test_the_median_is_where_the_cdf_reaches_one_half(law: Exponential | LogNormal) -> None:
    assert float(law.cdf(law.median)) == pytest.approx(0.5, rel=1e-12)
    assert law.median == pytest.approx(float(law.ppf(0.5)), rel=1e-12)


def test_the_closed_form_medians() -> None:
    assert Exponential(135.0).median == 135.0 * math.log(2.0)
    assert LogNormal(4.6, 1.0).median == math.exp(4.6)
