"""The checks of a priority table document's fields (SPEC section 5), as the engine kit reads
it: each returns the value as a float (or int) or raises :class:`TableError` naming where.
Standard library only.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["TableError", "checked_median", "checked_optional", "checked_p", "checked_turn"]


class TableError(ValueError):
    """A table document that does not follow SPEC section 5."""


def checked_p(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TableError(f"{where}: p_continue must be a number, got {value!r}")
    if not 0.0 <= value <= 1.0:
        raise TableError(f"{where}: p_continue must be in [0, 1], got {value!r}")
    return float(value)


def checked_median(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TableError(f"{where}: median_reuse_s must be a number, got {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise TableError(f"{where}: median_reuse_s must be finite and > 0, got {value!r}")
    return float(value)


def checked_optional(value: Any, where: str, name: str, positive: bool = False) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TableError(f"{where}: {name} must be a finite number or null, got {value!r}")
    if positive and not value > 0:
        raise TableError(f"{where}: {name} must be > 0, got {value!r}")
    return float(value)


def checked_turn(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise TableError(f"{where}: turn must be an int >= 1, got {value!r}")
    return value
