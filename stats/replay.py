"""A finite log's statistics: the Python replay engine, the native one, and the reference.

Every payload goes through the one ingest step (:func:`kvcast.stats.ingest.ingest`: parse,
label, apply), the same the daemon runs per partition, so a file replayed at any speed gives
exactly the numbers the live daemon would. :func:`replay_lines` may instead use the native
engine, which applies the same rules in C and is tested equal to this.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from kvcast.stats.config import StatsConfig
from kvcast.stats.engine import StatsEngine
from kvcast.stats.events import EventRejected
from kvcast.stats.ingest import EngineTarget, ingest
from kvcast.stats.labeller import IntentLabeller
from kvcast.stats.native.replay import NativeReplay, ReplayUnsupported, native_available
from kvcast.stats.snapshot import Snapshot
from kvcast.stats.taxonomy import label_map as taxonomy_label_map
from kvcast.stats.window import merge_anchored

log = logging.getLogger(__name__)


class Pipeline:
    """The Python replay engine: raw payloads through :func:`ingest` into a :class:`StatsEngine`.

    The daemon runs the same ingest step per partition (``kvcast.daemon.runner``); the native
    engine (``kvcast.stats.native``) is specified against it. A payload's position is the
    number of payloads offered before it.
    """

    def __init__(
        self,
        config: StatsConfig,
        labeller: IntentLabeller | None = None,
        *,
        clock_s: float | None = None,
    ) -> None:
        """``clock_s``: wall-clock time (s) the ``future`` bound counts from; default now."""
        self.engine = StatsEngine(config, clock_s=clock_s)
        self.labeller = labeller or IntentLabeller()
        self.last_rejection: EventRejected | None = None
        self.offered = 0
        self._target = EngineTarget(self.engine)

    def offer(self, payload: bytes | str) -> bool:
        """Process one raw payload; return whether it was valid (late/duplicate count as valid)."""
        rejection = ingest(((self._target, self.offered, payload),), self.labeller)
        self.offered += 1
        if rejection is not None:
            self.last_rejection = rejection
            return False
        return True

    def offer_all(self, payloads: Iterable[bytes | str]) -> None:
        """Process payloads in order (those between two rejections are labelled together)."""
        target, start = self._target, self.offered
        items = [(target, start + i, payload) for i, payload in enumerate(payloads)]
        self.offered += len(items)
        rejection = ingest(items, self.labeller)
        if rejection is not None:
            self.last_rejection = rejection


def offline_statistics(
    records: Iterable[tuple[Hashable, int, bytes]],
    config: StatsConfig,
    label_map: Mapping[str, str] | None = None,
    clock_s: float | None = None,
) -> tuple[Snapshot, Counter[str]]:
    """What the daemon publishes for ``records`` (partition, offset, payload), in one process.

    One pipeline per partition fed in offset order (a partition is the unit of ordering), the
    partitions' statistics merged (each window cut at its own partition's age limit), the
    snapshot taken at the newest event time; with the
    rejections by reason. The reference the daemon's tests and the soak compare against.
    ``clock_s``: wall-clock time (s) the ``future`` bound counts from; default now.
    """
    labels = dict(label_map) if label_map is not None else taxonomy_label_map()
    clock = time.time() if clock_s is None else clock_s
    pipelines: dict[Hashable, Pipeline] = defaultdict(
        lambda: Pipeline(config, IntentLabeller(label_map=labels), clock_s=clock)
    )
    for partition, _, payload in sorted(records, key=lambda r: (str(r[0]), r[1])):
        pipelines[partition].offer(payload)
    merged = StatsEngine(config)
    rejected: Counter[str] = Counter()
    for pipeline in pipelines.values():
        merged.arrivals.merge(pipeline.engine.arrivals)
        rejected.update(pipeline.engine.counters.rejected)
    # Each partition's window is cut at its own age limit, as the daemon's store does.
    merged.window = merge_anchored(
        ((p.engine.window, p.engine.tracker.newest_event_time) for p in pipelines.values()), config
    )
    newest = max(p.engine.tracker.newest_event_time for p in pipelines.values())
    return merged.snapshot(newest, age_limited=False), rejected


ReplayEngineName = Literal["auto", "native", "python"]


@dataclass(frozen=True)
class ReplayProgress:
    """Where a replay stands: lines offered, events rejected and duplicates so far."""

    engine: Literal["native", "python"]
    offered: int
    rejected: int
    duplicates: int


def replay_lines(
    open_batches: Callable[[], Iterable[Sequence[bytes]]],
    config: StatsConfig,
    *,
    engine: ReplayEngineName = "auto",
    on_batch: Callable[[ReplayProgress], None] | None = None,
    label_map: Mapping[str, str] | None = None,
    clock_s: float | None = None,
) -> StatsEngine:
    """Every line through the statistics, then the end of input (all conversations complete).

    ``open_batches()`` yields the lines in batches; it is called again, from the start, when
    the native engine meets a value it cannot represent and the Python engine takes over.
    ``engine``: ``native`` (the C engine, same numbers, several times faster; RuntimeError when
    not built), ``python`` (the daemon's engine, per event) or ``auto`` (native when built).
    ``on_batch`` hears the progress after each batch. ``label_map``: the taxonomy's producer
    label -> state label (default: the 30 categories, :func:`~kvcast.stats.taxonomy.label_map`).
    ``clock_s``: wall-clock time (s) the ``future`` bound counts from (default: now, once, so
    that both engines and a retry judge every line against the same clock).
    """
    labels = dict(label_map) if label_map is not None else taxonomy_label_map()
    clock = time.time() if clock_s is None else clock_s
    if engine == "native" or (engine == "auto" and native_available()):
        try:
            return _replay_native(open_batches, config, on_batch, labels, clock)
        except ReplayUnsupported as exc:  # e.g. a timestamp of 2**52 s or more
            log.warning("native replay engine: %s; replaying with the Python engine", exc)
    return _replay_python(open_batches, config, on_batch, labels, clock)


def _replay_native(
    open_batches: Callable[[], Iterable[Sequence[bytes]]],
    config: StatsConfig,
    on_batch: Callable[[ReplayProgress], None] | None,
    label_map: dict[str, str],
    clock_s: float,
) -> StatsEngine:
    replay = NativeReplay(config, label_map=label_map, clock_s=clock_s)
    offered = 0
    for batch in open_batches():
        offered += replay.offer_lines(batch)
        if on_batch is not None:
            on_batch(ReplayProgress("native", offered, replay.rejected_total, replay.duplicates))
    replay.finish()
    return replay.to_engine()


def _replay_python(
    open_batches: Callable[[], Iterable[Sequence[bytes]]],
    config: StatsConfig,
    on_batch: Callable[[ReplayProgress], None] | None,
    label_map: dict[str, str],
    clock_s: float,
) -> StatsEngine:
    pipeline = Pipeline(config, IntentLabeller(label_map=label_map), clock_s=clock_s)
    counters = pipeline.engine.counters
    offered = 0
    for batch in open_batches():
        pipeline.offer_all(batch)
        offered += len(batch)
        if on_batch is not None:
            rejected = sum(counters.rejected.values())
            on_batch(ReplayProgress("python", offered, rejected, counters.duplicates))
    pipeline.engine.finish()
    return pipeline.engine
