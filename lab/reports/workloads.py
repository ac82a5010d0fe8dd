"""The per-workload validations' inputs: a generator preset or the Mooncake synthetic trace, as
the product's statistics and the block simulator see it (tokens, seconds)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from kvcast.lab.reports.samples import sample_from_events, steady_sample
from kvcast.lab.sim.trace import SimTrace
from kvcast.lab.traces.mooncake import BLOCK_SIZE as MOONCAKE_BLOCK_SIZE
from kvcast.lab.traces.mooncake import convert_mooncake
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import agent, preset
from kvcast.stats.sample import WorkloadSample

AGENT_BLOCK_SIZE = 1024  # tokens
# The `agent` preset's run: coding-agent conversations last hours, so the statistics and the
# measurement are the requests from AGENT_WARMUP of the arrival window to its end.
AGENT_LAMBDA0 = 0.01  # conversations/s
AGENT_DURATION_S = 120_000.0
AGENT_SEED = 1
AGENT_WARMUP = 1 / 3

DEFAULT_MOONCAKE = (
    Path(__file__).resolve().parents[2] / "data/traces/mooncake_synthetic_trace.jsonl"
)


class GeneratorGrid(Protocol):
    """How a report generates its presets: ``lambda0`` conversations/s over ``duration_s``
    seconds, ``seed``, ``block_size`` tokens."""

    lambda0: float
    duration_s: float
    seed: int
    block_size: int


@dataclass(frozen=True)
class ValidationWorkload:
    """One workload: its events, the statistics' sample of them, the simulator's trace, its
    block size (tokens) and the simulation's warm-up and cool-down fractions (of the span of
    first-turn times: whole conversations), or ``steady_s``, the event times (s) between
    which every request is measured instead."""

    events: list[dict[str, Any]]
    sample: WorkloadSample
    trace: SimTrace
    block_size: int
    measured: tuple[float, float]
    steady_s: tuple[float, float] | None = None

    def steady_requests(self) -> NDArray[np.bool_] | None:
        """The requests measured by ``steady_s`` (None: whole conversations instead)."""
        if self.steady_s is None:
            return None
        start, end = self.steady_s
        return (self.trace.timestamp >= start) & (self.trace.timestamp < end)


def steady_rate(events: Sequence[dict[str, Any]], duration_s: float) -> float:
    """Conversation starts per second between 20 % and 80 % of the arrivals' span (s)."""
    lo, hi = 0.2 * duration_s, 0.8 * duration_s
    starts = sum(1 for e in events if e["turn"] == 1 and lo <= e["timestamp"] <= hi)
    return starts / (hi - lo)


def generated_workload(name: str, grid: GeneratorGrid) -> ValidationWorkload:
    """Preset ``name`` as ``grid`` generates it. Its conversations start over ``duration_s``
    and its branches and late turns run on after it, so lambda0 is the steady rate
    (:func:`steady_rate`), and the simulation measures the roots' middle."""
    trace = generate(
        preset(name),
        lambda0=grid.lambda0,
        duration_s=grid.duration_s,
        seed=grid.seed,
        block_size=grid.block_size,
    )
    events = list(trace.events())
    sample = sample_from_events(events, grid.block_size)
    sample = replace(sample, lambda0=steady_rate(events, grid.duration_s))
    measured = trace.measurement_fractions()
    return ValidationWorkload(events, sample, trace.sim_trace(), grid.block_size, measured)


def mooncake_workload(path: str | Path) -> ValidationWorkload:
    """The Mooncake trace at ``path`` converted with ``--match hashable`` and taken whole for
    the rate, as a replay of it would be (warm-up and cool-down 0.2)."""
    with open(path, "rb") as handle:
        records = [(line, json.loads(raw)) for line, raw in enumerate(handle, 1) if raw.strip()]
    events, _ = convert_mooncake(records, match="hashable")
    sample = sample_from_events(events, MOONCAKE_BLOCK_SIZE)
    trace = SimTrace.from_event_dicts(events, MOONCAKE_BLOCK_SIZE)
    return ValidationWorkload(events, sample, trace, MOONCAKE_BLOCK_SIZE, (0.2, 0.2))


def agent_workload(duration_s: float = AGENT_DURATION_S) -> ValidationWorkload:
    """The ``agent`` preset as docs/validation.md's "Agent traffic" runs it (1,024-token
    blocks; ``kvcast.lab.reports.big_context_validation``): its conversations run for hours,
    so its statistics and its measurement are the requests of the steady part of the stream,
    ``[AGENT_WARMUP * duration_s, duration_s)``, not whole conversations."""
    trace = generate(
        agent(),
        lambda0=AGENT_LAMBDA0,
        duration_s=duration_s,
        seed=AGENT_SEED,
        block_size=AGENT_BLOCK_SIZE,
    )
    events = list(trace.events())
    steady = (AGENT_WARMUP * duration_s, duration_s)
    sample = steady_sample(events, AGENT_BLOCK_SIZE, *steady)
    return ValidationWorkload(
        events, sample, trace.sim_trace(), AGENT_BLOCK_SIZE, (0.0, 0.0), steady_s=steady
    )
