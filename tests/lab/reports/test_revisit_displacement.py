"""The revisit-displacement report: what it measures, and what it found on the Mooncake trace."""

from __future__ import annotations

import numpy as np
import pytest

from kvcast.lab.reports.revisit_displacement import (
    RESCALINGS,
    displacement_report,
    main,
    measure_revisits,
)
from kvcast.lab.reports.workloads import DEFAULT_MOONCAKE, mooncake_workload
from kvcast.lab.sim.trace import SimTrace


def test_a_revisit_counts_the_distinct_blocks_and_the_load_between_its_requests():
    # Requests in order: a [1 2], b [3 4], c [3 5] (3 becomes shared), a again, b again.
    trace = SimTrace.from_columns(
        ["a", "b", "c", "a", "b"],
        [1, 1, 1, 2, 2],
        [100.0, 101.0, 102.0, 104.0, 107.0],
        [32, 32, 32, 48, 48],
        block_size=16,
        block_hashes=[[1, 2], [3, 4], [3, 5], [1, 2, 6], [3, 4, 7]],
    )
    revisits = measure_revisits(trace)
    assert revisits.request.tolist() == [3, 4]
    assert revisits.delay_s.tolist() == [4.0, 6.0]
    # a's revisit: {3, 4, 5} referenced in between (3 twice: once); 2 + 2 input blocks.
    # b's: {3, 5} then {1, 2, 6}; 2 + 3 input blocks.
    assert revisits.displacement.tolist() == [3.0, 5.0]
    assert revisits.load.tolist() == [4.0, 5.0]
    # a reuses both of its blocks; b only block 4, since c made block 3 shared.
    assert revisits.own.tolist() == [2.0, 1.0]
    assert [p.tolist() for p in revisits.own_positions] == [[0, 1], [1]]


@pytest.fixture(scope="module")
def mooncake_report():
    return displacement_report(mooncake_workload(DEFAULT_MOONCAKE))


def test_own_hits_are_the_rule_at_the_realized_displacement(mooncake_report):
    """Block LRU is a stack algorithm: with the realized displacement nothing is left to model."""
    for row in mooncake_report.capacities:
        assert row.simulated_own == pytest.approx(row.realized_rule_own, abs=1e-12)
        assert row.simulated_own > 0


def test_on_the_mooncake_trace_short_gaps_meet_more_displacement_than_the_forecast_says(
    mooncake_report,
):
    # The revisits crowd the busy end of the 17-minute trace.
    first, last = mooncake_report.periods[0], mooncake_report.periods[-1]
    assert last.revisits_per_s > 10 * first.revisits_per_s
    assert last.blocks_per_s > 1.5 * first.blocks_per_s
    short = [d for d in mooncake_report.delays if d.hi_s <= 32]
    assert short and all(d.realized > 1.05 * d.forecast for d in short)
    assert all(d.load_ratio > 1.2 for d in short)
    # The spread is the model's: within a quarter in every bin with 100+ revisits.
    for d in mooncake_report.delays:
        if d.revisits >= 100:
            assert d.forecast_spread == pytest.approx(d.realized_spread, rel=0.25)


def test_knowing_the_revisits_load_brings_every_mooncake_tier_within_the_target(mooncake_report):
    errors_now, errors_scaled = [], []
    load_scaled = list(RESCALINGS).index("load-scaled")
    for _gpu, _host, _mode, _simulated, errors in mooncake_report.host_tier():
        errors_now.append(errors[0])
        errors_scaled.append(errors[1 + load_scaled])
    assert max(np.abs(errors_now)) > 0.02  # what the tier validation reports as missed
    assert max(np.abs(errors_scaled)) < 0.02


def test_the_command_prints_and_writes_its_tables(tmp_path, capsys):
    out = tmp_path / "displacement.md"
    assert main(["--trace", str(DEFAULT_MOONCAKE), "--markdown", str(out)]) == 0
    printed = capsys.readouterr().out
    assert out.read_text() == printed
    tables = printed.strip().split("\n\n")
    assert [t.splitlines()[0].split(" | ")[0] for t in tables] == [
        "| period (s)",
        "| delay (s)",
        "| N (blocks)",
        "| GPU",
        "Rescalings of d(W) by each delay bin's load:",
    ]
    assert "| 2,000 | 16,000 | exclusive |" in tables[3]
    assert tables[4].startswith("Rescalings of d(W)")
