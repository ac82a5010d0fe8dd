"""Forecast variants on a WorkloadSample, result shape and degenerate inputs."""

from __future__ import annotations

import time

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcast.stats.delays import Empirical, Exponential
from kvcast.stats.forecast import (
    DEFAULT_DISPLACEMENT,
    DEFAULT_REFINEMENT,
    DEFAULT_VARIANT,
    VARIANTS,
    Forecast,
    forecast_from_moments,
    forecast_from_sample,
    revisit_weights,
    sample_model,
)
from kvcast.stats.sample import IntentMoments, WorkloadSample


def make_sample(
    rng: np.random.Generator,
    n_conv: int,
    intents: dict[str, tuple[float, float, float]],
    lambda0: float | None = 1.0,
    const_blocks: bool = False,
) -> WorkloadSample:
    """Synthetic conversations: per intent (mean extra turns, mean delay s, mean new blocks)."""
    names = tuple(intents)
    sums = {
        n: dict(conversations=0, sum_R=0.0, sum_H=0.0, sum_H_hash=0.0, sum_B=0.0, sum_M=0.0)
        for n in names
    }
    delay, prev, intent, turn = [], [], [], []
    for _ in range(n_conv):
        c = int(rng.integers(len(names)))
        extra, mean_delay, mean_new = intents[names[c]]
        m = 1 + int(rng.poisson(extra))
        if const_blocks:
            r = np.cumsum(np.full(m, int(mean_new)))
        else:
            r = np.cumsum(1 + rng.poisson(mean_new, size=m))
        s = sums[names[c]]
        s["conversations"] += 1
        s["sum_R"] += float(r.sum())
        s["sum_H"] += float(r[:-1].sum())
        s["sum_H_hash"] += float(np.maximum(r[:-1] - 1, 0).sum())
        s["sum_B"] += float(r[-1])
        s["sum_M"] += m
        for t in range(1, m):
            delay.append(rng.exponential(mean_delay))
            prev.append(int(r[t - 1]))
            intent.append(c)
            turn.append(t)
    return WorkloadSample(
        intents=names,
        by_intent=tuple(IntentMoments(**sums[n]) for n in names),
        delay_s=np.array(delay, dtype=np.float64),
        prev_blocks=np.array(prev, dtype=np.int64),
        intent=np.array(intent, dtype=np.int32),
        turn=np.array(turn, dtype=np.int32),
        lambda0=lambda0,
    )


MIX = {"chat": (1.0, 40.0, 8.0), "code": (6.0, 200.0, 20.0), "math": (3.0, 90.0, 12.0)}


def test_variants_run_and_are_json_safe() -> None:
    s = make_sample(np.random.default_rng(1), 2000, MIX, lambda0=2.0)
    for variant in VARIANTS:
        for disp in ("whole", "hashable"):
            f = forecast_from_sample(
                s,
                3000,
                16,
                2,
                variant=variant,
                displacement=disp,
                capacities=[500, 3000, 20000],
                target=0.3,
                kv_bytes_per_token=1000,
            )
            d = _json(f)
            assert d["status"] == "ok" and 0 < d["hit_ratio"] < d["upper_bound"] < 1
            assert d["lambda_per_s"] == 1.0 and d["instances"] == 2
            assert d["variant"] == variant
            assert d["displacement"] == ("hashable" if variant == "paper" else disp)
            assert [p["capacity_blocks"] for p in d["curve"]] == [500, 3000, 20000]
            hs = [p["hit_ratio"] for p in d["curve"]]
            assert hs == sorted(hs)
            req = d["required_capacity"]
            assert req["status"] == "ok" and req["bytes"] == req["blocks"] * 16 * 1000
            assert len(d["by_intent"]) == 3
            assert sum(i["share"] for i in d["by_intent"]) == pytest.approx(1.0)


def test_single_class_keys_and_default() -> None:
    s = make_sample(np.random.default_rng(2), 1000, MIX)
    f = forecast_from_sample(s, 2000)
    paper = forecast_from_sample(s, 2000, variant="paper")
    assert (f.variant, f.displacement, f.refinement) == (
        DEFAULT_VARIANT,
        DEFAULT_DISPLACEMENT,
        DEFAULT_REFINEMENT,
    )
    assert f.hit_ratio_single_class == paper.hit_ratio == paper.hit_ratio_single_class
    tot = s.total()
    assert pytest.approx(tot.sum_R / tot.conversations) == f.A_R
    assert f.upper_bound == pytest.approx(tot.sum_H_hash / tot.sum_R)


def test_paper_equals_intent_with_one_intent() -> None:
    s = make_sample(np.random.default_rng(3), 1500, {"only": (3.0, 120.0, 10.0)})
    for cap in (200, 1000, 5000):
        a = forecast_from_sample(s, cap, variant="paper")
        b = forecast_from_sample(
            s, cap, variant="intent", displacement="hashable", refinement="none"
        )
        assert b.hit_ratio == pytest.approx(a.hit_ratio, rel=1e-12)
        assert b.characteristic_time_s == pytest.approx(a.characteristic_time_s, rel=1e-12)
        c = forecast_from_sample(s, cap, variant="paper_whole")
        d = forecast_from_sample(s, cap, variant="intent", displacement="whole")
        assert d.hit_ratio == pytest.approx(c.hit_ratio, rel=1e-12)


def test_state_equals_sample_when_blocks_constant_per_state() -> None:
    s = make_sample(np.random.default_rng(4), 1500, MIX, const_blocks=True)
    for disp in ("whole", "hashable"):
        _, ws, vs = revisit_weights(s, "state", disp)
        _, wp, vp = revisit_weights(s, "sample", disp)
        assert np.allclose(ws, wp) and np.allclose(vs, vp)
        for cap in (300, 3000):
            a = forecast_from_sample(s, cap, variant="state", displacement=disp)
            b = forecast_from_sample(s, cap, variant="sample", displacement=disp)
            assert a.hit_ratio == pytest.approx(b.hit_ratio, rel=1e-12)


def test_intent_breakdown_decomposes_hit_ratio() -> None:
    s = make_sample(np.random.default_rng(5), 3000, MIX)
    f = forecast_from_sample(s, 2500, variant="intent", displacement="hashable")
    L, tot = s.conversations, s.total()
    recomposed = sum(i.hit_ratio * i.A_R * i.conversations for i in f.by_intent) / tot.sum_R
    assert recomposed == pytest.approx(f.hit_ratio, rel=1e-9)
    assert f.conversations == L


def test_whole_displacement_lowers_hit_ratio() -> None:
    s = make_sample(np.random.default_rng(6), 2000, MIX)
    whole = forecast_from_sample(s, 2000, variant="intent", displacement="whole")
    hashable = forecast_from_sample(s, 2000, variant="intent", displacement="hashable")
    assert whole.characteristic_time_s < hashable.characteristic_time_s
    assert whole.hit_ratio <= hashable.hit_ratio


def test_instances_split_the_rate() -> None:
    s = make_sample(np.random.default_rng(8), 1000, MIX, lambda0=4.0)
    a = forecast_from_sample(s, 1500, instances=4)
    s1 = make_sample(np.random.default_rng(8), 1000, MIX, lambda0=1.0)
    b = forecast_from_sample(s1, 1500, instances=1)
    assert a.hit_ratio == b.hit_ratio and a.lambda_per_s == 1.0 and a.lambda0 == 4.0


def test_moments_path_matches_sample_path_single_intent() -> None:
    s = make_sample(np.random.default_rng(9), 1500, {"only": (3.0, 120.0, 10.0)})
    tot, L = s.total(), s.conversations
    a = forecast_from_sample(s, 1200, variant="paper")
    b = forecast_from_moments(
        lambda0=1.0,
        A_R=tot.sum_R / L,
        A_H_hash=tot.sum_H_hash / L,
        E_B=tot.sum_B / L,
        delay=Empirical(s.delay_s),
        capacity_blocks=1200,
    )
    assert b.hit_ratio == pytest.approx(a.hit_ratio, rel=1e-12)
    assert b.by_intent == () and b.variant == "paper"


def _json(f: Forecast) -> dict:
    d = f.to_dict()
    assert orjson.loads(orjson.dumps(d)) == d
    return d


def test_degenerate_statuses() -> None:
    rng = np.random.default_rng(10)
    empty = WorkloadSample(
        (),
        (),
        np.zeros(0),
        np.zeros(0, np.int64),
        np.zeros(0, np.int32),
        np.zeros(0, np.int32),
        lambda0=None,
    )
    d = _json(forecast_from_sample(empty, 1000, capacities=[10, 20], target=0.5))
    assert d["status"] == "no_data" and d["hit_ratio"] is None and d["A_R"] is None
    assert d["required_capacity"]["status"] == "no_data"
    assert d["curve"][0]["hit_ratio"] is None

    single_turn = make_sample(rng, 100, {"chat": (0.0, 10.0, 5.0)})
    d = _json(forecast_from_sample(single_turn, 1000, target=0.1))
    assert d["status"] == "no_reuse" and d["hit_ratio"] == 0.0 and d["upper_bound"] == 0.0
    assert d["characteristic_time_s"] is not None
    assert d["required_capacity"]["status"] == "unreachable"

    for lambda0, status in ((None, "no_rate"), (0.0, "zero_rate")):
        s = make_sample(rng, 500, MIX, lambda0=lambda0)
        d = _json(forecast_from_sample(s, 1000, target=0.1, capacities=[5, 50]))
        assert d["status"] == status and d["characteristic_time_s"] is None
        assert d["hit_ratio"] == d["upper_bound"] > 0
        assert d["required_capacity"]["status"] == status
        assert all(p["hit_ratio"] == d["upper_bound"] for p in d["curve"])
        assert all(i["hit_ratio"] == pytest.approx(i["upper_bound"]) for i in d["by_intent"])

    s = make_sample(rng, 500, MIX)
    d = _json(forecast_from_sample(s, 1000, target=0.99))
    assert d["status"] == "ok" and d["required_capacity"]["status"] == "unreachable"
    d = _json(
        forecast_from_moments(
            lambda0=1.0,
            A_R=10,
            A_H_hash=5,
            E_B=3,
            delay=Exponential(100),
            capacity_blocks=100,
            target=0.5,
        )
    )
    assert d["required_capacity"]["status"] == "unreachable"


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        (dict(capacity_blocks=0), "capacity_blocks"),
        (dict(capacity_blocks=float("nan")), "capacity_blocks"),
        (dict(instances=0), "instances"),
        (dict(block_size=0), "block_size"),
        (dict(target=1.0), "target"),
        (dict(capacities=[10, -1]), "capacity"),
        (dict(variant="nope"), "variant"),
        (dict(displacement="half"), "displacement"),
    ],
)
def test_invalid_arguments(kwargs: dict, msg: str) -> None:
    s = make_sample(np.random.default_rng(11), 50, MIX)
    args = dict(capacity_blocks=100) | kwargs
    with pytest.raises(ValueError, match=msg):
        forecast_from_sample(s, **args)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from(VARIANTS), st.floats(50, 50_000))
def test_sample_required_capacity_round_trip(seed: int, variant: str, cap: float) -> None:
    s = make_sample(np.random.default_rng(seed), 60, MIX, lambda0=1.5)
    model = sample_model(s, 1.5, variant, "whole")
    h = float(model.hit_ratio(cap))
    f = forecast_from_sample(s, cap, variant=variant, target=h if 0 < h < 1 else None)
    if f.required_capacity is not None:
        assert f.required_capacity.blocks is not None
        assert f.required_capacity.blocks <= np.ceil(cap)
        assert float(model.hit_ratio(f.required_capacity.blocks)) >= h


def test_curve_speed_100k() -> None:
    rng = np.random.default_rng(12)
    n = 100_000
    model = sample_model(
        WorkloadSample(
            ("a",),
            (IntentMoments(30_000, 1e6, 6e5, 5e5, 3e5, 1.3e5),),
            rng.exponential(135, n),
            rng.integers(1, 60, n),
            np.zeros(n, np.int32),
            np.ones(n, np.int32),
            1.0,
        ),
        1.0,
        "sample",
    )
    caps = np.linspace(100, 100_000, 100)
    start = time.perf_counter()
    for _ in range(20):
        _, h = model.curve(caps)
    elapsed = (time.perf_counter() - start) / 20
    assert np.all(np.diff(h) >= 0)
    assert elapsed < 0.05, elapsed
