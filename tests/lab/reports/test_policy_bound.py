"""The (state, age) bound of the policy report: the empirical hit density is the definition
counted by hand and converges to the closed form of ``kvcast.exporters.kit.density``; the delays are
each request's to its conversation's next turn; the bound is run where the gap target is."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcast.exporters.kit.ages import AGE_BUCKETS, bucket_age
from kvcast.exporters.kit.density import hit_density
from kvcast.lab.reports.policy_bound import (
    BoundRow,
    bound_rows,
    empirical_curve,
    empirical_curves,
    next_turn_delays,
)
from kvcast.lab.reports.policy_report import generated_workload
from kvcast.lab.sim.registry import simulate
from kvcast.lab.sim.trace import SimTrace

delays_st = st.lists(st.one_of(st.floats(0.0, 5_000.0), st.just(math.inf)), min_size=1, max_size=60)


@settings(max_examples=100, deadline=None)
@given(delays_st, st.floats(1.0, 1_000.0), st.integers(0, AGE_BUCKETS - 1))
def test_the_empirical_density_is_hits_within_the_horizon_per_second_held(
    delays: list[float], horizon: float, k: int
) -> None:
    a = bucket_age(k)
    alive = [t for t in delays if t > a]
    hits = sum(1 for t in alive if t <= a + horizon)
    held = sum(min(t - a, horizon) for t in alive)
    expected = hits / held if held > 0 else 0.0
    assert empirical_curve(np.array(delays), horizon)[k] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(("p", "mu", "sigma", "horizon"), [(0.6, 4.0, 1.0, 60.0),
                                                           (0.9, 2.5, 0.5, 120.0)])  # fmt: skip
def test_the_empirical_density_of_a_large_sample_is_the_closed_form(p, mu, sigma, horizon) -> None:
    rng = np.random.default_rng(3)
    n = 400_000
    delays = np.where(rng.random(n) < p, np.exp(rng.normal(mu, sigma, n)), np.inf)
    curve = empirical_curve(delays, horizon)
    # ages where 2 % or more of the delays are still to come: enough of a sample to compare
    ages = [k for k in range(0, AGE_BUCKETS, 2) if bucket_age(k) < math.exp(mu + 2 * sigma)]
    assert len(ages) > 10
    for k in ages:
        closed_form = hit_density(bucket_age(k), horizon, p, mu, sigma)
        assert curve[k] == pytest.approx(closed_form, rel=0.03)


def trace(conversation: list[int], turn: list[int], timestamp: list[float]) -> SimTrace:
    n = len(conversation)
    return SimTrace(
        conversation=np.array(conversation), turn=np.array(turn),
        timestamp=np.array(timestamp, dtype=float), blocks=np.ones(n, dtype=np.int64),
        conversations=max(conversation) + 1,
    )  # fmt: skip


def test_a_requests_delay_is_to_its_own_conversations_next_turn() -> None:
    sim = trace([1, 0, 1, 0, 2, 0], [2, 1, 1, 3, 1, 2], [50.0, 0.0, 10.0, 200.0, 5.0, 30.0])
    assert next_turn_delays(sim).tolist() == [math.inf, 30.0, 40.0, math.inf, math.inf, 170.0]


def test_rare_states_take_their_intents_pooled_law() -> None:
    conversations, turns = [*range(40), 0], [1] * 40 + [2]
    sim = trace(conversations, turns, [float(k) for k in range(40)] + [100.0])
    curves = empirical_curves(sim, 60.0)
    assert curves[0] is curves[39]  # 40 requests of (unknown, 1): their own law
    assert curves[40] == empirical_curve(next_turn_delays(sim), 60.0)  # 1 of turn 2: pooled
    learn = np.arange(41) < 20  # a law learned on the first 20 requests only
    assert empirical_curves(sim, 60.0, learn)[0] == empirical_curve(
        next_turn_delays(sim)[:20], 60.0
    )


def test_the_bound_is_run_where_lru_holds_under_half_of_the_unlimited_cache() -> None:
    wl = generated_workload("mixed", conversations=600)
    window = (wl.warmup_fraction, wl.cooldown_fraction)
    unlimited = simulate(wl.trace, 10**9, "lru", "block", *window).hit_ratio
    lru = {n: simulate(wl.trace, n, "lru", "block", *window).hit_ratio for n in wl.capacities}
    rows = bound_rows(wl, horizons_s=(10.0, 600.0))
    assert [row.capacity_blocks for row in rows] == [n for n in lru if lru[n] < unlimited / 2]
    assert rows
    for row in rows:
        assert isinstance(row, BoundRow) and set(row.empirical) == {10.0, 600.0}
        assert row.lru == lru[row.capacity_blocks] < row.tbs
        assert 0.0 < row.best[1] <= 1.0


def test_every_capacity_runs_the_bound_at_all_of_them_and_the_table_says_the_share() -> None:
    """Issue 33's restated target: density at least 0.97 of the in-sample bound's hit ratio
    at every capacity of the report, not only where the gap target applies."""
    from dataclasses import replace

    from kvcast.lab.reports.policy_bound import BOUND_SHARE, to_markdown

    wl = replace(generated_workload("mixed", conversations=300, seed=2), capacities=(250, 16000))
    rows = bound_rows(wl, horizons_s=(60.0,), every_capacity=True)
    assert [row.capacity_blocks for row in rows] == [250, 16000]
    assert bound_rows(wl, horizons_s=(60.0,)) == rows[:1]  # 16,000 holds nearly everything
    for row in rows:
        assert row.share == row.density / row.empirical[60.0]
    assert BOUND_SHARE == 0.97
    fake = [BoundRow("w", 100, 0.1, 0.4, 0.2, {10.0: 0.25}),
            BoundRow("w", 200, 0.3, 0.5, 0.4, {10.0: 0.41})]  # fmt: skip
    md = to_markdown(fake)
    assert md.splitlines()[0].endswith("| density / in-sample |")
    assert "| w | 100 | 0.100 | 0.200 | 0.250 (H = 10 s) | 0.400 | +33% | +50% | 0.800 |" in md
    assert md.endswith("at 1 of 2 points; not at w N=100 (0.800).")


def two_turn_trace(delays: list[float]) -> SimTrace:
    """Conversation c: turn 1 at 10 c s, turn 2 ``delays[c]`` s later."""
    n = len(delays)
    conversations = [c for c in range(n) for _ in (1, 2)]
    turns = [1, 2] * n
    times = [t for c in range(n) for t in (10.0 * c, 10.0 * c + delays[c])]
    return trace(conversations, turns, times)


def test_a_cross_fitted_law_is_learned_on_the_other_folds_only() -> None:
    """``--cross-fit``: a request's law never includes its own conversation. Changing the
    delays of the even conversations leaves their curves as they were and moves the odd ones'
    (learned on the even ones)."""
    rng = np.random.default_rng(5)
    delays = np.ceil(rng.lognormal(3.0, 1.0, 80)).tolist()  # whole seconds: exact differences
    sim = two_turn_trace(delays)
    curves = empirical_curves(sim, 60.0, folds=2)
    odd_delays = np.array(delays[1::2])
    even_delays = np.array(delays[0::2])
    assert curves[0] == empirical_curve(odd_delays, 60.0)  # conversation 0, turn 1
    assert curves[2] == empirical_curve(even_delays, 60.0)  # conversation 1, turn 1
    assert curves[1] == empirical_curve(np.full(40, math.inf), 60.0)  # turn 2: never reused
    changed = [d * 3.0 if c % 2 == 0 else d for c, d in enumerate(delays)]
    moved = empirical_curves(two_turn_trace(changed), 60.0, folds=2)
    even = [2 * c for c in range(0, 80, 2)]  # turn-1 requests of even conversations
    odd = [2 * c for c in range(1, 80, 2)]
    assert all(moved[r] == curves[r] for r in even)
    assert all(moved[r] != curves[r] for r in odd)
    # One fold is the in-sample law.
    assert empirical_curves(sim, 60.0, folds=1)[0] == empirical_curve(np.array(delays), 60.0)


@pytest.mark.parametrize("argv", [["--cross-fit", "0"], ["--cross-fit", "2", "--warmup-law"]])
def test_the_bounds_command_rejects_a_cross_fit_it_cannot_run(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from kvcast.lab.reports.policy_bound import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert "--cross-fit takes K >= 2 folds, and not with --warmup-law" in capsys.readouterr().err


def test_a_seed_draws_every_generated_workload_from_it_and_mooncake_stays_the_trace() -> None:
    from kvcast.lab.reports.policy_report import default_workloads

    report = {wl.name: wl.description for wl in default_workloads(quick=True)}
    drawn = {wl.name: wl.description for wl in default_workloads(quick=True, seed=5)}
    assert drawn.keys() == report.keys()
    assert drawn["mooncake"] == report["mooncake"]
    for name in drawn.keys() - {"mooncake"}:
        assert "(seed 5)" in drawn[name], name
        assert "(seed 5)" not in report[name], name


def test_the_bounds_command_keeps_another_draw_out_of_the_docs_tables(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from kvcast.lab.reports.policy_bound import main

    with pytest.raises(SystemExit) as exited:
        main(["--seed", "5", "--markdown", "docs/policies.md"])
    assert exited.value.code == 2
    assert "--seed draws other workloads than the doc's tables" in capsys.readouterr().err
