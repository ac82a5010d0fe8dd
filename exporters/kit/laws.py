"""The law ``(p, mu, sigma)`` the ``density`` policy values a table state by: read off its row
(``p`` smoothed by its conversations, ``mu = log median``, ``sigma`` where it was fitted), the
shared blocks' row, and the pool of the listed states that an unlisted state gets.
Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from kvcast.exporters.kit.checks import TableError, checked_median, checked_optional, checked_p

__all__ = ["Law", "fitted_sigma", "pooled_law", "row_law", "shared_law", "smoothed_p"]

Law = tuple[float, float, float]  # (p, mu: log s, sigma: log s)


def smoothed_p(p_continue: float, conversations: int | None) -> float:
    """``P(t+1 | i, t)`` by Laplace's rule of succession over the state's conversations.

    A state whose few conversations all continued has ``p = 1``: the model would then say
    its blocks are never dead, however old; ``(k + 1) / (n + 2)`` keeps every state mortal
    and leaves well-observed states as they are. ``conversations`` None or 0: unchanged.
    """
    if not conversations:
        return p_continue
    return (p_continue * conversations + 1.0) / (conversations + 2.0)


def pooled_law(
    continues: Sequence[tuple[float, float]],
    delays: Sequence[tuple[float, float, float]],
    default: Law,
) -> Law:
    """``(p, mu, sigma)`` of a state the table does not list: the listed states pooled.

    ``continues``: ``(p, conversations)`` of every listed state; ``delays``: ``(mu, sigma,
    weight)`` of the states whose log-normal was fitted to their delays, ``weight`` the
    delays' count (conversations times p). ``p`` is the conversations' mean; the delay law is
    the log-normal with the mixture's mean and variance of ``log W`` (log-seconds). Where
    nothing is listed, ``default``. Why: next to measured states, a made-up law (p = 0.5,
    150 s) ranks an unlisted state's blocks by a reuse the traffic never showed (on agent
    traffic every turn-1 block, docs/policies.md).
    """
    total = sum(n for _, n in continues)
    if not total > 0.0:
        return default
    p = sum(q * n for q, n in continues) / total
    weight = sum(w for _, _, w in delays)
    if not weight > 0.0:
        return (p, default[1], default[2])
    mu = sum(m * w for m, _, w in delays) / weight
    var = sum((s * s + (m - mu) ** 2) * w for m, s, w in delays) / weight
    return (p, mu, math.sqrt(var))


def shared_law(row: Any, default_sigma: float) -> Law | None:
    """``(p, mu, sigma)`` of the table's ``shared`` entry (None: absent or null), ``p``
    smoothed by the references and lives it was counted from."""
    if row is None:
        return None
    if not isinstance(row, Mapping):
        raise TableError(f"shared must be an object or null, got {type(row).__name__}")
    counts = []
    for name in ("references", "lives"):
        value = row.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TableError(f"shared: {name} must be an int >= 0, got {value!r}")
        counts.append(value)
    median = checked_median(row.get("median_reuse_s"), "shared")
    p = checked_p(row.get("p_continue"), "shared")
    return row_law({**row, "conversations": sum(counts)}, "shared", median, p, default_sigma)


def row_law(
    row: Mapping[str, Any], where: str, median: float, p: float, default_sigma: float
) -> Law:
    """``(p, mu, sigma)`` of a table row for the density policy.

    ``mu = log median_reuse_s`` always, so that the density's median is Eq. 1's (which holds
    the defaults where the delays are too few); ``sigma`` is the row's where its ``mu`` is the
    one the median came from, else the defaults'. ``p`` is smoothed by the conversations.
    """
    sigma = fitted_sigma(row, where, median)
    conversations = row.get("conversations")
    n = conversations if isinstance(conversations, int) and conversations > 0 else None
    return (smoothed_p(p, n), math.log(median), sigma if sigma else default_sigma)


def fitted_sigma(row: Mapping[str, Any], where: str, median: float) -> float | None:
    """The row's ``sigma`` (log-s) where its ``mu`` is the one its median came from (a
    log-normal fitted to its delays), else None."""
    mu = checked_optional(row.get("mu"), where, "mu")
    sigma = checked_optional(row.get("sigma"), where, "sigma")
    if sigma is not None and sigma < 0:
        raise TableError(f"{where}: sigma must be >= 0, got {sigma!r}")
    fitted = mu is not None and sigma is not None and abs(math.exp(mu) - median) <= 1e-6 * median
    return sigma if fitted else None
