"""A Redis without persistence restarts and loses every key: all partitions are rebuilt.

A partition that keeps receiving notices at its next commit (the stored offset no longer
matches); a quiet one never commits again, so only the store's epoch tells it. Against a real
broker, a real ``redis-server`` (no append-only file, no snapshots) and a real ``kvcast run``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvcast.lab.bench.processes import OwnRedis, wait_until
from kvcast.lab.bench.soak import (
    Records,
    compare,
    stored_offsets,
    wait_consumed,
    workload,
)
from tests.reliability.tally import TALLY
from tests.services import missing
from tests.support import produce, readiness, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def produce_to(bootstrap: str, topic: str, partition: int, lines: list[bytes], records: Records):
    """Send ``lines`` to one partition; append (partition, offset, line) of each."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    futures = [(producer.send(topic, value=line, partition=partition), line) for line in lines]
    producer.flush()
    for future, line in futures:
        metadata = future.get(timeout=10)
        records.append((metadata.partition, metadata.offset, line))
    producer.close()


@pytest.mark.parametrize("kafka_topic", [2], indirect=True)
def test_a_quiet_partition_is_rebuilt_after_redis_lost_its_data(
    tmp_path: Path, kafka_bootstrap: str, kafka_topic: str
) -> None:
    """Both partitions consumed; Redis restarted empty; new events on partition 0 only. The
    daemon reloads both (partition 1 through the epoch), re-reads them from the broker, and
    publishes exactly the statistics of the whole log."""
    if shutil.which("redis-server") is None:
        missing("redis-server binary", "PATH", "not installed")
    directory = tmp_path / "redis"
    directory.mkdir()
    redis = OwnRedis(directory, extra=["--appendonly", "no"])  # a cache-style Redis
    namespace = "dataloss"
    records: Records = []
    produce(kafka_bootstrap, kafka_topic, workload(1500, seed=41), records)
    assert {partition for partition, _, _ in records} == {0, 1}
    daemon = start_daemon(tmp_path, kafka_bootstrap, kafka_topic, redis.url, namespace)
    client = redis.client()
    try:
        wait_consumed(client, namespace, kafka_topic, records, 2)
        redis.restart()
        assert stored_offsets(client, namespace, kafka_topic, 2) == [-1, -1]  # all gone
        produce_to(kafka_bootstrap, kafka_topic, 0, workload(200, seed=42), records)
        wait_consumed(client, namespace, kafka_topic, records, 2)
        assert b"the state store lost its data" in daemon.log.read_bytes()
        wait_until(lambda: readiness(daemon)[0] == 200, 30, "ready after the reload")
        differences = compare(daemon, records)
        TALLY.add(faults=1, events_compared=len(records), differences=len(differences))
        assert differences == []
        assert daemon.stop() == 0
    finally:
        client.close()
        if daemon.process.poll() is None:
            daemon.stop()
        redis.stop()
