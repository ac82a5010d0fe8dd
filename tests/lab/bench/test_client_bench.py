"""The client benchmark runs and reports its rows against same-run baselines."""

from __future__ import annotations

from kvcast.lab.bench.client_bench import run_client_bench, synthetic_table
from kvcast.stats.priority import PriorityIndex


def test_bench_rows() -> None:
    result = run_client_bench(calls=5_000, repeats=1)
    rows = result.rows()
    assert [row[0] for row in rows] == [
        "IAC priority (engine client, 992 states)",
        "rank 1,000 eviction candidates (IAC)",
        "vLLM free queue, free (tagged) + take, 64-block requests",
    ]
    assert all(len(row) == 4 for row in rows)
    assert result.priorities_per_s > 0 and result.rank_1000_s > 0
    assert set(result.to_dict()) >= {"priority_ns", "rank_1000_s", "dict_lookups_per_s"}


def test_synthetic_table_is_full() -> None:
    assert len(PriorityIndex(synthetic_table())) == 31 * 32
