"""The hit-ratio forecast from a ``WorkloadSample`` or from given moments (SPEC section 4).

Units: blocks (KV blocks of ``block_size`` tokens), seconds, conversations per second.

Variants (all solved exactly by ``EmpiricalModel``; each revisit sample k gets a move weight
w_k and a hit weight v_k):

- ``paper``: single class, the paper's practical estimator: w = v = sum_H_hash / n.
- ``paper_whole``: single class, displacement counts Algorithm 1's whole move: w = sum_H / n.
- ``intent``: one class per intent, shared T_C: w = sum_H_c / n_c, v = sum_H_hash_c / n_c.
- ``state``: one class per (intent, turn): w = mean R_t, v = mean max(R_t - 1, 0) there.
- ``sample``: each revisit its own class: w = R_t, v = max(R_t - 1, 0).

``displacement='whole'`` counts what Algorithm 1 moves (the tail block included); ``'hashable'``
counts only the hashable blocks, as the paper does. ``paper`` is always hashable (and unrefined).

Finite-size ``refinement`` (``hit_ratio`` only; ``hit_ratio_single_class`` is always the paper's):
``none`` (mean field: revisit k hits iff d(W_k) <= N); ``tagged`` (the revisited conversation's
own R_k blocks count: d(W_k) + R_k <= N, exact and as fast); ``fluctuation`` (tagged, plus
Gaussian fluctuations of the displacement, ``kvcast.stats.finite_size``; O(points x revisits));
``partial`` (the revisit reuses the prefix of its conversation that still fits, with those
fluctuations: the forecast where one context is a sizeable share of the cache, agent traffic;
its revisits grouped, O(points x groups)).
The defaults below were chosen by measured error against Algorithm 1 and block-level LRU
(docs/validation.md).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from kvcast.stats.delays import DelayDistribution
from kvcast.stats.estimators import (
    DEFAULT_DISPLACEMENT,
    DEFAULT_REFINEMENT,
    DEFAULT_VARIANT,
    DISPLACEMENTS,
    REFINEMENTS,
    SHARED_VARIANTS,
    VARIANTS,
    revisit_weights,
    sample_model,
    shared_gaps,
    shared_model,
)
from kvcast.stats.finite_size import FluctuationModel
from kvcast.stats.forecast_assembly import (
    assemble_forecast,
    check_inputs,
    instance_rate,
    required_capacity,
)
from kvcast.stats.forecast_result import (
    CurvePoint,
    Forecast,
    IntentForecast,
    RequiredCapacity,
    SharedForecast,
    finite_or_none,
)
from kvcast.stats.meanfield import EmpiricalModel, HitRatioModel, single_class_model
from kvcast.stats.sample import WorkloadSample
from kvcast.stats.tiers import (
    DEFAULT_TIER_MODE,
    GPU,
    Tier,
    TierForecast,
    stack,
)

__all__ = [
    "DEFAULT_DISPLACEMENT",
    "DEFAULT_REFINEMENT",
    "DEFAULT_VARIANT",
    "DISPLACEMENTS",
    "REFINEMENTS",
    "SHARINGS",
    "VARIANTS",
    "CurvePoint",
    "Forecast",
    "IntentForecast",
    "RequiredCapacity",
    "SharedForecast",
    "TierForecast",
    "forecast_from_moments",
    "forecast_from_sample",
    "revisit_weights",
    "sample_model",
    "tier_planner",
]


SHARINGS = ("auto", "none")


def _resident(model: HitRatioModel, sample: WorkloadSample, n: float, t_c: float) -> NDArray:
    """Probability that each revisit k finds its conversation resident at capacity ``n``."""
    W = np.asarray(sample.delay_s, dtype=np.float64)
    if isinstance(model, FluctuationModel):
        return model.resident_probability(n)
    if isinstance(model, EmpiricalModel) and model.tagged:
        return (model.displacement(W) + np.asarray(sample.prev_blocks) <= n).astype(np.float64)
    return (t_c >= W).astype(np.float64)


def _by_intent(
    sample: WorkloadSample, hit_w: NDArray, resident: NDArray
) -> tuple[IntentForecast, ...]:
    """Per intent: upper_c times the hit-weighted fraction of its revisits that are resident."""
    L = sample.conversations
    idx = np.asarray(sample.intent, dtype=np.intp)
    m = len(sample.by_intent)
    n_c = np.bincount(idx, weights=hit_w, minlength=m)
    res_c = np.bincount(idx, weights=hit_w * resident, minlength=m)
    out = []
    for c, (name, mom) in enumerate(zip(sample.intents, sample.by_intent, strict=True)):
        if mom.conversations <= 0:
            continue
        k = mom.conversations
        f_c = res_c[c] / n_c[c] if n_c[c] > 0 else 0.0
        upper_c = mom.sum_H_hash / mom.sum_R if mom.sum_R > 0 else 0.0
        out.append(
            IntentForecast(
                intent=name,
                share=k / L,
                conversations=k,
                A_R=mom.sum_R / k,
                A_H_hash=mom.sum_H_hash / k,
                E_B=mom.sum_B / k,
                E_M=mom.sum_M / k,
                hit_ratio=upper_c * float(f_c),
                upper_bound=upper_c,
            )
        )
    return tuple(out)


def forecast_from_sample(
    sample: WorkloadSample,
    capacity_blocks: float,
    block_size: int = 16,
    instances: int = 1,
    *,
    variant: str = DEFAULT_VARIANT,
    displacement: str = DEFAULT_DISPLACEMENT,
    refinement: str = DEFAULT_REFINEMENT,
    capacities: Sequence[float] | None = None,
    target: float | None = None,
    kv_bytes_per_token: float | None = None,
    sharing: str = "auto",
    tiers: Sequence[Tier] = (),
    tier_mode: str = DEFAULT_TIER_MODE,
    target_tier: str = GPU,
) -> Forecast:
    """Forecast for one of ``instances`` instances of ``capacity_blocks`` blocks each.

    ``hit_ratio`` uses ``variant``/``displacement``/``refinement``; ``hit_ratio_single_class``
    is ``paper`` (mean field, no refinement). ``sharing='auto'``: when the window saw shared
    prefixes, ``hit_ratio`` is the forecast with shared blocks (:func:`shared_model`), with
    ``shared`` and every estimator's value in ``estimators``; ``'none'``: conversations only.
    ``tiers`` below the GPU tier in ``tier_mode``: each tier's share in ``tiers`` (from the
    same model); ``target_tier``: the tier that ``target`` plans (``kvcast.stats.tiers``).
    """
    lambda0 = sample.lambda0
    tiered = dict(tiers=tuple(tiers), tier_mode=tier_mode, target_tier=target_tier)
    check_inputs(
        capacity_blocks, block_size, instances, lambda0, capacities, target, kv_bytes_per_token,
        **tiered,
    )  # fmt: skip
    if refinement not in REFINEMENTS:
        raise ValueError(f"refinement must be one of {', '.join(REFINEMENTS)}, got {refinement!r}")
    if variant == "paper":
        displacement, refinement = "hashable", "none"
    lam, rate_status = instance_rate(lambda0, instances)
    tot = sample.total()
    L = tot.conversations
    fields: dict[str, Any] = dict(
        variant=variant,
        displacement=displacement,
        refinement=refinement,
        capacity_blocks=capacity_blocks,
        block_size=int(block_size),
        instances=int(instances),
        lambda_per_s=lam if lambda0 is not None else None,
        lambda0=lambda0,
        conversations=L,
        delay_samples=int(np.asarray(sample.delay_s).size),
        delay="empirical",
        observed_hit_ratio=sample.observed_hit_ratio,
    )
    if L <= 0:
        curve = None if capacities is None else tuple(CurvePoint(c, None, None) for c in capacities)
        req = None
        if target is not None:
            req = RequiredCapacity(target, None, None, "no_data", target_tier)
        layers = tuple(TierForecast(name, c, None) for name, c in stack(capacity_blocks, tiers))
        return Forecast(
            status="no_data", curve=curve, required_capacity=req, tier_mode=tier_mode,
            tiers=layers, **fields,
        )  # fmt: skip
    fields.update(
        A_R=tot.sum_R / L,
        A_H_hash=tot.sum_H_hash / L,
        A_H=tot.sum_H / L,
        E_B=tot.sum_B / L,
        E_M=tot.sum_M / L,
    )
    plain = variant == "paper" or rate_status is not None
    model, conversational, with_shared = _forecast_model(
        sample, lam, rate_status, variant, displacement, refinement, sharing, instances
    )
    exact_paper = variant == "paper"
    single = (
        conversational if exact_paper else sample_model(sample, lam, "paper", refinement="none")
    )
    forecast, t_c = assemble_forecast(
        model, single, fields, capacities, target, kv_bytes_per_token, rate_status, **tiered
    )
    _, _, hit_w = revisit_weights(sample, variant, displacement)
    n = float(capacity_blocks)
    # The per-intent breakdown is the conversations' own (at their own T_C).
    resident = _resident(conversational, sample, n, float(conversational.characteristic_time(n)))
    forecast = replace(forecast, by_intent=_by_intent(sample, hit_w, resident))
    own = f"{variant}/{displacement}/{'none' if plain else refinement}"
    if not with_shared:
        estimators = {
            own: forecast.hit_ratio,
            "paper/hashable/none": forecast.hit_ratio_single_class,
        }
        return replace(forecast, estimators=estimators)
    name = f"shared/{own}"
    return replace(
        forecast,
        shared=_shared_part(sample, lam, t_c, instances, name),
        estimators={
            name: forecast.hit_ratio,
            own: float(conversational.hit_ratio(n)),
            "paper/hashable/none": forecast.hit_ratio_single_class,
        },
    )


def _forecast_model(
    sample: WorkloadSample,
    lam: float,
    rate_status: str | None,
    variant: str,
    displacement: str,
    refinement: str,
    sharing: str,
    instances: int,
) -> tuple[HitRatioModel, HitRatioModel, bool]:
    """``hit_ratio``'s model, the conversations-only one, and whether shared blocks are in."""
    if sharing not in SHARINGS:
        raise ValueError(f"sharing must be one of {', '.join(SHARINGS)}, got {sharing!r}")
    # The paper's estimator is the paper's exactly; without a rate nothing displaces.
    plain = variant == "paper" or rate_status is not None
    refined = "none" if plain else refinement
    conversational = sample_model(sample, lam, variant, displacement, refined)
    with_shared = sharing == "auto" and sample.has_shared and variant in SHARED_VARIANTS
    if not with_shared:
        return conversational, conversational, False
    return (
        shared_model(sample, lam, variant, displacement, refined, instances),
        conversational,
        True,
    )


def tier_planner(
    sample: WorkloadSample,
    capacity_blocks: float,
    block_size: int = 16,
    instances: int = 1,
    *,
    kv_bytes_per_token: float | None = None,
    tiers: Sequence[Tier] = (),
    tier_mode: str = DEFAULT_TIER_MODE,
    variant: str = DEFAULT_VARIANT,
    displacement: str = DEFAULT_DISPLACEMENT,
    refinement: str = DEFAULT_REFINEMENT,
    sharing: str = "auto",
) -> Callable[[float, str], RequiredCapacity]:
    """``plan(target, tier)``: exactly ``forecast_from_sample(sample, ..., target=target,
    target_tier=tier).required_capacity``, with the model solved once, at the first call (a
    query then costs a search, not a forecast). ValueError for a bad target or tier."""
    tiers = tuple(tiers)
    check_inputs(
        capacity_blocks, block_size, instances, sample.lambda0, None, None, kv_bytes_per_token,
        tiers, tier_mode,
    )  # fmt: skip
    if refinement not in REFINEMENTS:
        raise ValueError(f"refinement must be one of {', '.join(REFINEMENTS)}, got {refinement!r}")
    if variant == "paper":
        displacement, refinement = "hashable", "none"
    lam, rate_status = instance_rate(sample.lambda0, instances)
    layers = stack(capacity_blocks, tiers)
    names = [name for name, _ in layers]
    empty = sample.total().conversations <= 0
    built: list[HitRatioModel] = []
    lock = threading.Lock()

    def plan(target: float, tier: str) -> RequiredCapacity:
        if not (0 < target < 1):
            raise ValueError(f"target hit ratio must be strictly between 0 and 1, got {target}")
        if tier not in names:
            raise ValueError(f"tier {tier!r} to plan is not in the stack ({', '.join(names)})")
        if empty:
            return RequiredCapacity(target, None, None, "no_data", tier)
        with lock:  # one solve however many threads ask at once
            if not built:
                built.append(
                    _forecast_model(
                        sample, lam, rate_status, variant, displacement, refinement, sharing,
                        instances,
                    )[0]
                )  # fmt: skip
        return required_capacity(
            built[0], target, int(block_size), kv_bytes_per_token, rate_status, layers,
            tier_mode, tier,
        )  # fmt: skip

    return plan


def _shared_part(
    sample: WorkloadSample, lam: float, t_c: float, instances: int, name: str
) -> SharedForecast:
    """The shared blocks' residency and hits at T_C (see :func:`shared_model`)."""
    tot = sample.total()
    L = tot.conversations
    gaps, counts = shared_gaps(sample, instances)
    if not (L and lam > 0):
        return SharedForecast(None, None, None, name)
    per_s = lam / L  # conversations' sums per second at this instance's rate
    resident = per_s * (tot.shared_born * t_c + float(np.sum(counts * np.minimum(gaps, t_c))))
    hits = float(np.sum(counts[gaps <= t_c]))
    return SharedForecast(
        blocks=finite_or_none(resident),
        hit_ratio=hits / tot.sum_R if tot.sum_R > 0 else None,
        rate_per_s=per_s * tot.sum_S,
        estimator=name,
    )


def forecast_from_moments(
    *,
    lambda0: float | None,
    A_R: float,
    A_H_hash: float,
    E_B: float,
    delay: DelayDistribution,
    capacity_blocks: float,
    block_size: int = 16,
    instances: int = 1,
    A_H: float | None = None,
    E_M: float | None = None,
    displacement: str = "hashable",
    capacities: Sequence[float] | None = None,
    target: float | None = None,
    kv_bytes_per_token: float | None = None,
    tiers: Sequence[Tier] = (),
    tier_mode: str = DEFAULT_TIER_MODE,
    target_tier: str = GPU,
) -> Forecast:
    """The paper's single-class forecast from moments (blocks) and a delay distribution F.

    ``displacement='whole'`` moves ``A_H`` (required then) instead of ``A_H_hash``; ``tiers``,
    ``tier_mode`` and ``target_tier`` as in :func:`forecast_from_sample`.
    """
    tiered = dict(tiers=tuple(tiers), tier_mode=tier_mode, target_tier=target_tier)
    check_inputs(
        capacity_blocks, block_size, instances, lambda0, capacities, target, kv_bytes_per_token,
        **tiered,
    )  # fmt: skip
    for name, val in (("A_R", A_R), ("A_H_hash", A_H_hash), ("E_B", E_B), ("A_H", A_H)):
        if val is not None and not (math.isfinite(val) and val >= 0):
            raise ValueError(f"{name} must be a finite number >= 0 blocks, got {val}")
    if A_R <= 0:
        raise ValueError(f"A_R must be > 0 blocks, got {A_R}")
    if A_H_hash > A_R:
        raise ValueError(f"A_H_hash ({A_H_hash}) cannot exceed A_R ({A_R})")
    if displacement not in DISPLACEMENTS:
        raise ValueError(f"displacement must be 'whole' or 'hashable', got {displacement!r}")
    if displacement == "whole" and A_H is None:
        raise ValueError("displacement 'whole' needs A_H (mean sum_{j<M} R_j)")
    lambda0 = None if lambda0 is None else float(lambda0)
    lam, rate_status = instance_rate(lambda0, instances)
    move = A_H if displacement == "whole" and A_H is not None else A_H_hash
    kw = dict(lam=lam, E_B=E_B, A_R=A_R, A_hit=A_H_hash)
    model = single_class_model(delay, A_move=move, **kw)
    single = (
        model if displacement == "hashable" else single_class_model(delay, A_move=A_H_hash, **kw)
    )
    fields = dict(
        variant="paper" if displacement == "hashable" else "paper_whole",
        displacement=displacement,
        capacity_blocks=capacity_blocks,
        block_size=int(block_size),
        instances=int(instances),
        lambda_per_s=lam if lambda0 is not None else None,
        lambda0=lambda0,
        A_R=A_R,
        A_H_hash=A_H_hash,
        A_H=A_H,
        E_B=E_B,
        E_M=E_M,
        delay_samples=int(getattr(delay, "n", 0)),
        delay=delay.describe(),
    )
    return assemble_forecast(
        model, single, fields, capacities, target, kv_bytes_per_token, rate_status, **tiered
    )[0]
