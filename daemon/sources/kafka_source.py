"""Kafka as an event source: a kafka-python consumer group, offsets kept by the state store.

Kafka's own committed offsets are not the source of truth: on assignment the daemon loads
each partition's checkpoint from the store and seeks to the offset after it, so the state and
the position it corresponds to always move together. Offsets are still committed to Kafka
(after the store) so that standard lag tooling sees the group's progress.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.errors import KafkaError

from kvcast.daemon.sources.base import PartitionListener, Record, new_record

log = logging.getLogger(__name__)

# Group timings that keep a rebalance (and a restart after kill -9) to a few seconds.
GROUP_SETTINGS: dict[str, int] = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 1000,
    "max_poll_interval_ms": 30000,
}


# Fetch settings measured in docs/performance.md: larger fetches per round trip (up to 8 MiB per
# partition, the broker waiting up to 100 ms for 64 KiB) cut the per-message overhead of the
# fetcher. CRCs stay checked: with the `crc32c` C extension installed that costs ~5 %.
FETCH_SETTINGS: dict[str, int] = {
    "fetch_min_bytes": 1 << 16,
    "fetch_max_wait_ms": 100,
    "max_partition_fetch_bytes": 8 << 20,
}


# --partition-assignment: how the group spreads partitions. cooperative-sticky (incremental
# rebalancing): a member that joins or leaves moves only the partitions that must move, the
# others keep theirs and their loaded state; range (kafka-python's default, eager): every
# rebalance revokes every partition of every member, which then reload from the store.
ASSIGNORS = {"cooperative-sticky": CooperativeStickyAssignor, "range": RangePartitionAssignor}

# A coordinator away for longer than this (s) makes the source not ready.
COORDINATOR_GRACE_S = 3.0
LAG_TIMEOUT_MS = 1000  # the lag query's wait for the broker, per call


def partition_name(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


def parse_partition_name(name: str) -> TopicPartition:
    topic, _, number = name.rpartition(":")
    return TopicPartition(topic, int(number))


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, source: KafkaSource) -> None:
        self._source = source

    def on_partitions_revoked(self, revoked: Any) -> None:
        if self._source.listener is not None and revoked:
            self._source.listener.on_revoke(
                sorted(partition_name(p.topic, p.partition) for p in revoked)
            )

    def on_partitions_assigned(self, assigned: Any) -> None:
        if self._source.listener is not None and assigned:
            self._source.listener.on_assign(
                sorted(partition_name(p.topic, p.partition) for p in assigned)
            )


class KafkaSource:
    """Subscribes ``group_id`` to ``topic`` on ``bootstrap`` (host:port[,host:port])."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group_id: str,
        assignment: str = "cooperative-sticky",
        **consumer_options: Any,
    ) -> None:
        self.topic = topic
        self.listener: PartitionListener | None = None
        options = {**GROUP_SETTINGS, **FETCH_SETTINGS, **consumer_options}
        options["partition_assignment_strategy"] = (ASSIGNORS[assignment],)
        self._consumer = KafkaConsumer(
            bootstrap_servers=bootstrap.split(","),
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **options,
        )
        self._subscribed = False
        self._last_ok = time.monotonic()
        self._last_error = ""
        self._coordinator_lost_since: float | None = None

    def set_listener(self, listener: PartitionListener) -> None:
        self.listener = listener

    def poll(self, timeout_s: float, max_records: int) -> list[Record]:
        if not self._subscribed:
            self._consumer.subscribe([self.topic], listener=_Rebalance(self))
            self._subscribed = True
        try:
            batches = self._consumer.poll(timeout_ms=int(timeout_s * 1000), max_records=max_records)
        except KafkaError as exc:
            self._last_error = str(exc)
            log.warning("kafka poll failed: %s", exc)
            time.sleep(min(timeout_s, 1.0))
            return []
        self._last_ok = time.monotonic()
        self._check_coordinator()
        # Partitions in name order; a partition's messages already come in offset order.
        named = sorted((partition_name(tp.topic, tp.partition), ms) for tp, ms in batches.items())
        records: list[Record] = []
        for name, messages in named:
            records += [new_record(name, message.offset, message.value) for message in messages]
        return records

    def _check_coordinator(self) -> None:
        """Note when the group coordinator became unreachable (poll does not raise for that:
        kafka-python keeps reconnecting quietly). Runs on the consumer's own thread."""
        coordinator = getattr(self._consumer, "_coordinator", None)
        try:
            lost = coordinator is not None and coordinator.coordinator_unknown()
        except Exception:  # a private API of kafka-python: never let it break consumption
            lost = False
        if not lost:
            self._coordinator_lost_since = None
        elif self._coordinator_lost_since is None:
            self._coordinator_lost_since = time.monotonic()

    def seek(self, partition: str, offset: int) -> None:
        self._consumer.seek(parse_partition_name(partition), max(offset, 0))

    def pause(self, partitions: list[str]) -> None:
        self._consumer.pause(*[parse_partition_name(p) for p in partitions])

    def resume(self, partitions: list[str]) -> None:
        self._consumer.resume(*[parse_partition_name(p) for p in partitions])

    def commit_offsets(self, offsets: dict[str, int]) -> None:
        """Tell Kafka how far the store has checkpointed (next offset to read), for tooling."""
        try:
            self._consumer.commit_async(
                {
                    parse_partition_name(p): OffsetAndMetadata(o + 1, "", -1)
                    for p, o in offsets.items()
                    if o >= 0
                }
            )
        except (KafkaError, AssertionError, ValueError) as exc:
            log.debug("kafka offset commit skipped: %s", exc)

    def finished(self) -> bool:
        return False

    def health(self) -> tuple[bool, str]:
        lost_since = self._coordinator_lost_since
        if lost_since is not None and time.monotonic() - lost_since > COORDINATOR_GRACE_S:
            return False, f"group coordinator unreachable for {time.monotonic() - lost_since:.0f} s"
        silent_s = time.monotonic() - self._last_ok
        if silent_s > 30:
            return (
                False,
                f"no successful poll for {silent_s:.0f} s: {self._last_error or 'no reply'}",
            )
        return True, "ok"

    def lag(self) -> int | None:
        """Records behind the log end over the assigned partitions; None when the broker does
        not answer within ``LAG_TIMEOUT_MS`` (this runs on the consumer's thread: a dead
        broker must not hold up the loop, whose polls are what notice the outage)."""
        assigned = self._consumer.assignment()
        if not assigned:
            return 0
        try:
            ends = self._consumer.end_offsets(list(assigned), timeout_ms=LAG_TIMEOUT_MS)
            positions = [self._consumer.position(tp, timeout_ms=LAG_TIMEOUT_MS) for tp in assigned]
        except KafkaError:
            return None
        if None in positions:  # a position the broker did not confirm in time
            return None
        return sum(max(ends[tp] - at, 0) for tp, at in zip(assigned, positions, strict=True))

    def close(self) -> None:
        self._consumer.close(autocommit=False)
