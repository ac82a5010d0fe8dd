"""Priority tables for the IAC policy in simulation, learned from the trace itself.

- :func:`learn_table`: the IAC paper's evaluation (its appendix A.4): the statistics come once
  from an earlier part of the trace, the conversations whose first turn falls in the first
  ``fraction`` of the span of first-turn times (every turn of them), and the policy is judged on
  the later conversations. With ``fraction`` equal to the warm-up fraction, the history is
  exactly the warm-up and never overlaps the measured conversations.
- :class:`RollingTable`: the causal mode (the paper's appendix B.3): the events are fed to a
  :class:`~kvcast.stats.engine.StatsEngine` as the simulation reaches them, and the table is
  rebuilt every ``refresh_s`` of event time from what has completed so far, as the daemon does.

Requests become events with ``session_id`` = the conversation number, ``input_tokens`` =
``R_j * block_size``, the request's intent (``unknown`` without one) and its ``block_hashes``
where the trace has them (so the table carries the shared blocks' reuse law).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from kvcast.exporters.kit.index import PriorityIndex
from kvcast.lab.sim.measurement import first_times
from kvcast.stats.config import StatsConfig
from kvcast.stats.engine import StatsEngine
from kvcast.stats.events import Event
from kvcast.stats.forecast import forecast_from_sample
from kvcast.stats.table import table_document

if TYPE_CHECKING:
    from kvcast.lab.sim.trace import SimTrace

UNKNOWN = "unknown"


def intent_labels(trace: SimTrace) -> list[str]:
    """The intent name of every request (``unknown`` where the trace has none)."""
    if trace.intent is None or not trace.intent_names:
        return [UNKNOWN] * len(trace)
    names = trace.intent_names
    return [names[k] for k in trace.intent.tolist()]


def request_event(trace: SimTrace, r: int, intent: str, block_size: int) -> Event:
    """Request ``r`` of ``trace`` as a contract event (sizes from ``R_j`` blocks)."""
    conv, turn = int(trace.conversation[r]), int(trace.turn[r])
    hashes = trace.block_hashes[r] if trace.block_hashes is not None else None
    return Event(
        session_id=str(conv),
        turn=turn,
        timestamp=float(trace.timestamp[r]),
        input_tokens=int(trace.blocks[r]) * block_size,
        output_tokens=0,
        request_id=f"{conv}:{turn}",
        intent=intent,
        block_hashes=None if hashes is None else list(hashes),
    )


def trace_clock(trace: SimTrace) -> float | None:
    """The wall clock (s) a trace's statistics are learned at: its last event time, so that
    no event of a trace recorded or shifted ahead of today is rejected as ``future`` (None:
    an empty trace, the engine's default)."""
    return float(trace.timestamp.max()) if len(trace) else None


def history_mask(trace: SimTrace, fraction: float) -> np.ndarray:
    """Requests of the conversations that start in the first ``fraction`` of first-turn times."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"learn fraction must lie in [0, 1], got {fraction}")
    first = first_times(trace.conversation, trace.timestamp, trace.conversations)
    seen = np.isfinite(first)
    if not seen.any():
        return np.zeros(len(trace), dtype=bool)
    t0, t1 = float(first[seen].min()), float(first[seen].max())
    conv_mask = seen & (first < t0 + fraction * (t1 - t0))
    return conv_mask[trace.conversation]


def learn_table(
    trace: SimTrace,
    fraction: float = 0.2,
    config: StatsConfig | None = None,
    capacity_blocks: float | None = None,
) -> dict[str, Any]:
    """The table (SPEC section 5 document) learned from the history part of ``trace``.

    The window holds the whole history (``window_conversations`` is raised to its size).
    With ``capacity_blocks``, the table carries ``characteristic_time_s``: the forecast's
    ``T_C`` at that capacity from the history's statistics, as the daemon publishes it.
    """
    cfg = config or StatsConfig()
    mask = history_mask(trace, fraction)
    n_conv = len(np.unique(trace.conversation[mask]))
    cfg = replace(cfg, window_conversations=max(1, n_conv), window_max_age_s=1e15)
    engine = StatsEngine(cfg, clock_s=trace_clock(trace))
    labels = intent_labels(trace)
    for r in np.flatnonzero(mask).tolist():
        engine.apply(request_event(trace, r, labels[r], cfg.block_size), labels[r])
    engine.finish()
    snapshot = engine.snapshot()
    t_c = None
    if capacity_blocks is not None and snapshot.window_conversations:
        t_c = forecast_from_sample(snapshot.sample, capacity_blocks, cfg.block_size)
        t_c = t_c.characteristic_time_s
    return table_document(snapshot, cfg, 1, characteristic_time_s=t_c)


def table_index(
    trace: SimTrace,
    table: dict[str, Any] | PriorityIndex | None,
    learn_fraction: float,
    config: StatsConfig | None,
    *,
    capacity_blocks: float | None = None,
    horizon_s: float | None = None,
) -> PriorityIndex:
    """A policy's index: ``table`` (a document or an index), or the one learned from the first
    ``learn_fraction`` of the conversations (its ``T_C`` at ``capacity_blocks``, blocks);
    ``horizon_s`` replaces density's horizon (s), as given. Builds one index."""
    if table is None:
        table = learn_table(trace, learn_fraction, config, capacity_blocks=capacity_blocks)
    if isinstance(table, PriorityIndex):
        if horizon_s is None:
            return table
        table = table.document
    return PriorityIndex(table, horizon_s=horizon_s)


def equal_table(p_continue: float = 0.5, median_reuse_s: float = 150.0) -> dict[str, Any]:
    """A table whose every state has the same priority (the defaults only)."""
    return {
        "version": 1,
        "defaults": {"p_continue": p_continue, "median_reuse_s": median_reuse_s},
        "states": [],
    }


class RollingTable:
    """The causal table: ``observe(r)`` feeds request r, ``index`` is the current table.

    Starts from the defaults; rebuilt every ``refresh_s`` seconds of event time.
    """

    def __init__(
        self, trace: SimTrace, config: StatsConfig | None = None, refresh_s: float = 600.0
    ) -> None:
        if not refresh_s > 0:
            raise ValueError("refresh_s must be > 0")
        self.trace = trace
        self.config = config or StatsConfig()
        self.engine = StatsEngine(self.config, clock_s=trace_clock(trace))
        self.labels = intent_labels(trace)
        self.refresh_s = float(refresh_s)
        self.index = PriorityIndex(None, max_turn=self.config.max_turn)
        self.version = 0
        self.next_refresh = float(trace.timestamp[0]) + self.refresh_s if len(trace) else 0.0

    def observe(self, r: int) -> None:
        """Feed request ``r`` (call in trace order); refresh the table when it is due."""
        now = float(self.trace.timestamp[r])
        if now >= self.next_refresh:
            self.version += 1
            doc = table_document(self.engine.snapshot(), self.config, self.version)
            self.index = PriorityIndex(doc)
            while self.next_refresh <= now:
                self.next_refresh += self.refresh_s
        label = self.labels[r]
        self.engine.apply(request_event(self.trace, r, label, self.config.block_size), label)
