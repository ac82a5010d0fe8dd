"""The refresh-cost benchmark times each partition count over the same conversations."""

from __future__ import annotations

import pytest

from kvcast.lab.bench.refresh_cost import run_refresh_cost

pytestmark = pytest.mark.integration


def test_every_partition_count_merges_into_the_same_buckets(redis_url: str) -> None:
    rows = run_refresh_cost(redis_url, partitions=(1, 4), conversations=300, repeats=1)
    assert [row.partitions for row in rows] == [1, 4]
    assert rows[0].buckets == rows[1].buckets > 0  # the same conversations, however split
    assert all(row.load_s > 0 and row.compute_s > 0 for row in rows)


def test_the_cluster_layout_reads_the_same_buckets(redis_url: str, redis_cluster) -> None:
    rows = run_refresh_cost(redis_url, partitions=(1, 4), conversations=300, repeats=1,
                            cluster_url=redis_cluster.url)  # fmt: skip
    assert [(row.store, row.partitions) for row in rows] == [
        ("redis", 1),
        ("redis", 4),
        ("cluster", 1),
        ("cluster", 4),
    ]
    assert len({row.buckets for row in rows}) == 1 and rows[0].buckets > 0
    assert all(row.load_s > 0 and row.compute_s > 0 for row in rows)
