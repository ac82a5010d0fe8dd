"""The tap benchmark runs its three processes and prints every figure, at a tiny size."""

from __future__ import annotations

from kvcast.lab.bench.tap_bench import run_tap_bench


def test_the_tap_bench_reports_both_paths_and_their_difference() -> None:
    result = run_tap_bench(requests=40, streams=20, words=4, word_interval_s=0.05, ramp_s=0.1,
                           rounds=1)  # fmt: skip
    assert result.requests == 40 and result.streams == 20
    assert result.direct_median_s > 0 and result.tap_median_s > 0
    # timed in every stream: the words after the first, the finish chunk, the usage chunk
    assert result.chunks == 20 * (4 - 1 + 2)
    assert result.direct_first_byte_p50_s > 0 and result.tap_first_byte_p50_s > 0
    assert result.tap_rss_per_stream_bytes == result.tap_rss_per_stream_bytes  # measured (not NaN)
    assert result.tap_cpu_per_chunk_s > 0
    assert [row[0] for row in result.rows()] == [
        "kvcast tap, chat request (median)",
        "kvcast tap, chat request (p99)",
        "kvcast tap, 20 streams, first byte (p50)",
        "kvcast tap, 20 streams, first byte (p99)",
        "kvcast tap, 20 streams, chunk latency (p50)",
        "kvcast tap, 20 streams, chunk latency (p99)",
        "kvcast tap, 20 streams, memory per open stream",
        "kvcast tap, 20 streams, CPU per relayed chunk",
    ]
