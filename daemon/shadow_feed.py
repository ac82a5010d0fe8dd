"""The shadow simulation (``kvcast.stats.shadow``) fed from the consumer loop (SPEC section 12).

The publishing process (the primary) runs one sampled block-level LRU simulation at the
published curve's capacities over the events its partitions accept (duplicates and rejected
events never reach it); it hands a document to :class:`~kvcast.daemon.published.Published`
every refresh interval, which puts it under ``shadow`` in ``/v1/forecast`` with the forecast's
error against it. With ``--workers N`` the primary owns about 1/N of the partitions, so the
simulation takes its sessions as a 1/N share of the stream (``stream_share``). Events are
simulated in the order the loop applies them (arrival order, partitions interleaved by poll),
where ``kvcast simulate`` sorts a file by timestamp: the same on a stream that arrives in order.

Not effectively-once: the counters live in this process only. They are not part of the
partitions' checkpoints, so a restart starts the curve from nothing (and a cold cache), and
events replayed after a crash are counted again by the new process; the curve is a live
estimate of the last ``min_accesses`` kept accesses, not a committed statistic.
"""

from __future__ import annotations

from typing import Any

from kvcast.daemon.settings import DaemonSettings
from kvcast.stats.events import Event
from kvcast.stats.ingest import IngestTarget
from kvcast.stats.shadow import ShadowSimulator
from kvcast.stats.shadow_counters import DEFAULT_MAX_AGE_S


class ShadowedTarget:
    """An ingest target that applies to the partition's engine, then feeds the shadow the
    events the engine accepted."""

    __slots__ = ("engine", "shadow")

    def __init__(self, engine: Any, shadow: ShadowSimulator) -> None:
        self.engine = engine
        self.shadow = shadow

    def apply(self, event: Event, intent: str, position: int) -> object:
        outcome = self.engine.apply(event, intent, position)
        if outcome == "accepted":
            self.shadow.observe(event)
        return outcome

    def reject(self, reason: str, position: int, field: str | None) -> None:
        self.engine.reject(reason, position, field)


class ShadowFeed:
    """The primary process's shadow at ``capacities`` (the published curve's, blocks)."""

    def __init__(self, settings: DaemonSettings, capacities: list[float]) -> None:
        self.capacity_blocks = settings.capacity_blocks
        self.simulator = ShadowSimulator(
            capacities,
            settings.shadow_sampling,
            block_size=settings.stats.block_size,
            instances=settings.instances,
            stream_share=1.0 / settings.workers,
        )

    def target(self, engine: Any) -> IngestTarget:
        return ShadowedTarget(engine, self.simulator)

    def document(self) -> dict[str, Any]:
        """The measured curve over the newest slots holding enough kept accesses; expires
        the counters' slots older than the statistics window's age limit."""
        sim = self.simulator
        counters = sim.counters
        if counters.slots:
            newest = (max(counters.slots) + 1) * counters.slot_s
            counters.expire(newest - DEFAULT_MAX_AGE_S)
        since = counters.window_start()
        curve = counters.curve(since)
        at_capacity = min(curve, key=lambda p: abs(p.capacity_blocks - self.capacity_blocks))
        return {
            "hit_ratio": at_capacity.hit_ratio,
            "capacity_blocks": at_capacity.capacity_blocks,
            "curve": [
                {"capacity_blocks": p.capacity_blocks, "hit_ratio": p.hit_ratio} for p in curve
            ],
            "sampling_ratio": sim.sampling,
            "session_share": sim.session_rate,
            "kept_accesses": counters.accesses(since),
            "window_start": since,
            "events": sim.events,
            "cached_blocks": len(sim.stack),
            "effectively_once": False,
        }
