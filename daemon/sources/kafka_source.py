"""Kafka as an event source: a kafka-python consumer group, offsets kept by the state store.

Kafka's own committed offsets are not the source of truth: on assignment the daemon loads
each partition's checkpoint from the store and seeks to the offset after it, so the state and
the position it corresponds to always move together. Offsets are still committed to Kafka
(after the store) so that standard lag tooling sees the group's progress.
"""

from __future__ import annotations

import logging
import socket
import threading
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
# Connecting in the background: a TCP probe of the bootstrap servers (seconds per server), then
# kafka-python's consumer; retried with doubling waits up to CONNECT_RETRY_MAX_S, the warning
# repeated at most every CONNECT_WARN_EVERY_S.
CONNECT_PROBE_TIMEOUT_S = 2.0
CONNECT_RETRY_MAX_S = 10.0
CONNECT_WARN_EVERY_S = 60.0
CONNECT_FIRST_WAIT_S = 5.0  # the constructor waits this long for the first attempt's outcome


def _host_port(server: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``host`` (port 9092) as a socket address."""
    host, colon, port = server.rpartition(":")
    if not colon or host.endswith(":") or (server.startswith("[") and not host.endswith("]")):
        host, port = server, "9092"
    return host.strip("[]"), int(port)


def probe_bootstrap(servers: list[str], timeout_s: float = CONNECT_PROBE_TIMEOUT_S) -> str | None:
    """None when one of ``servers`` accepts a TCP connection, else why none did (for one line:
    ``127.0.0.1:9099: connection refused``)."""
    reasons = []
    for server in servers:
        try:
            socket.create_connection(_host_port(server), timeout=timeout_s).close()
            return None
        except (OSError, ValueError) as exc:
            why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            reasons.append(f"{server}: {why[:1].lower()}{why[1:]}")
    return "; ".join(reasons)


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
        self.bootstrap = bootstrap
        options = {**GROUP_SETTINGS, **FETCH_SETTINGS, **consumer_options}
        options["partition_assignment_strategy"] = (ASSIGNORS[assignment],)
        unknown = set(options) - set(KafkaConsumer.DEFAULT_CONFIG)
        if unknown:  # what kafka-python's constructor would refuse, refused here and now
            raise ValueError(f"kafka consumer options not known: {', '.join(sorted(unknown))}")
        self._options = {
            "bootstrap_servers": bootstrap.split(","),
            "group_id": group_id,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            **options,
        }
        # The consumer is built in the background: kafka-python's constructor waits for the
        # bootstrap (30 s by default, then raises) and an absent broker must neither keep the
        # HTTP server from starting (so /readyz can say what is wrong) nor hold up SIGTERM.
        self._consumer: KafkaConsumer | None = None
        self._connected = threading.Event()
        self._attempted = threading.Event()  # the first attempt ended, either way
        self._closed = threading.Event()
        self._connect_error = ""
        self._connect_since = time.monotonic()
        self._subscribed = False
        self._last_ok = time.monotonic()
        self._last_error = ""
        self._coordinator_lost_since: float | None = None
        self._connector = threading.Thread(
            target=self._connect, name="kvcast-kafka-connect", daemon=True
        )
        self._connector.start()
        # A broker that answers is connected on return, as a synchronous constructor would be;
        # an absent one costs at most one attempt (a refused probe returns at once).
        self._attempted.wait(CONNECT_FIRST_WAIT_S)

    def _connect(self) -> None:
        """Build the consumer once a bootstrap server answers; until then say why, in kvcast's
        own log line (kafka-python's reconnect lines say little) and in :meth:`health`."""
        wait_s, warned_at = 0.5, float("-inf")
        servers = self._options["bootstrap_servers"]
        while not self._closed.is_set():
            reason = probe_bootstrap(servers)
            if reason is None:
                try:
                    consumer = KafkaConsumer(**self._options)
                except Exception as exc:  # KafkaTimeoutError (no bootstrap), SASL, TLS, ...
                    reason = f"{type(exc).__name__}: {exc}"
                else:
                    if self._closed.is_set():  # closed while it connected: nobody will use it
                        consumer.close(autocommit=False)
                        self._attempted.set()
                        return
                    self._consumer = consumer
                    if warned_at > float("-inf"):
                        log.warning("kafka broker %s answers now: consuming %s", self.bootstrap,
                                    self.topic)  # fmt: skip
                    self._connected.set()
                    self._attempted.set()
                    return
            self._connect_error = reason
            self._attempted.set()
            if time.monotonic() - warned_at >= CONNECT_WARN_EVERY_S:
                warned_at = time.monotonic()
                log.warning(
                    "kafka broker %s unreachable (%s): retrying, not ready until it answers "
                    "(/readyz names the source)", self.bootstrap, reason,
                )  # fmt: skip
            self._closed.wait(wait_s)
            wait_s = min(wait_s * 2, CONNECT_RETRY_MAX_S)

    def set_listener(self, listener: PartitionListener) -> None:
        self.listener = listener

    def poll(self, timeout_s: float, max_records: int) -> list[Record]:
        if self._consumer is None:  # still connecting: wait as long as a poll would
            self._connected.wait(timeout_s)
            return []
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
        if self._consumer is None:
            return
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
        if self._consumer is None:
            waited = time.monotonic() - self._connect_since
            if not self._connect_error:
                return False, f"connecting to kafka broker {self.bootstrap} ({waited:.0f} s)"
            return (False, f"kafka broker {self.bootstrap} unreachable for {waited:.0f} s:"
                           f" {self._connect_error}")  # fmt: skip
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
        if self._consumer is None:
            return None
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
        self._closed.set()  # a connector still waiting gives up; one in kafka-python closes
        if self._consumer is not None:
            self._consumer.close(autocommit=False)
