"""From a solved hit-ratio model to the forecast document: the inputs' checks, the rate per
instance, the capacity a target needs, and the ``Forecast`` with its curve and tiers.

Units: blocks, seconds, conversations per second. Shared by the entry points of
:mod:`kvcast.stats.forecast` (from a sample, from moments, the tier planner).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvcast.stats.forecast_result import (
    CurvePoint,
    Forecast,
    RequiredCapacity,
    finite_or_none,
)
from kvcast.stats.meanfield import HitRatioModel
from kvcast.stats.tiers import (
    DEFAULT_TIER_MODE,
    GPU,
    Tier,
    TierForecast,
    check_tiers,
    plan_tier,
    stack,
    tier_shares,
)


def check_inputs(
    capacity_blocks: float,
    block_size: int,
    instances: int,
    lambda0: float | None,
    capacities: Sequence[float] | None,
    target: float | None,
    kv_bytes_per_token: float | None,
    tiers: Sequence[Tier] = (),
    tier_mode: str = DEFAULT_TIER_MODE,
    target_tier: str = GPU,
) -> None:
    """ValueError naming the first input out of range (blocks, tokens, conversations/s)."""
    if not (math.isfinite(capacity_blocks) and capacity_blocks > 0):
        raise ValueError(f"capacity_blocks must be > 0, got {capacity_blocks}")
    if int(block_size) != block_size or block_size < 1:
        raise ValueError(f"block_size must be a positive integer (tokens), got {block_size}")
    if int(instances) != instances or instances < 1:
        raise ValueError(f"instances must be a positive integer, got {instances}")
    if lambda0 is not None and not (math.isfinite(lambda0) and lambda0 >= 0):
        raise ValueError(f"lambda0 must be >= 0 conversations/s, got {lambda0}")
    for c in capacities or ():
        if not (math.isfinite(c) and c > 0):
            raise ValueError(f"every capacity must be > 0 blocks, got {c}")
    if target is not None and not (0 < target < 1):
        raise ValueError(f"target hit ratio must be strictly between 0 and 1, got {target}")
    if kv_bytes_per_token is not None and not (kv_bytes_per_token > 0):
        raise ValueError(f"kv_bytes_per_token must be > 0, got {kv_bytes_per_token}")
    check_tiers(capacity_blocks, tiers, tier_mode)
    names = [GPU, *(t.name for t in tiers)]
    if target_tier not in names:
        raise ValueError(f"tier {target_tier!r} to plan is not in the stack ({', '.join(names)})")


def instance_rate(lambda0: float | None, instances: int) -> tuple[float, str | None]:
    """Per-instance rate (0 when unknown) and the rate status, if degenerate."""
    if lambda0 is None:
        return 0.0, "no_rate"
    if lambda0 == 0:
        return 0.0, "zero_rate"
    return lambda0 / instances, None


def required_capacity(
    model: HitRatioModel,
    target: float,
    block_size: int,
    kv_bytes_per_token: float | None,
    degenerate: str | None,
    capacities: Sequence[tuple[str, float]] = (),
    tier_mode: str = DEFAULT_TIER_MODE,
    tier: str = GPU,
) -> RequiredCapacity:
    """The capacity (blocks, and bytes with ``kv_bytes_per_token``) of ``tier`` in the stack
    of ``capacities`` for the total hit ratio ``target``; ``degenerate``: the rate status that
    makes it unknown."""
    if degenerate is not None:
        return RequiredCapacity(target, None, None, degenerate, tier)
    plan = plan_tier(model.hit_ratio, model.required_capacity, capacities, tier_mode, tier, target)
    if plan.blocks is None:
        return RequiredCapacity(target, None, None, plan.status, tier)
    nbytes = None
    if kv_bytes_per_token is not None:
        nbytes = math.ceil(plan.blocks * block_size * kv_bytes_per_token)
    return RequiredCapacity(target, plan.blocks, nbytes, plan.status, tier)


def assemble_forecast(
    model: HitRatioModel,
    single: HitRatioModel,
    fields: dict[str, Any],
    capacities: Sequence[float] | None,
    target: float | None,
    kv_bytes_per_token: float | None,
    rate_status: str | None,
    tiers: Sequence[Tier] = (),
    tier_mode: str = DEFAULT_TIER_MODE,
    target_tier: str = GPU,
) -> tuple[Forecast, float]:
    """Solve at ``fields['capacity_blocks']`` (plus curve, tiers and target) and build the
    Forecast."""
    n = fields["capacity_blocks"]
    layers = stack(n, tiers)
    shares = tier_shares(model.hit_ratio, [c for _, c in layers], tier_mode)
    t_c = float(model.characteristic_time(n))
    upper = model.upper_bound
    status = rate_status or (
        "no_reuse" if upper <= 0 else ("never_full" if not math.isfinite(t_c) else "ok")
    )
    curve = None
    if capacities is not None:
        ts, hs = model.curve(np.asarray(list(capacities), dtype=np.float64))
        curve = tuple(
            CurvePoint(float(c), float(h), finite_or_none(t))
            for c, t, h in zip(capacities, ts, hs, strict=True)
        )
    req = None
    if target is not None:
        req = required_capacity(
            model, target, fields["block_size"], kv_bytes_per_token, rate_status,
            layers, tier_mode, target_tier,
        )  # fmt: skip
    forecast = Forecast(
        status=status,
        hit_ratio=float(model.hit_ratio(n)),
        hit_ratio_single_class=float(single.hit_ratio(n)),
        upper_bound=upper,
        characteristic_time_s=finite_or_none(t_c),
        characteristic_time_single_class_s=finite_or_none(float(single.characteristic_time(n))),
        curve=curve,
        required_capacity=req,
        tier_mode=tier_mode,
        tiers=tuple(TierForecast(name, c, h) for (name, c), h in zip(layers, shares, strict=True)),
        **fields,
    )
    return forecast, t_c
