"""The shadow benchmark measures the sampled curve against the exact simulation in one run."""

from __future__ import annotations

import math

from kvcast.lab.bench.shadow_bench import curve_capacities, run_shadow_bench, workload
from kvcast.lab.sim.registry import simulate


def test_the_shadow_bench_measures_error_cpu_and_memory() -> None:
    result = run_shadow_bench(requests=4000, sampling=0.2, seeds=2, capacity_blocks=300)
    assert result.requests == 4000
    assert result.capacities == curve_capacities(300)
    trace = workload(4000, "single", 1.0, 0).sim_trace()
    for cap, ratio in zip(result.capacities[::4], result.exact_curve[::4], strict=True):
        assert ratio == simulate(trace, round(cap), "lru", "block", 0.0, 0.0).hit_ratio
    assert len(result.max_abs_errors) == 2 and 0 < result.max_abs_error < 0.2
    # The alternative design (one LRU per capacity) counts exactly what the stack counts.
    assert result.extra["per_capacity_lru_curve"] == result.shadow_curves[0]
    assert result.shadow_ns_per_event > 0 and result.exact_ns_per_event > 0
    assert result.apply_ns_per_event > 0
    assert 0 < result.stack_entries <= result.stack_limit == math.floor(16 * 300 * 0.2) + 1
    assert result.memory_bytes > 0
    assert [row[0].split(" ")[1] for row in result.rows()] == [
        "curve",
        "CPU",
        "CPU",
        "design:",
        "memory,",
    ]


def test_at_rate_one_the_shadow_is_the_exact_simulation() -> None:
    result = run_shadow_bench(requests=3000, exact_requests=2000, sampling=1.0, seeds=1)
    assert result.exact_requests == 2000
    assert result.max_abs_errors == [0.0]
