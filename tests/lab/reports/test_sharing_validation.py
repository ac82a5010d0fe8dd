"""The forecast with shared blocks against block-level LRU: the validation's quick grid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcast.lab.reports.sharing_validation import (
    UNLIMITED,
    SharingGrid,
    SharingPoint,
    SharingReport,
    main,
)
from kvcast.lab.reports.workloads import steady_rate


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    """The one command, on the quick grid: its exit code and where it wrote."""
    out = tmp_path_factory.mktemp("sharing")
    code = main(
        ["--quick", "--markdown", str(out / "s.md"), "--json", str(out / "s.json"),
         "--plot", str(out / "s.png")]
    )  # fmt: skip
    return code, out


@pytest.fixture(scope="module")
def report(outputs: tuple[int, Path]) -> SharingReport:
    document = json.loads((outputs[1] / "s.json").read_text())
    points = [SharingPoint(**p) for p in document["points"]]
    return SharingReport(SharingGrid.quick(), points)


def test_the_quick_grid_covers_the_presets_and_the_mooncake_trace(report) -> None:
    assert report.workloads() == [
        "shared_system",
        "agentic",
        "mooncake synthetic",
        "mooncake synthetic, measured whole",
    ]
    assert all(0.0 <= p.simulated <= 1.0 for p in report.points)


def test_sharing_moves_the_forecast_toward_block_level_lru(report) -> None:
    for workload in report.workloads():
        points = [p for p in report.points if p.workload == workload]
        shared = sum(abs(p.shared - p.simulated) for p in points)
        alone = sum(abs(p.conversations_only - p.simulated) for p in points)
        assert shared < alone / 3, workload


def test_with_an_unlimited_cache_the_forecast_is_the_traces_reuse(report) -> None:
    # The ceiling has no characteristic time in it: only what the statistics counted.
    for p in report.points:
        if p.capacity_blocks >= UNLIMITED:
            assert abs(p.shared - p.simulated) < 0.02, p


def test_the_steady_rate_counts_starts_in_the_middle_of_the_arrivals() -> None:
    events = [{"turn": 1, "timestamp": float(t)} for t in range(0, 100)]
    events += [{"turn": 2, "timestamp": 50.0}, {"turn": 1, "timestamp": 500.0}]
    assert steady_rate(events, 100.0) == pytest.approx(61 / 60)


def test_the_command_writes_tables_json_and_plot(
    outputs: tuple[int, Path], report: SharingReport
) -> None:
    code, out = outputs
    document = json.loads((out / "s.json").read_text())
    assert code == (0 if document["passed"] else 1) and document["passed"] == report.passed()
    assert (out / "s.md").read_text().strip() == report.to_markdown()
    assert (out / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
