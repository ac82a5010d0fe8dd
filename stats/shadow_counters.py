"""The shadow simulation's counters (``kvcast.stats.shadow``): sampled accesses per event-time
slot by the smallest curve capacity at which they hit; additive, mergeable, serialisable.
Pure computation."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

DEFAULT_SLOT_S = 60.0  # event-time slot of the counters (s), the statistics' bucket width
DEFAULT_MIN_ACCESSES = 100_000  # kept accesses the published curve spans at least ...
DEFAULT_MAX_AGE_S = 86_400.0  # ... unless older than this (s), as the statistics window


@dataclass(frozen=True)
class ShadowPoint:
    """The measured hit ratio at ``capacity_blocks`` (None while nothing was measured)."""

    capacity_blocks: float
    hit_ratio: float | None


class ShadowCounters:
    """Additive counters of the shadow in event-time slots (``slot_s`` wide).

    ``thresholds[i]`` is capacity i in sampled blocks (``capacities[i] * sampling``, times the
    capacity scale of the module doc). A kept access with sampled distance k counts as a hit
    of weight ``clamp(t - k, 0, 1)`` at threshold t: 1 for ``k < floor(t)``, ``frac(t)`` for
    ``k = floor(t)``. At integer thresholds (rate 1) that is the exact hit/miss; at fractional
    ones it keeps the sampled cache's size continuous in the capacity (SHARDS counts
    ``k < t``, i.e. ``ceil(t)`` sampled blocks: up to one block too many, a bias of
    ``(ceil(t) - t) / t`` in capacity). For ``d_s ~ Poisson(rate * d)`` the expected weight
    integrates over d to exactly the capacity, so the estimate is unbiased where the distance
    distribution is locally uniform.

    ``slots[k]`` (event time in ``[k*slot_s, (k+1)*slot_s)``) holds two histograms of
    ``len(capacities) + 1`` counts: ``[:n+1]`` by the smallest i with ``k < floor(t_i)``,
    ``[n+1:]`` by the smallest i with ``k <= floor(t_i)`` (n: none). Counters with the same
    capacities, thresholds and slot width add up (:meth:`merge`); old slots expire whole."""

    def __init__(
        self,
        capacities: Sequence[float],
        slot_s: float = DEFAULT_SLOT_S,
        thresholds: Sequence[float] | None = None,
    ) -> None:
        if not slot_s > 0:
            raise ValueError("slot_s must be > 0")
        self.capacities = tuple(float(c) for c in capacities)
        self.thresholds = tuple(
            float(t) for t in (self.capacities if thresholds is None else thresholds)
        )
        if len(self.thresholds) != len(self.capacities):
            raise ValueError("one threshold per capacity")
        self.slot_s = float(slot_s)
        self.slots: dict[int, list[int]] = {}

    @property
    def width(self) -> int:
        """Counts in one slot."""
        return 2 * (len(self.capacities) + 1)

    def slot_of(self, time_s: float) -> int:
        return math.floor(time_s / self.slot_s)

    def record(self, time_s: float, below: Iterable[int], upto: Iterable[int]) -> None:
        """Count one event's kept accesses: for each, the smallest capacity index i with
        ``k < floor(t_i)`` (``below``) and with ``k <= floor(t_i)`` (``upto``)."""
        key = self.slot_of(time_s)
        row = self.slots.get(key)
        if row is None:
            row = self.slots[key] = [0] * self.width
        for j in below:
            row[j] += 1
        second = len(self.capacities) + 1
        for j in upto:
            row[second + j] += 1

    def _check(self, other: ShadowCounters) -> None:
        if (other.capacities, other.thresholds, other.slot_s) != (
            self.capacities,
            self.thresholds,
            self.slot_s,
        ):
            raise ValueError("shadow counters differ in capacities, thresholds or slot width")

    def merge(self, other: ShadowCounters) -> None:
        """Add ``other``'s counts into these."""
        self._check(other)
        for key, row in other.slots.items():
            mine = self.slots.get(key)
            if mine is None:
                self.slots[key] = list(row)
            else:
                for j, v in enumerate(row):
                    mine[j] += v

    def expire(self, before_s: float) -> int:
        """Drop the slots that end at or before ``before_s``; returns how many."""
        old = [k for k in self.slots if (k + 1) * self.slot_s <= before_s]
        for k in old:
            del self.slots[k]
        return len(old)

    def totals(self, since_s: float | None = None) -> list[int]:
        """Counts summed over the slots that end after ``since_s`` (all when None)."""
        out = [0] * self.width
        for key, row in self.slots.items():
            if since_s is None or (key + 1) * self.slot_s > since_s:
                for j, v in enumerate(row):
                    out[j] += v
        return out

    def window_start(
        self,
        min_accesses: int = DEFAULT_MIN_ACCESSES,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        now_s: float | None = None,
    ) -> float | None:
        """Where the window of the newest slots holding at least ``min_accesses`` kept
        accesses begins (event time, s), none older than ``max_age_s`` before ``now_s`` (default:
        the newest slot's end); None when nothing is counted. Pass it as ``since_s``."""
        if not self.slots:
            return None
        keys = sorted(self.slots, reverse=True)
        now = (keys[0] + 1) * self.slot_s if now_s is None else now_s
        half = len(self.capacities) + 1
        start, held = keys[-1] * self.slot_s, 0
        for key in keys:
            held += sum(self.slots[key][:half])
            if held >= min_accesses:
                start = key * self.slot_s
                break
        return max(start, now - max_age_s)

    def accesses(self, since_s: float | None = None) -> int:
        """Kept block accesses counted (since ``since_s``)."""
        return sum(self.totals(since_s)[: len(self.capacities) + 1])

    def hits(self, since_s: float | None = None) -> list[float]:
        """Estimated hits in sampled blocks at every capacity (since ``since_s``)."""
        totals = self.totals(since_s)
        second = len(self.capacities) + 1
        out, below, upto = [], 0, 0
        for i, t in enumerate(self.thresholds):
            below += totals[i]
            upto += totals[second + i]
            out.append(below + (t - math.floor(t)) * (upto - below))
        return out

    def curve(self, since_s: float | None = None) -> list[ShadowPoint]:
        """Hit ratio at every capacity over the slots that end after ``since_s``."""
        total = self.accesses(since_s)
        hits = self.hits(since_s)
        return [
            ShadowPoint(c, h / total if total else None)
            for c, h in zip(self.capacities, hits, strict=True)
        ]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able form (slot keys as strings), read back by :meth:`from_dict`."""
        return {
            "capacities": list(self.capacities),
            "thresholds": list(self.thresholds),
            "slot_s": self.slot_s,
            "slots": {str(k): list(row) for k, row in sorted(self.slots.items())},
        }

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ShadowCounters:
        out = cls(doc["capacities"], doc["slot_s"], doc["thresholds"])
        for key, row in doc["slots"].items():
            if len(row) != out.width or any(not isinstance(v, int) or v < 0 for v in row):
                raise ValueError(f"shadow slot {key}: expected {out.width} non-negative counts")
            out.slots[int(key)] = list(row)
        return out

    def empty_like(self) -> ShadowCounters:
        """Counters with the same shape and nothing counted (a fresh delta)."""
        return ShadowCounters(self.capacities, self.slot_s, self.thresholds)
