"""The embedded in-memory state store: the default of ``kvcast run`` without ``--store``.

Behaves exactly like the Redis store (one contract test suite runs against both) but keeps
everything in this process, so it survives nothing: a restart starts from scratch.
"""

from __future__ import annotations

import copy
import math
import threading
import uuid
from typing import Any

from kvcast.daemon.stores.base import StaleOwner, WindowState
from kvcast.stats.arrivals import ArrivalStats
from kvcast.stats.config import StatsConfig
from kvcast.stats.engine import EventCounters
from kvcast.stats.partition import PartitionCheckpoint, PartitionDelta
from kvcast.stats.window import Bucket, StatsWindow, merge_anchored


class MemoryStore:
    """Thread-safe dictionaries behind the :class:`StateStore` protocol."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._partitions: dict[str, PartitionCheckpoint] = {}
        self._buckets: dict[str, dict[int, Bucket]] = {}  # partition -> index -> bucket
        self._arrivals: ArrivalStats | None = None
        self._counters = EventCounters()
        self._table: dict[str, Any] | None = None
        self._epoch = uuid.uuid4().hex  # the data lives as long as this object

    def ping(self) -> None:
        return None

    def epoch(self) -> str:
        return self._epoch

    def load_partition(self, partition: str) -> PartitionCheckpoint | None:
        with self._lock:
            checkpoint = self._partitions.get(partition)
            return copy.deepcopy(checkpoint)

    def commit(self, delta: PartitionDelta) -> None:
        with self._lock:
            checkpoint = self._partitions.get(delta.partition)
            stored = checkpoint.offset if checkpoint is not None else -1
            if stored != delta.base_offset:
                raise StaleOwner(
                    f"partition {delta.partition}: stored offset {stored},"
                    f" expected {delta.base_offset}",
                    stored,
                )
            if checkpoint is None:
                checkpoint = self._partitions[delta.partition] = PartitionCheckpoint(
                    offset=-1, newest_ts=-math.inf
                )
            checkpoint.offset = delta.offset
            checkpoint.newest_ts = delta.newest_ts
            checkpoint.conversations.update(delta.upserts)
            for session_id in delta.removals:
                checkpoint.conversations.pop(session_id, None)
            checkpoint.seen_ids.update(delta.ids_added)
            for request_id in delta.ids_removed:
                checkpoint.seen_ids.pop(request_id, None)
            checkpoint.shared_blocks.update(delta.shared_upserts)
            for block in delta.shared_removals:
                checkpoint.shared_blocks.pop(block, None)
            own = self._buckets.setdefault(delta.partition, {})
            for index, bucket in delta.buckets.items():
                own.setdefault(index, Bucket()).merge(bucket)
            if self._arrivals is None:
                self._arrivals = ArrivalStats(delta.arrivals.rate_window_s)
            self._arrivals.merge(delta.arrivals)
            self._counters.processed += delta.counters.processed
            self._counters.duplicates += delta.counters.duplicates
            self._counters.rejected.update(delta.counters.rejected)

    def load_window(self, config: StatsConfig) -> WindowState:
        with self._lock:
            partitions = []
            anchors = {}
            for partition, buckets in self._buckets.items():
                own = StatsWindow(config)
                own.buckets = buckets  # read only: merge_anchored copies into new buckets
                anchors[partition] = self._partitions[partition].newest_ts
                partitions.append((own, anchors[partition]))
            window = merge_anchored(partitions, config)
            arrivals = ArrivalStats(config.rate_window_s)
            if self._arrivals is not None:
                arrivals.merge(self._arrivals)
            counters = copy.deepcopy(self._counters)
            newest = max((p.newest_ts for p in self._partitions.values()), default=-math.inf)
        return WindowState(window, arrivals, counters, newest, anchors)

    def expire(self, bucket_before: int, second_before: int) -> int:
        with self._lock:
            stale = 0
            for buckets in self._buckets.values():
                for index in [index for index in buckets if index < bucket_before]:
                    del buckets[index]
                    stale += 1
            if self._arrivals is not None:
                for second in [s for s in self._arrivals.seconds if s < second_before]:
                    del self._arrivals.seconds[second]
            return stale

    def publish_table(self, document: dict[str, Any]) -> None:
        with self._lock:
            self._table = copy.deepcopy(document)

    def read_table(self) -> dict[str, Any] | None:
        with self._lock:
            return copy.deepcopy(self._table)

    def close(self) -> None:
        return None
