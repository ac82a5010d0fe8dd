"""Which conversations a simulation measures: warm-up and cool-down by first-turn time.

A conversation is measured when its first event time (its turn 1) lies in
``[t0 + warmup * span, t0 + (1 - cooldown) * span]``, where ``t0`` and ``span`` are the earliest
first-turn time and the span of first-turn times over the whole trace; every turn of a measured
conversation counts, also turns after the window. Both fractions 0 measure everything.

Fractions of the span, not quantiles of the first-turn times (SPEC section 4): the warm-up is
there so that the cache has run for a while before anything is measured, a matter of time,
and a quantile would start measuring on a bursty trace (most conversations opening at once)
while the cache is still cold. The price is a trace whose span an outlier stretches (one
conversation starting long after the rest): the window then falls where almost nothing
starts, which :func:`coverage_warning` says.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def check_fractions(warmup_fraction: float, cooldown_fraction: float) -> None:
    """Raise ValueError unless both fractions lie in [0, 1] and add up to at most 1."""
    if not (0.0 <= warmup_fraction <= 1.0 and 0.0 <= cooldown_fraction <= 1.0):
        raise ValueError("warm-up and cool-down fractions must lie in [0, 1]")
    if warmup_fraction + cooldown_fraction > 1.0:
        raise ValueError("warm-up and cool-down fractions must add up to at most 1")


def first_times(
    conversation: NDArray[np.int64], timestamp: NDArray[np.float64], conversations: int
) -> NDArray[np.float64]:
    """Earliest event time (seconds) of each conversation ``0..conversations-1``; inf if none."""
    first = np.full(conversations, np.inf)
    np.minimum.at(first, conversation, timestamp)
    return first


def measured_conversations(
    first_ts: NDArray[np.float64], warmup_fraction: float = 0.2, cooldown_fraction: float = 0.2
) -> NDArray[np.bool_]:
    """Mask over conversations: first-turn time inside the measurement window."""
    check_fractions(warmup_fraction, cooldown_fraction)
    seen = np.isfinite(first_ts)
    if warmup_fraction == 0.0 and cooldown_fraction == 0.0:
        return seen
    if not seen.any():
        return seen
    t0, t1 = float(first_ts[seen].min()), float(first_ts[seen].max())
    span = t1 - t0
    lo, hi = t0 + warmup_fraction * span, t0 + (1.0 - cooldown_fraction) * span
    return seen & (first_ts >= lo) & (first_ts <= hi)


def measured_requests(
    conversation: NDArray[np.int64],
    timestamp: NDArray[np.float64],
    conversations: int,
    warmup_fraction: float = 0.2,
    cooldown_fraction: float = 0.2,
) -> tuple[NDArray[np.bool_], int]:
    """Mask over requests (every turn of a measured conversation) and the measured
    conversation count."""
    first = first_times(conversation, timestamp, conversations)
    conv_mask = measured_conversations(first, warmup_fraction, cooldown_fraction)
    return conv_mask[conversation], int(conv_mask.sum())


def coverage_warning(
    first_ts: NDArray[np.float64],
    measured: int,
    warmup_fraction: float = 0.2,
    cooldown_fraction: float = 0.2,
) -> str | None:
    """A one-line warning where fewer than half of the conversations are measured (None
    otherwise): how many, and the window against the span of first-turn times (s)."""
    seen = first_ts[np.isfinite(first_ts)]
    if seen.size == 0 or 2 * measured >= seen.size:
        return None
    t0, t1 = float(seen.min()), float(seen.max())
    span = t1 - t0
    lo, hi = t0 + warmup_fraction * span, t0 + (1.0 - cooldown_fraction) * span
    inside = np.sort(seen)
    before = int(np.searchsorted(inside, lo, "left"))
    after = int(inside.size - np.searchsorted(inside, hi, "right"))
    return (
        f"measured {measured} of {seen.size} conversations: the window of first-turn times "
        f"[{lo - t0:g} s, {hi - t0:g} s] after the first (warm-up {warmup_fraction:g}, "
        f"cool-down {cooldown_fraction:g} of their span, {span:g} s) leaves {before} before "
        f"it and {after} after it"
    )
