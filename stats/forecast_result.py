"""The forecast as it is returned: :class:`Forecast` and its parts, and their JSON form.

``kvcast.stats.forecast`` computes it; ``to_dict()`` is the contract of SPEC section 5 (the
JSON of ``/v1/forecast`` and ``kvcast forecast --json``): plain Python numbers, None in place
of NaN and infinity. Units: capacities in blocks, times in seconds, rates per second, hit
ratios in 0-1.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from kvcast.stats.tiers import DEFAULT_TIER_MODE, GPU, TierForecast

__all__ = [
    "CurvePoint",
    "Forecast",
    "IntentForecast",
    "RequiredCapacity",
    "SharedForecast",
    "finite_or_none",
]


@dataclass(frozen=True)
class IntentForecast:
    """One intent's moments and its own hit ratio A_H_hash_c F_c(T_C) / A_R_c at the shared T_C."""

    intent: str
    share: float
    conversations: int
    A_R: float
    A_H_hash: float
    E_B: float
    E_M: float
    hit_ratio: float
    upper_bound: float


@dataclass(frozen=True)
class SharedForecast:
    """The shared blocks' part of the forecast at the configured capacity (one instance).

    ``blocks``: shared blocks resident at T_C; ``hit_ratio``: their hits over all input blocks
    (part of ``Forecast.hit_ratio``); ``rate_per_s``: references to shared blocks per second;
    ``estimator``: the name of the estimator that made ``Forecast.hit_ratio``.
    """

    blocks: float | None
    hit_ratio: float | None
    rate_per_s: float | None
    estimator: str


@dataclass(frozen=True)
class CurvePoint:
    capacity_blocks: float
    hit_ratio: float | None
    characteristic_time_s: float | None


@dataclass(frozen=True)
class RequiredCapacity:
    """Smallest whole number of blocks per instance reaching ``target``; bytes if known.

    ``tier``: the tier planned (``gpu``: the whole cache, the tiers below ignored; another:
    that tier's blocks for the stack's total ``target``, the tiers above as configured,
    ``kvcast.stats.tiers.plan_tier``); ``already_reached``: the tiers above reach it (0 blocks).
    """

    target: float
    blocks: int | None
    bytes: int | None
    status: str  # ok | unreachable | already_reached | no_data | no_rate | zero_rate
    tier: str = GPU

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict, as it appears under ``required_capacity`` in ``Forecast.to_dict()``."""
        return _json_safe(asdict(self))


@dataclass(frozen=True)
class Forecast:
    """A forecast for one instance of ``instances``; ``to_dict()`` is the JSON contract.

    ``status``: ok | no_data (no completed conversations) | no_rate (lambda0 unknown) |
    zero_rate (lambda0 = 0) | no_reuse (nothing reusable: h = 0) | never_full (d(T) never
    reaches N: everything stays resident). Without a rate nothing displaces: h = upper_bound.
    """

    status: str
    variant: str
    displacement: str
    capacity_blocks: float
    block_size: int
    instances: int
    refinement: str = "none"
    hit_ratio: float | None = None
    hit_ratio_single_class: float | None = None
    upper_bound: float | None = None
    characteristic_time_s: float | None = None
    characteristic_time_single_class_s: float | None = None
    lambda_per_s: float | None = None
    lambda0: float | None = None
    A_R: float | None = None
    A_H_hash: float | None = None
    A_H: float | None = None
    E_B: float | None = None
    E_M: float | None = None
    conversations: int | None = None
    delay_samples: int = 0
    delay: str | None = None
    observed_hit_ratio: float | None = None
    by_intent: tuple[IntentForecast, ...] = ()
    curve: tuple[CurvePoint, ...] | None = None
    required_capacity: RequiredCapacity | None = None
    shared: SharedForecast | None = None
    estimators: dict[str, float] | None = None
    # The stack: the GPU tier (capacity_blocks) and the tiers below, each with its share of the
    # input blocks (kvcast.stats.tiers; they add to the stack's total hit ratio).
    tier_mode: str = DEFAULT_TIER_MODE
    tiers: tuple[TierForecast, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict: plain Python numbers, None in place of NaN/inf."""
        return _json_safe(asdict(self))


def _json_safe(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x


def finite_or_none(x: float) -> float | None:
    """``x`` as a float, None where it is NaN or infinite (JSON has neither)."""
    x = float(x)
    return x if math.isfinite(x) else None
