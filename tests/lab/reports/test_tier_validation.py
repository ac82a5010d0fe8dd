"""The tiered forecast against the tiered simulator: the validation's quick grid, end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcast.lab.reports.tier_validation import (
    TierGrid,
    TierPoint,
    TierReport,
    evaluate_preset,
    main,
)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    """The one command, on the quick grid: its exit code and where it wrote."""
    out = tmp_path_factory.mktemp("tiers")
    code = main(
        ["--quick", "--jobs", "1", "--markdown", str(out / "t.md"), "--json", str(out / "t.json"),
         "--plot", str(out / "t.png")]
    )  # fmt: skip
    return code, out


@pytest.fixture(scope="module")
def report(outputs: tuple[int, Path]) -> TierReport:
    document = json.loads((outputs[1] / "t.json").read_text())
    return TierReport(TierGrid.quick(), [TierPoint(**p) for p in document["points"]])


def test_every_mode_and_capacity_pair_is_a_point(report: TierReport) -> None:
    grid = TierGrid.quick()
    got = {(p.mode, p.gpu_blocks, p.host_blocks) for p in report.points}
    assert got == {(m, g, h) for m in grid.modes for g in grid.gpu for h in grid.host}
    assert report.workloads() == ["shared_system"]


def test_the_gpu_tier_does_not_depend_on_the_tiers_below(report: TierReport) -> None:
    for mode in ("exclusive", "inclusive"):
        for gpu in TierGrid.quick().gpu:
            pts = [p for p in report.points if p.mode == mode and p.gpu_blocks == gpu]
            assert len({p.simulated_gpu for p in pts}) == 1
            assert len({p.forecast_gpu for p in pts}) == 1


def test_an_inclusive_host_as_large_as_the_gpu_serves_nothing(report: TierReport) -> None:
    same = [p for p in report.points if p.mode == "inclusive" and p.gpu_blocks == p.host_blocks]
    assert same and all(p.simulated_host == p.forecast_host == 0 for p in same)


def test_exclusive_hosts_serve_more_than_inclusive_ones(report: TierReport) -> None:
    inclusive = {(q.gpu_blocks, q.host_blocks): q for q in report.points if q.mode == "inclusive"}
    for p in report.points:
        if p.mode == "exclusive":
            q = inclusive[(p.gpu_blocks, p.host_blocks)]
            assert p.simulated_host >= q.simulated_host and p.forecast_host >= q.forecast_host


def test_the_files_and_the_exit_code(outputs: tuple[int, Path], report: TierReport) -> None:
    code, out = outputs
    assert code == (0 if report.passed() else 1)
    text = (out / "t.md").read_text()
    assert "| shared_system | exclusive | 300 | 1,200 |" in text
    assert "max abs error per tier" in text
    assert (out / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_agent_preset_is_measured_over_its_steady_stream_as_one_stack() -> None:
    """``agent`` is measured by the requests of its steady part (its conversations run for
    hours), at capacities of its own. Exclusive tiers are one LRU of their summed capacity, so
    on those requests the stack (100 + 200 blocks) serves what a 300-block GPU tier does, in
    the simulation and in the forecast."""
    grid = TierGrid(
        modes=("exclusive",), agent_gpu=(100, 300), agent_host=(200,), agent_duration_s=6_000.0
    )
    points = {
        (p.mode, p.gpu_blocks): p for p in evaluate_preset("agent", grid) if p.workload == "agent"
    }
    assert set(points) == {(m, g) for m in grid.modes for g in (100, 300)}
    stack, alone = points[("exclusive", 100)], points[("exclusive", 300)]
    assert stack.simulated_gpu + stack.simulated_host == pytest.approx(alone.simulated_gpu)
    assert stack.forecast_gpu + stack.forecast_host == pytest.approx(alone.forecast_gpu)
    assert 0 < stack.simulated_gpu < alone.simulated_gpu < 1
