"""The client benchmark runs and reports its rows against same-run baselines."""

from __future__ import annotations

from kvcast.exporters.kit.index import PriorityIndex
from kvcast.lab.bench.client_bench import run_client_bench, synthetic_table


def test_bench_rows() -> None:
    result = run_client_bench(calls=5_000, repeats=1)
    rows = result.rows()
    assert [row[0] for row in rows] == [
        "IAC priority (engine client, 992 states)",
        "rank 1,000 eviction candidates (IAC)",
        "density priority (engine client, 992 states)",
        "rank 1,000 eviction candidates (density, from tuples)",
        "rank 1,000 eviction candidates (density, from columns)",
        "vLLM free queue, free (tagged) + take, 64-block requests",
    ]
    assert all(len(row) == 4 for row in rows)
    assert result.priorities_per_s > 0 and result.rank_1000_s > 0
    assert result.density_rank_1000_s > 0 and result.density_columns_rank_1000_s > 0
    assert set(result.to_dict()) >= {"priority_ns", "rank_1000_s", "dict_lookups_per_s"}


def test_synthetic_table_is_full() -> None:
    assert len(PriorityIndex(synthetic_table())) == 31 * 32


def test_columns_rank_as_the_tuples_do() -> None:
    """The benchmark's two density rankings are one order: candidates oldest first, so that
    the columns' stable sort breaks ties as the tuples' age term does."""
    import random

    index = PriorityIndex({**synthetic_table(), "characteristic_time_s": 300.0})
    rng = random.Random(3)
    nodes = [(f"intent-{rng.randrange(31):02d}", rng.randint(1, 40), rng.expovariate(1 / 200),
              1.0) for _ in range(500)]  # fmt: skip
    nodes += [(i, t, a, s) for i, t, a, s in nodes[:50]]  # exact ties
    nodes.sort(key=lambda n: -n[2])
    curves = [index.curve(i, t).values for i, t, _a, _s in nodes]
    assert index.rank_by_density(curves, [n[2] for n in nodes]) == index.rank(nodes, "density")
    sizes = [float(rng.randint(1, 64)) for _ in nodes]
    sized = [(i, t, a, s) for (i, t, a, _), s in zip(nodes, sizes, strict=True)]
    assert index.rank_by_density(curves, [n[2] for n in nodes], sizes) == index.rank(
        sized, "density"
    )
