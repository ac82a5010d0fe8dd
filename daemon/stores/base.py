"""The state-store protocol: where partitions checkpoint and the shared window lives.

Every implementation applies a :class:`~kvcast.stats.partition.PartitionDelta` atomically
together with the offset it covers, and refuses it (``StaleOwner``) when the partition's
stored offset is not the one the committer started from: a fenced-off former owner of a
partition (after a rebalance) can never double-count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from kvcast.stats.arrivals import ArrivalStats
from kvcast.stats.config import StatsConfig
from kvcast.stats.engine import EventCounters
from kvcast.stats.partition import PartitionCheckpoint, PartitionDelta
from kvcast.stats.window import StatsWindow


class StoreUnavailable(ConnectionError):
    """The store cannot be reached now; nothing was applied. Retry later."""


class StaleOwner(RuntimeError):
    """The partition was committed by someone else since this owner loaded it.

    ``stored_offset`` is the offset found in the store (None when a concurrent commit raced).
    """

    def __init__(self, message: str, stored_offset: int | None = None) -> None:
        super().__init__(message)
        self.stored_offset = stored_offset


@dataclass
class WindowState:
    """The shared statistics as stored: window buckets, arrival counters, event counters.

    ``window`` holds every partition's buckets cut at that partition's own age limit and then
    merged (:func:`~kvcast.stats.window.merge_anchored`): read it with ``age_limited=False``.
    ``newest_event_time`` is the newest of all partitions (s), what the table is stamped with.
    ``partition_newest``: each partition with window buckets -> its newest event time (s) as
    read (-inf: none), the anchors of their age limits; the expiry's bound comes from them."""

    window: StatsWindow
    arrivals: ArrivalStats
    counters: EventCounters
    newest_event_time: float
    partition_newest: dict[str, float] = field(default_factory=dict)


class StateStore(Protocol):
    """One interface per external system: the statistics state (SPEC section 7)."""

    def ping(self) -> None:
        """Raise :class:`StoreUnavailable` when the store does not answer."""

    def epoch(self) -> str:
        """The id of the store's data: the same for as long as the data lives, a new one once
        it was lost (a Redis restarted without persistence, a flush). Instances compare it to
        the one they loaded their partitions under, and reload every partition on a change."""

    def load_partition(self, partition: str) -> PartitionCheckpoint | None:
        """The partition's checkpoint, or None if it was never committed."""

    def commit(self, delta: PartitionDelta) -> None:
        """Apply ``delta`` atomically if the stored offset equals ``delta.base_offset``
        (-1 for a partition never committed); else raise :class:`StaleOwner`."""

    def load_window(self, config: StatsConfig) -> WindowState:
        """Everything needed for a snapshot: buckets (each partition's cut at its own age
        limit, then merged), arrival and event counters."""

    def expire(self, bucket_before: int, second_before: int) -> int:
        """Delete window buckets with index < ``bucket_before`` (of every partition) and arrival
        counters of seconds < ``second_before`` (neither can enter the window again); return
        buckets deleted (one per partition and index). Idempotent; any instance may call it."""

    def publish_table(self, document: dict[str, Any]) -> None:
        """Replace the published priority table atomically."""

    def read_table(self) -> dict[str, Any] | None:
        """The published priority table, or None."""

    def close(self) -> None:
        """Release connections."""
