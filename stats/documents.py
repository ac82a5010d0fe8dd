"""The published documents as types: the forecast and the priority table the daemon serves.

The refresher (``kvcast.daemon.refresh``) builds a :class:`ForecastDocument` and a
:class:`TableDocument`; they travel typed to the HTTP handlers and the Prometheus collector,
which read attributes, and become JSON only at the boundaries (``/v1/forecast``,
``/v1/table``, the table written to the store) through ``to_dict()``. The dicts are the
contract of SPEC sections 5 and 6: the same keys, in the same order, with the same values as
the documents built as dicts before these types existed.

A document read from a dict (:meth:`TableDocument.from_dict`, :meth:`ShadowCurve.from_dict`)
must hold exactly the keys of its type: a key renamed or added where the dict is built fails
there, instead of a gauge or a table field going missing without a word.

Units: capacities in blocks, times in seconds (``event_time`` on the events' own clock,
``computed_at`` and ``generated_at`` Unix seconds), hit ratios and probabilities in 0-1.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvcast.stats.forecast_result import Forecast, RequiredCapacity

__all__ = [
    "DocumentError",
    "ForecastDocument",
    "ShadowCurve",
    "ShadowPoint",
    "SharedRow",
    "TableDefaults",
    "TableDocument",
    "TableState",
]


class DocumentError(ValueError):
    """A dict that does not hold exactly the keys of the document type it is read as."""


def _fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _checked(doc: Mapping[str, Any], cls: type, where: str) -> Mapping[str, Any]:
    """``doc`` itself when its keys are exactly ``cls``'s fields; else DocumentError naming
    the unknown and the missing keys."""
    expected = set(_fields(cls))
    unknown, missing = sorted(set(doc) - expected), sorted(expected - set(doc))
    if unknown or missing:
        raise DocumentError(f"{where}: unknown keys {unknown}, missing keys {missing}")
    return doc


def _plain(cls_instance: Any) -> dict[str, Any]:
    """The fields of a flat dataclass instance, in declaration order."""
    return {name: getattr(cls_instance, name) for name in _fields(type(cls_instance))}


# -- the shadow simulation -------------------------------------------------------------------


@dataclass(frozen=True)
class ShadowPoint:
    """One capacity of the shadow LRU's measured curve (blocks; hit ratio None: not enough
    kept accesses yet)."""

    capacity_blocks: float
    hit_ratio: float | None


@dataclass(frozen=True)
class ShadowCurve:
    """The sampled shadow LRU simulation of the stream (``kvcast.daemon.shadow_feed``).

    ``hit_ratio`` at the curve's capacity closest to the configured one (``capacity_blocks``);
    ``sampling_ratio``: the share of KV blocks kept (0-1); ``session_share``: the share of
    sessions simulated; ``kept_accesses`` since ``window_start`` (s); ``events`` seen and
    ``cached_blocks`` held by the simulation; ``forecast_error``: the forecast's hit ratio
    minus ``hit_ratio``, None while either is unknown (:meth:`against`).
    """

    hit_ratio: float | None
    capacity_blocks: float
    curve: tuple[ShadowPoint, ...]
    sampling_ratio: float
    session_share: float
    kept_accesses: int
    window_start: float | None
    events: int
    cached_blocks: int
    effectively_once: bool
    forecast_error: float | None = None

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> ShadowCurve:
        """The shadow feed's document (``forecast_error`` optional: :meth:`against` sets it)."""
        values = dict(doc)
        values.setdefault("forecast_error", None)
        _checked(values, cls, "shadow document")
        points = tuple(
            ShadowPoint(**_checked(point, ShadowPoint, "shadow curve point"))
            for point in values.pop("curve")
        )
        return cls(curve=points, **values)

    def against(self, predicted: float | None) -> ShadowCurve:
        """This curve with ``forecast_error`` = ``predicted`` (the forecast's hit ratio) minus
        the simulated one, None while either is missing or not finite."""
        error = None
        if predicted is not None and self.hit_ratio is not None and math.isfinite(predicted):
            error = float(predicted) - float(self.hit_ratio)
        return dataclasses.replace(self, forecast_error=error)

    def to_dict(self) -> dict[str, Any]:
        doc = _plain(self)
        doc["curve"] = [_plain(point) for point in self.curve]
        return doc


# -- the forecast ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ForecastDocument:
    """The forecast the daemon publishes: the model's
    :class:`~kvcast.stats.forecast_result.Forecast` (with its curve and tiers) and what the
    refresh adds to it.

    ``required_capacity_by_target``: the capacity per instance for each configured target
    (``--target-hit-ratio``), in that order; ``event_time``: the newest event time of the
    window (s, events' clock; None before any event); ``window_conversations``: completed
    conversations the window holds; ``computed_at``: when the refresh ran (Unix s);
    ``shadow``: the shadow simulation's curve, None when it is off or has not reported.
    """

    forecast: Forecast
    required_capacity_by_target: tuple[RequiredCapacity | None, ...]
    event_time: float | None
    window_conversations: int
    computed_at: float
    shadow: ShadowCurve | None = None

    def with_shadow(self, shadow: ShadowCurve | None) -> ForecastDocument:
        """This document with ``shadow`` beside it, its error taken against this forecast."""
        if shadow is None:
            return dataclasses.replace(self, shadow=None)
        return dataclasses.replace(self, shadow=shadow.against(self.forecast.hit_ratio))

    def to_dict(self) -> dict[str, Any]:
        """The ``/v1/forecast`` JSON: the forecast's keys, then the refresh's (``shadow``
        only when there is one). Plain Python numbers, None for NaN and infinities."""
        doc = self.forecast.to_dict()
        doc["required_capacity_by_target"] = [
            None if required is None else required.to_dict()
            for required in self.required_capacity_by_target
        ]
        doc["event_time"] = self.event_time
        doc["window_conversations"] = self.window_conversations
        doc["computed_at"] = self.computed_at
        if self.shadow is not None:
            doc["shadow"] = self.shadow.to_dict()
        return doc


# -- the priority table (SPEC section 5) -----------------------------------------------------


@dataclass(frozen=True)
class TableDefaults:
    """What engines use for a state the table does not list (probability, seconds)."""

    p_continue: float
    median_reuse_s: float


@dataclass(frozen=True)
class TableState:
    """One (intent, turn) row: P(next turn), the median reuse delay (s) and its log-normal
    fit (``mu``, ``sigma``, log s; None when unfitted), over ``conversations`` reaching the
    state and ``delay_samples`` delays."""

    intent: str
    turn: int
    p_continue: float
    median_reuse_s: float
    mu: float | None
    sigma: float | None
    conversations: int
    delay_samples: int


@dataclass(frozen=True)
class SharedRow:
    """The reuse law of blocks shared by two or more conversations: P(reused again), the
    median gap (s) and its fit (log s) as one instance sees it, over ``references`` gaps
    and ``lives`` ended block lives."""

    p_continue: float
    median_reuse_s: float
    mu: float | None
    sigma: float | None
    references: int
    lives: int


@dataclass(frozen=True)
class TableDocument:
    """The versioned priority table engines rank by (SPEC section 5).

    ``generated_at``: the snapshot's time (Unix s, events' clock); ``max_turn``: turns above
    it share its state; ``characteristic_time_s``: the forecast's T_C (the ``density``
    horizon), None while unknown; ``shared``: None where the window saw no shared block.
    """

    version: int
    generated_at: float
    window_conversations: int
    max_turn: int
    defaults: TableDefaults
    characteristic_time_s: float | None
    states: tuple[TableState, ...]
    shared: SharedRow | None

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> TableDocument:
        """The table as ``kvcast.stats.table.table_document`` builds it (exact keys)."""
        values = dict(_checked(doc, cls, "table document"))
        values["defaults"] = TableDefaults(
            **_checked(values["defaults"], TableDefaults, "table defaults")
        )
        values["states"] = tuple(
            TableState(**_checked(state, TableState, "table state")) for state in values["states"]
        )
        shared = values["shared"]
        values["shared"] = (
            None if shared is None else SharedRow(**_checked(shared, SharedRow, "table shared"))
        )
        return cls(**values)

    def with_version(self, version: int) -> TableDocument:
        return dataclasses.replace(self, version=version)

    def content_differs(self, previous: TableDocument | None) -> bool:
        """Whether anything but the version and the time stamp differs from ``previous``
        (None: nothing published yet, so it does)."""
        if previous is None:
            return True
        return dataclasses.replace(self, version=0, generated_at=0.0) != dataclasses.replace(
            previous, version=0, generated_at=0.0
        )

    def to_dict(self) -> dict[str, Any]:
        """The ``/v1/table`` JSON and the document written to the store."""
        doc = _plain(self)
        doc["defaults"] = _plain(self.defaults)
        doc["states"] = [_plain(state) for state in self.states]
        doc["shared"] = None if self.shared is None else _plain(self.shared)
        return doc
