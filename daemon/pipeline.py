"""The event pipeline: raw messages -> validated events -> intent -> statistics engine.

One pipeline serves every source (a replay file, Kafka), so a file replayed at any speed gives
exactly the numbers the live daemon would. A finite log may instead go through the native
engine (:func:`replay_lines`), which applies the same rules in C and is tested equal to this.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kvcast.stats.config import StatsConfig
from kvcast.stats.engine import StatsEngine
from kvcast.stats.events import Event, EventRejected, parse_event
from kvcast.stats.native_replay import NativeReplay, ReplayUnsupported, native_available
from kvcast.stats.snapshot import Snapshot
from kvcast.stats.taxonomy import UNKNOWN

log = logging.getLogger(__name__)

# Distinct intent labels accepted from producers before the rest are folded into `unknown`;
# the label set becomes table keys and metric labels, so it must stay bounded.
MAX_INTENT_LABELS = 64


@dataclass
class IntentLabeller:
    """The intent of an event: the producer's label when given, else ``unknown``.

    The classifier plugs in as ``classify`` (one event) or ``classify_batch`` (a consumer poll's
    events at once). Labels beyond ``max_labels`` distinct ones are folded into ``unknown``.
    """

    classify: Callable[[Event], str] | None = None
    classify_batch: Callable[[Sequence[Event]], list[str]] | None = None
    max_labels: int = MAX_INTENT_LABELS
    labels: set[str] = field(default_factory=set)
    folded: int = 0

    def __call__(self, event: Event) -> str:
        label = event.intent
        if label is None:
            label = self.classify(event) if self.classify is not None else UNKNOWN
        return self._bounded(label)

    def label_batch(self, events: Sequence[Event]) -> list[str]:
        """Labels of several events in order; those without one are classified together."""
        if self.classify_batch is None:
            # Inlined __call__ (one poll's worth of events per call): 260 -> 55 ns per event.
            classify, known = self.classify, self.labels
            out: list[str] = []
            for event in events:
                label = event.intent
                if label is None:
                    label = classify(event) if classify is not None else UNKNOWN
                if label not in known:
                    label = self._bounded(label)
                out.append(label)
            return out
        missing = [i for i, event in enumerate(events) if event.intent is None]
        labels: list[str] = [event.intent or UNKNOWN for event in events]
        if missing:
            for index, label in zip(
                missing, self.classify_batch([events[i] for i in missing]), strict=True
            ):
                labels[index] = label
        return [self._bounded(label) for label in labels]

    def _bounded(self, label: str) -> str:
        if label in self.labels or label == UNKNOWN:
            return label
        if len(self.labels) < self.max_labels:
            self.labels.add(label)
            return label
        self.folded += 1
        return UNKNOWN


class Pipeline:
    """Feeds raw event payloads through validation and labelling into a :class:`StatsEngine`."""

    def __init__(self, config: StatsConfig, labeller: IntentLabeller | None = None) -> None:
        self.engine = StatsEngine(config)
        self.labeller = labeller or IntentLabeller()
        self.last_rejection: EventRejected | None = None

    def offer(self, payload: bytes | str) -> bool:
        """Process one raw payload; return whether it was valid (late/duplicate count as valid)."""
        try:
            event = parse_event(payload)
        except EventRejected as rejection:
            self.last_rejection = rejection
            self.engine.reject(rejection.reason)
            return False
        self.engine.apply(event, self.labeller(event))
        return True

    def offer_all(self, payloads: Iterable[bytes | str]) -> None:
        for payload in payloads:
            self.offer(payload)


def offline_statistics(
    records: Iterable[tuple[Hashable, int, bytes]], config: StatsConfig
) -> tuple[Snapshot, Counter[str]]:
    """What the daemon publishes for ``records`` (partition, offset, payload), in one process.

    One pipeline per partition fed in offset order (a partition is the unit of ordering), the
    partitions' statistics merged, the snapshot taken at the newest event time; with the
    rejections by reason. The reference the daemon's tests and the soak compare against.
    """
    pipelines: dict[Hashable, Pipeline] = defaultdict(lambda: Pipeline(config))
    for partition, _, payload in sorted(records, key=lambda r: (str(r[0]), r[1])):
        pipelines[partition].offer(payload)
    merged = StatsEngine(config)
    rejected: Counter[str] = Counter()
    for pipeline in pipelines.values():
        merged.merge(pipeline.engine)
        rejected.update(pipeline.engine.counters.rejected)
    newest = max(p.engine.tracker.newest_event_time for p in pipelines.values())
    return merged.snapshot(newest), rejected


# Bytes of a file read at once by read_line_batches (a batch is about this size).
READ_BATCH_BYTES = 4 << 20


def read_line_batches(path: Path) -> Iterable[list[bytes]]:
    """Non-blank lines of a JSONL file, stripped, in lists of about 4 MiB of text."""
    with path.open("rb") as handle:
        while batch := handle.readlines(READ_BATCH_BYTES):
            yield [line for line in map(bytes.strip, batch) if line]


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
) -> StatsEngine:
    """Every line through the statistics, then the end of input (all conversations complete).

    ``open_batches()`` yields the lines in batches; it is called again, from the start, when
    the native engine meets a value it cannot represent and the Python engine takes over.
    ``engine``: ``native`` (the C engine, same numbers, several times faster; RuntimeError when
    not built), ``python`` (the daemon's engine, per event) or ``auto`` (native when built).
    ``on_batch`` hears the progress after each batch.
    """
    if engine == "native" or (engine == "auto" and native_available()):
        try:
            return _replay_native(open_batches, config, on_batch)
        except ReplayUnsupported as exc:  # e.g. a timestamp of 2**52 s or more
            log.warning("native replay engine: %s; replaying with the Python engine", exc)
    return _replay_python(open_batches, config, on_batch)


def _replay_native(
    open_batches: Callable[[], Iterable[Sequence[bytes]]],
    config: StatsConfig,
    on_batch: Callable[[ReplayProgress], None] | None,
) -> StatsEngine:
    replay = NativeReplay(config, max_labels=MAX_INTENT_LABELS)
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
) -> StatsEngine:
    pipeline = Pipeline(config)
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
