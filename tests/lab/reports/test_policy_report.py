"""The policy report on a small generated workload: table, rows and figures."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kvcast.lab.reports.policy_plot import plot_report
from kvcast.lab.reports.policy_report import generated_workload, run_policy_report


def test_small_report_table_rows_and_plot(tmp_path: Path) -> None:
    wl = replace(
        generated_workload("mixed", lambda0=1.0, conversations=200, seed=1), capacities=(50, 400)
    )
    policies = (("LRU", "lru", {}), ("IAC", "iac", {}), ("TB+S", "tbs", {}))
    report = run_policy_report([wl], policies)
    rows = report.rows()
    assert len(rows) == 6 and {r["policy"] for r in rows} == {"LRU", "IAC", "TB+S"}
    for n in (50, 400):
        assert report.hit(wl.name, n, "TB+S") >= report.hit(wl.name, n, "LRU")
    md = report.to_markdown()
    assert "| N (blocks) | LRU | IAC | TB+S | IAC vs LRU |" in md and "forecast" in md
    assert len(report.forecasts) == 2 and report.forecasts[0].forecast is not None
    pytest.importorskip("matplotlib")
    paths = plot_report(report, tmp_path)
    assert [p.name for p in paths] == ["policies_mixed.png"] and paths[0].stat().st_size > 0
