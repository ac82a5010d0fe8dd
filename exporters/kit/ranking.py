"""Many eviction candidates ranked by density at once: the engine's hot path behind
``PriorityIndex.rank_by_density`` and ``PriorityIndex.rank(..., policy="density")``.

A candidate's key is its state's curve value at its age's bucket (``kvcast.exporters.kit.ages``),
divided by its size; lowest first, a stable sort. From a few dozen candidates up, and where
numpy is installed, the buckets (a binary search in the table of the exact floats where
``age_bucket`` turns), the division and the sort run in numpy; anything numpy cannot take
exactly (a non-finite age or key, a zero size, a short column) goes the pure-Python way of
the caller, which gives the same order or the same error.

Standard library at import time (the engine kit's rule); numpy on first use.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from operator import getitem, truediv
from struct import error as StructError
from struct import pack
from typing import Any

from kvcast.exporters.kit.ages import AGE_BUCKETS, BUCKET_SCALE, FIRST_AGES

__all__ = [
    "FAST_MIN_TUPLES",
    "fast",
    "rank_columns",
    "rank_rows",
]

# Candidates from which numpy ranks (below: its calls cost more than they save), from columns
# and from (intent, turn, age, size) rows.
FAST_MIN, FAST_MIN_TUPLES = 64, 96
_INF_BITS = 0x7FF0000000000000  # the bits of float("inf"): finite floats >= 0 lie below


def rank_columns(
    curves: Sequence[Sequence[float]],
    ages_s: Sequence[float],
    sizes: Sequence[float] | None = None,
) -> list[int]:
    """Positions in density eviction order of candidates given as columns: each one's curve
    values, age (s) and optionally size (default 1). Ages at or below 0 (and NaN) take the
    first bucket, ages past the grid its last; equal keys keep the input order."""
    if len(ages_s) >= FAST_MIN and fast() is not None:
        found = _numpy_keys(curves, ages_s, sizes)
        if found is not None:
            order = order_by_bits(found[0], found[2])
            if order is not None:
                return order.tolist()
    scale, last, log1p = BUCKET_SCALE, AGE_BUCKETS - 1, math.log1p
    values = [
        curve[(k if (k := int(log1p(age) * scale)) < last else last) if age > 0.0 else 0]
        for curve, age in zip(curves, ages_s, strict=False)  # as many as the shortest
    ]
    if sizes is not None:
        values = list(map(truediv, values, sizes))
    return sorted(range(len(values)), key=values.__getitem__)


def rank_rows(
    curves: Sequence[Sequence[float]], ages_s: Sequence[float], sizes: Sequence[float]
) -> list[int] | None:
    """The numpy ranking of ``PriorityIndex.rank(..., policy="density")``: key ``(curve value
    / size, -age)``, so equal densities go older first; None where numpy is missing or cannot
    take the input exactly (the caller then ranks in Python)."""
    if fast() is None:
        return None
    found = _numpy_keys(curves, ages_s, sizes)
    if found is None:
        return None
    np, ages, keys = found
    order = order_by_bits(np, keys)
    if order is None:
        return None
    ranked = keys[order]
    tied = ranked[1:] == ranked[:-1]
    ties = np.count_nonzero(tied)
    if not ties:
        return order.tolist()
    if ties > len(ages_s) >> 4:
        return np.lexsort((-ages, keys)).tolist()
    return older_first(order.tolist(), tied.nonzero()[0].tolist(), ages_s)


def _numpy_keys(
    curves: Sequence[Sequence[float]],
    ages_s: Sequence[float],
    sizes: Sequence[float] | None,
) -> tuple[Any, Any, Any] | None:
    """``(numpy, ages, keys)`` as arrays, or None where an input is not exactly representable
    (a short column, a non-number, a zero size, a non-finite age)."""
    found = fast()
    if found is None:
        return None
    np, starts = found
    n = len(ages_s)
    try:
        ages = np.frombuffer(pack(f"{n}d", *ages_s))
        buckets = starts.searchsorted(ages, "right").tolist()
        keys = np.frombuffer(pack(f"{n}d", *map(getitem, curves, buckets)))
        if sizes is not None:
            divisors = np.frombuffer(pack(f"{n}d", *sizes))
            if np.count_nonzero(divisors) != n:
                return None
            with np.errstate(over="ignore"):  # inf, as in Python (then refused by the sort)
                keys = keys / divisors
    except (TypeError, ValueError, IndexError, OverflowError, StructError):
        return None
    if not math.isfinite(np.maximum.reduce(ages)):  # a NaN or an infinity
        return None
    return np, ages, keys


def order_by_bits(np: Any, keys: Any) -> Any:
    """A stable argsort of float ``keys`` through their bits (the order of the floats where all
    are finite and >= 0, and faster to sort); None where one is not (NaN, an infinity, a
    negative or -0.0: the Python way then)."""
    bits = keys.view(np.int64)
    order = bits.argsort(kind="stable")
    if len(order) and (bits[order[0]] < 0 or bits[order[-1]] >= _INF_BITS):
        return None
    return order


def older_first(order: list[int], tied: list[int], ages_s: Sequence[float]) -> list[int]:
    """``order`` (a stable sort on the density) with each run of equal densities sorted oldest
    first, stably: ``tied`` holds the positions ``p`` where ``order[p]`` ties ``order[p + 1]``."""
    runs: list[list[int]] = []
    for p in tied:
        if runs and runs[-1][1] == p + 1:
            runs[-1][1] = p + 2
        else:
            runs.append([p, p + 2])
    age = ages_s.__getitem__
    for start, stop in runs:
        order[start:stop] = sorted(order[start:stop], key=lambda j: -age(j))
    return order


@functools.cache
def fast() -> tuple[Any, Any] | None:
    """numpy and the bucket starts (``ages.FIRST_AGES`` of buckets 1 and up: ``age_bucket(a) ==
    k`` exactly for ``starts[k - 1] <= a < starts[k]``, ``a`` finite) as an array, imported on
    first use (the kit must load without numpy); None where numpy is not installed."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy, numpy.array(FIRST_AGES[1:])
