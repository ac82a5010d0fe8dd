"""Forecast validation against Algorithm 1 (SPEC section 4) and the finite-size refinements."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from kvcast.lab.reports.validation import (
    PRODUCT,
    SINGLE_CLASS,
    ValidationGrid,
    estimator_names,
    measure_speed,
    run_validation,
    sample_from_events,
)
from kvcast.lab.reports.validation_plot import plot_report
from kvcast.lab.reports.validation_report import ValidationReport
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from kvcast.stats.finite_size import final_blocks_second_moment
from kvcast.stats.forecast import REFINEMENTS, forecast_from_sample, sample_model
from kvcast.stats.meanfield import EmpiricalModel


@pytest.fixture(scope="module")
def mixed_trace_sample():
    trace = generate(preset("mixed"), lambda0=1.0, duration_s=4000, seed=3)
    return trace, sample_from_events(trace.events(), 16)


def test_estimator_names_cover_every_selectable_option() -> None:
    names = estimator_names()
    assert len(names) == len(set(names)) == 9 * len(REFINEMENTS)
    assert SINGLE_CLASS in names and PRODUCT in names


def test_final_blocks_second_moment_matches_trace(mixed_trace_sample) -> None:
    trace, sample = mixed_trace_sample
    last = np.zeros(trace.conversations)
    last[trace.conversation] = trace.blocks  # rows are in time order: the last turn wins
    truth = float(np.mean(last**2))
    assert final_blocks_second_moment(sample) == pytest.approx(truth, rel=0.05)


def test_tagged_size_condition() -> None:
    W, R = np.array([10.0, 20.0, 30.0]), np.array([5.0, 50.0, 1.0])
    kw = dict(lam=1.0, E_B=2.0, A_R=10.0, L=3.0)
    plain = EmpiricalModel(W, R, R - 1, **kw)
    tagged = EmpiricalModel(W, R, R - 1, tagged_blocks=R, **kw)
    caps = np.linspace(1, 400, 200)
    assert np.all(tagged.hit_ratio(caps) <= plain.hit_ratio(caps))
    assert tagged.upper_bound == plain.upper_bound
    d = plain.displacement(W)
    for k in range(3):  # revisit k counts from N = d(W_k) + R_k on
        n = d[k] + R[k]
        assert tagged.hit_ratio(n) - tagged.hit_ratio(n - 1e-6) == pytest.approx((R[k] - 1) / 30)
    zero = EmpiricalModel(W, R, R - 1, tagged_blocks=0.0, **kw)
    assert np.array_equal(zero.hit_ratio(caps), plain.hit_ratio(caps))
    for target in (0.1, 0.5, 1.5):
        n = tagged.required_capacity(target)
        assert n is not None and tagged.hit_ratio(n) >= target
        assert tagged.hit_ratio(n - 1e-6) < target


@pytest.mark.parametrize("refinement", REFINEMENTS)
def test_refinements_are_monotone_and_invertible(mixed_trace_sample, refinement: str) -> None:
    _, sample = mixed_trace_sample
    model = sample_model(sample, sample.lambda0, "state", "whole", refinement)
    caps = np.geomspace(100, 50_000, 60)
    h = model.hit_ratio(caps)
    assert np.all(np.diff(h) >= -1e-12) and h[-1] <= model.upper_bound + 1e-12
    n = model.required_capacity(0.5 * model.upper_bound)
    assert n is not None and float(model.hit_ratio(n)) >= 0.5 * model.upper_bound - 1e-9
    f = forecast_from_sample(sample, 3000, refinement=refinement, target=0.3)
    assert f.refinement == refinement and f.hit_ratio == pytest.approx(float(model.hit_ratio(3000)))
    parts = sum(i.hit_ratio * i.A_R * i.conversations for i in f.by_intent)
    assert parts / sum(m.sum_R for m in sample.by_intent) == pytest.approx(f.hit_ratio, rel=1e-6)


def test_solver_speed_against_naive_baseline() -> None:
    s = measure_speed(100_000, 100)
    assert s.max_abs_diff < 1e-9
    assert s.exact_s < 0.005  # a few milliseconds for 100 points on 100,000 delays
    assert s.ratio > 20


@pytest.fixture(scope="module")
def quick_report() -> ValidationReport:
    return run_validation(ValidationGrid.quick())


@pytest.mark.slow
def test_single_intent_within_one_point(quick_report: ValidationReport) -> None:
    acc = quick_report.acceptance()["single_intent_mae"]
    assert acc["product_mae"] <= 0.01, acc
    # Each single-intent point on its own, too (N >= 2,000).
    for p in quick_report.points:
        if p.preset in ("single", "lognormal") and p.capacity_blocks >= 2000:
            assert abs(p.error(PRODUCT)) <= 0.01, p


@pytest.mark.slow
def test_mixed_intent_aware_where_single_class_is_off(quick_report: ValidationReport) -> None:
    acc = quick_report.acceptance()["mixed_where_single_class_off"]
    assert acc["points_off"] >= 1, acc  # the workload does break the single-class forecast
    assert acc["product_max_abs_error"] <= 0.015, acc


@pytest.mark.slow
def test_mean_field_error_shrinks_with_scale(quick_report: ValidationReport) -> None:
    acc = quick_report.acceptance()["theorem"]
    assert acc["passed"], acc
    errs = acc["abs_errors"][acc["estimator"]]
    assert errs[-1] < errs[0]


@pytest.mark.slow
def test_report_renders(quick_report: ValidationReport, tmp_path: Path) -> None:
    md = quick_report.to_markdown()
    for section in ("### Acceptance", "### Per point", "### Mean-field theorem", "### Solver"):
        assert section in md
    d = quick_report.to_dict()
    assert orjson.loads(orjson.dumps(d))["product"] == PRODUCT
    assert len(d["points"]) == 3 * 4 and len(d["theorem"]) == 3
    png = tmp_path / "v.png"
    plot_report(quick_report, png)
    assert png.stat().st_size > 10_000
