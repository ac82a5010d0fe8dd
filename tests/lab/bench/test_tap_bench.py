"""The tap benchmark times both paths in one run and reports the difference."""

from __future__ import annotations

from kvcast.lab.bench.tap_bench import run_tap_bench


def test_the_tap_bench_reports_both_paths_and_their_difference() -> None:
    result = run_tap_bench(requests=40, streams=4, rounds=2)
    assert result.requests == 40
    assert result.direct_median_s > 0 and result.tap_median_s > 0
    assert result.tap_stream_median_s >= 0.01  # the stand-in's words are 10 ms apart
    assert [row[0] for row in result.rows()] == [
        "kvcast tap, chat request (median)",
        "kvcast tap, chat request (p99)",
        "kvcast tap, streamed chat (median, last byte)",
    ]
