"""A decorator for any state store that times each operation (for the store latency metric).

Wraps the store rather than sprinkling timers through the runner and the publisher: every call
through the :class:`StateStore` protocol is observed, successful or not, by operation name.
"""

from __future__ import annotations

import time
from typing import Any

from kvcast.daemon.latency import LatencyHistogram
from kvcast.daemon.stores.base import StateStore, WindowState
from kvcast.stats.config import StatsConfig
from kvcast.stats.partition import PartitionCheckpoint, PartitionDelta

OPERATIONS = ("commit", "load_partition", "load_window", "expire", "publish_table", "read_table")


class InstrumentedStore:
    """Times every operation of ``inner`` (seconds) into one histogram per operation."""

    def __init__(self, inner: StateStore) -> None:
        self.inner = inner
        self.latency = {operation: LatencyHistogram() for operation in OPERATIONS}

    def _timed(self, operation: str, call: Any, *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return call(*args)
        finally:
            self.latency[operation].observe(time.perf_counter() - started)

    def ping(self) -> None:
        self.inner.ping()

    def epoch(self) -> str:
        return self.inner.epoch()

    def load_partition(self, partition: str) -> PartitionCheckpoint | None:
        return self._timed("load_partition", self.inner.load_partition, partition)

    def commit(self, delta: PartitionDelta) -> None:
        self._timed("commit", self.inner.commit, delta)

    def load_window(self, config: StatsConfig) -> WindowState:
        return self._timed("load_window", self.inner.load_window, config)

    def expire(self, bucket_before: int, second_before: int) -> int:
        return self._timed("expire", self.inner.expire, bucket_before, second_before)

    def publish_table(self, document: dict[str, Any]) -> None:
        self._timed("publish_table", self.inner.publish_table, document)

    def read_table(self) -> dict[str, Any] | None:
        return self._timed("read_table", self.inner.read_table)

    def close(self) -> None:
        self.inner.close()

    def metrics(self) -> dict[str, Any]:
        """The ``store_latency`` entry of the publisher's metrics view, per operation."""
        return {"store_latency": {op: h.snapshot() for op, h in self.latency.items()}}
