"""Tiered KV caches: the GPU tier and the tiers below it (host memory, disk), forecast and planned.

Units: blocks (KV blocks of ``block_size`` tokens); hit ratios are shares of input blocks.

A stack is the GPU tier (``capacity_blocks``, named ``gpu``) and further tiers in order. Block LRU
is a stack algorithm (docs/validation.md, "Tiers"): with h(N) the hit ratio of one LRU of N
blocks, the share of input blocks served from tier k is

- ``exclusive`` (a block evicted from a tier moves to the next, a hit moves it back to the top):
  the tiers together are one LRU of the summed capacity, so share_k = h(S_k) - h(S_(k-1)) with
  S_k = N_1 + .. + N_k;
- ``inclusive`` (write-through: every tier sees every access, tier k holds LRU(N_k)):
  share_k = h(N_k) - h(N_(k-1)), for capacities that do not shrink downwards (a smaller lower
  tier would hold nothing the tier above does not: it is refused).

The shares add up to the stack's total hit ratio h(S_K) (exclusive) or h(N_K) (inclusive).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

GPU = "gpu"
TIER_MODES = ("exclusive", "inclusive")
DEFAULT_TIER_MODE = "exclusive"
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Tier:
    """A tier below the GPU: ``name`` and its capacity per instance (blocks)."""

    name: str
    capacity_blocks: int


@dataclass(frozen=True)
class TierForecast:
    """One tier's forecast: ``hit_ratio`` = the share of input blocks served from it."""

    name: str
    capacity_blocks: float
    hit_ratio: float | None


def parse_tier(text: str) -> Tier:
    """``NAME=BLOCKS`` (``host=200000``) as a :class:`Tier`; ValueError saying what is wrong."""
    name, sep, blocks = str(text).partition("=")
    name, blocks = name.strip(), blocks.strip()
    if not sep:
        raise ValueError(f"expected NAME=BLOCKS (e.g. host=200000), got {text!r}")
    check_name(name)
    try:
        value = int(blocks)
    except ValueError:
        raise ValueError(
            f"tier {name!r}: BLOCKS must be a whole number of blocks, got {blocks!r}"
        ) from None
    if value < 1:
        raise ValueError(f"tier {name!r}: BLOCKS must be >= 1, got {value}")
    return Tier(name, value)


def check_name(name: str) -> None:
    """A tier name: lowercase ``[a-z][a-z0-9_]*``, not ``gpu`` (the top tier's own name)."""
    if not _NAME.match(name):
        raise ValueError(
            f"tier name {name!r}: use lowercase letters, digits and _, starting with a letter"
        )
    if name == GPU:
        raise ValueError(
            f"tier name {GPU!r} is the GPU tier (--capacity-blocks); name it otherwise"
        )


def check_tiers(gpu_blocks: float, tiers: Sequence[Tier], mode: str) -> None:
    """Names unique, capacities >= 1 block, ``mode`` known; inclusive: capacities that do not
    shrink downwards (the GPU's included). ValueError naming the tier."""
    if mode not in TIER_MODES:
        raise ValueError(f"tier mode must be one of {', '.join(TIER_MODES)}, got {mode!r}")
    seen: set[str] = set()
    above_name, above = GPU, gpu_blocks
    for tier in tiers:
        check_name(tier.name)
        if tier.name in seen:
            raise ValueError(f"tier {tier.name!r} is given twice")
        seen.add(tier.name)
        if not (isinstance(tier.capacity_blocks, int) and tier.capacity_blocks >= 1):
            raise ValueError(f"tier {tier.name!r}: capacity must be >= 1 block")
        if mode == "inclusive" and tier.capacity_blocks < above:
            raise ValueError(
                f"inclusive tiers keep what the tiers above hold, so each must be at least as "
                f"large as the one above: {tier.name!r} has {tier.capacity_blocks} blocks, "
                f"{above_name!r} {above:g}"
            )
        above_name, above = tier.name, tier.capacity_blocks


def stack(gpu_blocks: float, tiers: Sequence[Tier]) -> list[tuple[str, float]]:
    """``[(name, capacity_blocks)]`` of the whole stack, the GPU first."""
    return [(GPU, float(gpu_blocks))] + [(t.name, float(t.capacity_blocks)) for t in tiers]


def reach(capacities: Sequence[float], mode: str) -> list[float]:
    """The single-LRU capacity whose hit ratio the tiers down to tier k give (blocks): the
    running sum (exclusive) or tier k's own (inclusive)."""
    if mode == "exclusive":
        out, total = [], 0.0
        for c in capacities:
            total += c
            out.append(total)
        return out
    return [float(c) for c in capacities]


def tier_shares(
    hit_ratio: Callable[[Sequence[float]], Sequence[float]],
    capacities: Sequence[float],
    mode: str,
) -> list[float]:
    """Per tier, the share of input blocks it serves, from ``hit_ratio`` (h at each capacity)."""
    reached = [float(h) for h in hit_ratio(reach(capacities, mode))]
    return [h - (reached[k - 1] if k else 0.0) for k, h in enumerate(reached)]


@dataclass(frozen=True)
class TierPlan:
    """What tier ``tier`` needs for the stack's total hit ratio ``target``, given the tiers above.

    ``blocks`` (per instance) and ``bytes`` (when bytes per token are known). ``status``: ok |
    already_reached (the tiers above reach the target: the tier needs 0 blocks) | unreachable
    (above the curve's limit, the hit ratio of an unlimited cache) | unknown_tier.
    """

    tier: str
    target: float
    blocks: int | None
    status: str
    above_hit_ratio: float | None = None  # what the tiers above give alone


def plan_tier(
    hit_ratio: Callable[[Sequence[float]], Sequence[float]],
    required_capacity: Callable[[float], float | None],
    capacities: Sequence[tuple[str, float]],
    mode: str,
    tier: str,
    target: float,
) -> TierPlan:
    """Smallest whole number of blocks for ``tier`` so that the total hit ratio reaches
    ``target``, the tiers above it as configured, the tiers below ignored.

    ``required_capacity(x)``: the smallest single-LRU N (blocks) with h(N) >= x, None when none.
    Exclusive: S_above + N_tier >= N; inclusive: N_tier >= N (N_tier > N_above then).
    """
    names = [name for name, _ in capacities]
    if tier not in names:
        return TierPlan(tier, target, None, "unknown_tier")
    k = names.index(tier)
    above = [c for _, c in capacities[:k]]
    reach_above = (sum(above) if mode == "exclusive" else max(above)) if above else 0.0
    h_above = float(hit_ratio([reach_above])[0]) if above else 0.0
    if above and h_above >= target:
        return TierPlan(tier, target, 0, "already_reached", h_above)
    n = required_capacity(target)
    if n is None or not math.isfinite(n):
        return TierPlan(tier, target, None, "unreachable", h_above if above else None)
    need = n - reach_above if mode == "exclusive" else n
    return TierPlan(tier, target, math.ceil(need), "ok", h_above if above else None)
