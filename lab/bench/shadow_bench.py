"""The sampled shadow (``kvcast.stats.shadow``) against the exact block-level LRU simulator.

On a generated workload (``kvcast generate``'s model, ``requests`` requests in timestamp order)
at the daemon's curve (17 capacities, N/16 .. 16N):

- **error**: the shadow's curve at ``sampling`` minus the exact simulation's
  (``lab.sim.block_policies.lru_block``, every request measured), max abs over capacities, for
  each of ``seeds`` sampling seeds; on the first ``exact_requests`` requests when that is
  smaller (the exact simulator takes about a second per million blocks and capacity);
- **CPU**: ns per event of ``ShadowSimulator.observe`` over all ``requests`` events; baselines
  in the same run: the exact simulator's ns per event for one capacity (a curve costs one run
  per capacity), the alternative design (one LRU per capacity fed the same kept keys) and the
  daemon's own statistics on the same events (``PartitionEngine.apply``, what the shadow adds
  to);
- **memory**: the sampled cache's entries, and tracemalloc's count of the bytes still held by
  allocations made in ``stats/shadow.py`` after the whole stream (cache, counters).
"""

from __future__ import annotations

import math
import time
import tracemalloc
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from kvcast.lab.sim.block_policies import lru_block
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from kvcast.lab.workload.trace import Trace
from kvcast.stats.config import StatsConfig
from kvcast.stats.events import Event
from kvcast.stats.partition import PartitionEngine
from kvcast.stats.shadow import DEFAULT_SAMPLING, ShadowSimulator

CURVE_POINTS = 17  # as the daemon publishes: N/16 .. 16N, geometric
CHUNK = 50_000  # events built (and dropped) at a time, so that the stream is never all in memory


def curve_capacities(capacity_blocks: int) -> list[float]:
    """The daemon's curve grid (``daemon.refresh.capacity_grid``; the lab may not import it),
    rounded to whole blocks, the exact simulator's capacities."""
    half = CURVE_POINTS // 2
    return [float(round(capacity_blocks * 2 ** ((i - half) / 2))) for i in range(CURVE_POINTS)]


def workload(requests: int, preset_name: str, lambda0: float, seed: int) -> Trace:
    """The first ``requests`` requests (timestamp order) of a generated trace."""
    conversations = max(1, requests // 3)
    while True:
        trace = generate(
            preset(preset_name), lambda0=lambda0, conversations=conversations, seed=seed
        )
        if len(trace) >= requests:
            break
        conversations = math.ceil(conversations * 1.5 * requests / max(len(trace), 1))
    return prefix(trace, requests)


def prefix(trace: Trace, requests: int) -> Trace:
    """The first ``requests`` requests of ``trace``."""
    cut = {
        name: getattr(trace, name)[:requests]
        for name in ("conversation", "turn", "timestamp", "input_tokens", "output_tokens")
    }
    cut["blocks"] = trace.blocks[:requests]
    cut["intent"] = trace.intent[:requests]
    return Trace(
        **cut,
        intent_names=trace.intent_names,
        block_size=trace.block_size,
        conversations=trace.conversations,
    )


def events(trace: Trace, start: int = 0, stop: int | None = None) -> Iterator[list[Event]]:
    """The trace's requests as events, ``CHUNK`` at a time."""
    stop = len(trace) if stop is None else stop
    width = max(6, len(str(max(trace.conversations - 1, 0))))
    for a in range(start, stop, CHUNK):
        b = min(a + CHUNK, stop)
        conv, turn = trace.conversation[a:b].tolist(), trace.turn[a:b].tolist()
        ts, tokens = trace.timestamp[a:b].tolist(), trace.input_tokens[a:b].tolist()
        yield [
            Event(f"c{c:0{width}d}", t, s, n, 1)
            for c, t, s, n in zip(conv, turn, ts, tokens, strict=True)
        ]


class PerCapacityLru:
    """The alternative design: one LRU (an OrderedDict) per capacity on the kept keys, with the
    exact simulator's rules (hits read as the request starts, its blocks pinned, tail first).

    The shadow's estimate needs, per threshold t, the accesses with sampled distance below
    ``floor(t)`` and those at exactly ``floor(t)``: an LRU of ``floor(t) + 1`` keys holds both,
    the latter being its oldest key when it is full."""

    def __init__(self, shadow: ShadowSimulator) -> None:
        self.shadow = shadow
        self.sizes = [math.floor(t) + 1 for t in shadow.thresholds]
        self.caches: list[OrderedDict[int, None]] = [OrderedDict() for _ in self.sizes]
        self.below = [0] * len(self.sizes)  # accesses at distance < floor(t)
        self.upto = [0] * len(self.sizes)  # accesses at distance <= floor(t)
        self.accesses = 0

    def observe(self, event: Event) -> None:
        keys = self.shadow.keys(event)
        if not keys:
            return
        self.accesses += len(keys)
        for i, (cache, size) in enumerate(zip(self.caches, self.sizes, strict=True)):
            oldest = next(iter(cache)) if len(cache) == size else None
            held = sum(1 for k in keys if k in cache)  # resident as the request starts
            self.upto[i] += held
            self.below[i] += held - (1 if oldest is not None and oldest in keys else 0)
            for k in reversed(keys):  # tail first: the head ends most recent
                cache[k] = None
                cache.move_to_end(k)
            while len(cache) > size:  # LRU first; a request longer than the cache keeps its head
                cache.popitem(last=False)

    def hit_ratios(self) -> list[float]:
        """The shadow's estimate from these counts (see ``ShadowCounters``)."""
        total = self.accesses
        return [
            (b + (t - math.floor(t)) * (u - b)) / total if total else 0.0
            for b, u, t in zip(self.below, self.upto, self.shadow.thresholds, strict=True)
        ]


@dataclass(frozen=True)
class ShadowBenchResult:
    """Figures of one run (errors absolute, in hit ratio; times ns per event)."""

    requests: int
    blocks: int
    sampling: float
    capacities: list[float]
    exact_requests: int
    exact_curve: list[float]
    shadow_curves: list[list[float]]  # one per sampling seed
    max_abs_errors: list[float]  # one per sampling seed
    shadow_ns_per_event: float
    per_capacity_lru_ns_per_event: float
    exact_ns_per_event: float  # one capacity; the curve costs one run per capacity
    apply_ns_per_event: float  # the daemon's statistics (PartitionEngine.apply), same events
    stack_entries: int
    stack_limit: int
    memory_bytes: int  # held by allocations in stats/shadow.py after the stream
    counter_slots: int  # of those, the event-time slots of the counters (never expired here)
    kept_accesses: int
    preset: str
    lambda0: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def max_abs_error(self) -> float:
        return max(self.max_abs_errors)

    def rows(self) -> list[tuple[str, str, str, str]]:
        seeds = len(self.max_abs_errors)
        size = f"{self.exact_requests:,} requests"
        return [
            (
                f"shadow curve error at sampling {self.sampling:g} ({size}, "
                f"{len(self.capacities)} capacities, {seeds} seed{'s' * (seeds > 1)})",
                f"max abs {self.max_abs_error:.4f}",
                "exact block-level LRU simulation (0)",
                "-",
            ),
            (
                f"shadow CPU per event, sampling {self.sampling:g} ({self.requests:,} requests)",
                f"{self.shadow_ns_per_event:,.0f} ns/event (whole curve)",
                f"{self.exact_ns_per_event:,.0f} ns/event (exact simulator, one capacity)",
                f"{self.exact_ns_per_event * len(self.capacities) / self.shadow_ns_per_event:.1f}x"
                " (vs the exact curve)",
            ),
            (
                "shadow CPU per event vs the daemon's statistics",
                f"{self.shadow_ns_per_event:,.0f} ns/event",
                f"{self.apply_ns_per_event:,.0f} ns/event (PartitionEngine.apply)",
                f"+{self.shadow_ns_per_event / self.apply_ns_per_event:.0%}",
            ),
            (
                "shadow design: one stack with distances vs one LRU per capacity",
                f"{self.shadow_ns_per_event:,.0f} ns/event",
                f"{self.per_capacity_lru_ns_per_event:,.0f} ns/event (17 OrderedDict LRUs)",
                f"{self.per_capacity_lru_ns_per_event / self.shadow_ns_per_event:.2f}x",
            ),
            (
                f"shadow memory, sampling {self.sampling:g}",
                f"{self.memory_bytes / 1024:,.0f} KiB ({self.stack_entries:,} cached blocks, "
                f"{self.counter_slots:,} counter slots)",
                f"limit {self.stack_limit:,} blocks (largest capacity x sampling)",
                "-",
            ),
        ]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "max_abs_error": self.max_abs_error}


def _exact_curve(trace: Trace, capacities: Sequence[float]) -> tuple[list[float], float]:
    """Hit ratios of the exact simulator and its seconds per run (mean over capacities)."""
    sim = trace.sim_trace()
    total = int(sim.blocks.sum())
    ratios, elapsed = [], 0.0
    for cap in capacities:
        start = time.perf_counter()
        hits = lru_block(sim, int(cap))
        elapsed += time.perf_counter() - start
        ratios.append(int(hits.sum()) / total if total else 0.0)
    return ratios, elapsed / len(capacities)


def _feed(shadow: ShadowSimulator, trace: Trace, stop: int | None = None) -> float:
    """Seconds spent in ``observe`` over the trace's first ``stop`` events."""
    elapsed = 0.0
    for chunk in events(trace, 0, stop):
        observe = shadow.observe
        start = time.perf_counter()
        for ev in chunk:
            observe(ev)
        elapsed += time.perf_counter() - start
    return elapsed


def _apply_s(trace: Trace) -> float:
    """Seconds the daemon's statistics spend applying the events (``PartitionEngine.apply``,
    one partition): what the shadow adds its cost to."""
    engine = PartitionEngine(StatsConfig(block_size=trace.block_size), "bench:0")
    names, intents = trace.intent_names, trace.intent.tolist()
    elapsed, offset = 0.0, 0
    for chunk in events(trace):
        labels = [names[intents[offset + k]] for k in range(len(chunk))]
        apply = engine.apply
        start = time.perf_counter()
        for ev, label in zip(chunk, labels, strict=True):
            apply(ev, label, offset)
            offset += 1
        elapsed += time.perf_counter() - start
        engine.take_delta()  # as the daemon commits, so that pending state stays bounded
    return elapsed


def run_shadow_bench(
    *,
    requests: int = 1_000_000,
    exact_requests: int | None = None,
    sampling: float = DEFAULT_SAMPLING,
    seeds: int = 3,
    capacity_blocks: int = 2275,
    preset_name: str = "single",
    lambda0: float = 1.0,
    seed: int = 0,
) -> ShadowBenchResult:
    """Generate the workload, run the exact simulation and the shadow, measure both."""
    trace = workload(requests, preset_name, lambda0, seed)
    n_exact = len(trace) if exact_requests is None else min(exact_requests, len(trace))
    capacities = curve_capacities(capacity_blocks)

    shadow = ShadowSimulator(capacities, sampling)
    shadow_s = _feed(shadow, trace)
    full_curve = [p.hit_ratio or 0.0 for p in shadow.counters.curve()]
    alternative = PerCapacityLru(ShadowSimulator(capacities, sampling))
    alt_s = 0.0
    for chunk in events(trace):
        start = time.perf_counter()
        for ev in chunk:
            alternative.observe(ev)
        alt_s += time.perf_counter() - start

    apply_s = _apply_s(trace)

    exact_trace = trace if n_exact == len(trace) else prefix(trace, n_exact)
    exact, exact_run_s = _exact_curve(exact_trace, capacities)
    curves = []
    for k in range(seeds):
        if k == 0 and n_exact == len(trace):
            curves.append(full_curve)
            continue
        other = ShadowSimulator(capacities, sampling, seed=k)
        _feed(other, trace, n_exact)
        curves.append([p.hit_ratio or 0.0 for p in other.counters.curve()])
    errors = [float(np.max(np.abs(np.subtract(c, exact)))) for c in curves]

    tracemalloc.start()
    try:
        measured = ShadowSimulator(capacities, sampling)
        _feed(measured, trace)
        snap = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(True, "*stats/shadow.py")]
        )
        memory = sum(stat.size for stat in snap.statistics("filename"))
    finally:
        tracemalloc.stop()

    return ShadowBenchResult(
        requests=len(trace),
        blocks=int(trace.blocks.sum()),
        sampling=sampling,
        capacities=capacities,
        exact_requests=n_exact,
        exact_curve=exact,
        shadow_curves=curves,
        max_abs_errors=errors,
        shadow_ns_per_event=shadow_s / len(trace) * 1e9,
        per_capacity_lru_ns_per_event=alt_s / len(trace) * 1e9,
        exact_ns_per_event=exact_run_s / n_exact * 1e9,
        apply_ns_per_event=apply_s / len(trace) * 1e9,
        stack_entries=len(measured.stack),
        stack_limit=measured.stack.limit,
        memory_bytes=memory,
        counter_slots=len(measured.counters.slots),
        kept_accesses=shadow.counters.accesses(),
        preset=preset_name,
        lambda0=lambda0,
        extra={"per_capacity_lru_curve": alternative.hit_ratios()},
    )
