"""`kvcast run` against a real Kafka-protocol broker and a real Redis.

The reference is computed offline from the same records: one StatsEngine per partition fed
in offset order (a partition is the unit of ordering), merged. The daemon's /v1/table,
/v1/forecast and rejection counts must equal it exactly (``soak.compare``): after an
uninterrupted run, after kill -9 and a restart, and with two instances in one consumer group.
"""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from kafka import KafkaProducer

from kvcast.lab.bench.processes import DaemonProcess, wait_until
from kvcast.lab.bench.soak import STATS_FLAGS, Records, compare, stored_offsets, wait_consumed
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset

pytestmark = pytest.mark.integration


@pytest.fixture
def produced(kafka_bootstrap: str, kafka_topic: str) -> Records:
    trace = generate(preset("mixed"), lambda0=2.0, conversations=1500, seed=21, prompts=False)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=5)
    futures = []
    for index, line in enumerate(trace.jsonl_lines()):
        payload = line.rstrip(b"\n")
        if index == 400:
            payload = b'{"session_id": 1}'  # one broken event, rejected with a reason
        key = orjson.loads(line)["session_id"].encode()
        futures.append((producer.send(kafka_topic, key=key, value=payload), payload))
    producer.flush()
    records = []
    for future, payload in futures:
        metadata = future.get(timeout=10)
        records.append((metadata.partition, metadata.offset, payload))
    producer.close()
    return records


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[list[DaemonProcess]]:
    started: list[DaemonProcess] = []
    yield started
    for daemon in started:
        if daemon.process.poll() is None:
            daemon.stop(signal.SIGKILL)


def start(daemons, tmp_path, bootstrap, topic, redis_url, namespace) -> DaemonProcess:
    args = [
        "--source", f"kafka://{bootstrap}/{topic}",
        "--store", redis_url,
        "--namespace", namespace,
        "--metrics-addr", "127.0.0.1:0",
        "--commit-interval", "0.2",
        # several commits per run even when the whole topic is read within one interval
        "--commit-max-events", "500",
        "--refresh-interval", "0.3",
        "--table-interval", "0.1",
        "--status-interval", "1",
        *STATS_FLAGS,  # the soak's settings, which its offline reference (compare) uses
    ]  # fmt: skip
    daemon = DaemonProcess(args, tmp_path / f"daemon-{len(daemons)}.log")
    daemons.append(daemon)
    return daemon


def test_uninterrupted_run_publishes_the_offline_statistics(
    daemons, tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_client, redis_namespace,
    produced,
) -> None:  # fmt: skip
    daemon = start(daemons, tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_namespace)
    wait_consumed(redis_client, redis_namespace, kafka_topic, produced, 4)
    assert compare(daemon, produced) == []
    metrics = urllib.request.urlopen(daemon.url + "/metrics", timeout=5).read().decode()
    assert 'kvcast_events_rejected_total{reason="wrong_type"} 1.0' in metrics
    assert daemon.get("/readyz")["status"] == "ready"
    started = time.monotonic()
    assert daemon.stop(signal.SIGTERM) == 0
    assert time.monotonic() - started < 15


def test_kill_9_and_restart_lose_and_double_nothing(
    daemons, tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_client, redis_namespace,
    produced,
) -> None:  # fmt: skip
    first = start(daemons, tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_namespace)
    deadline = time.monotonic() + 60
    while sum(o + 1 for o in stored_offsets(redis_client, redis_namespace, kafka_topic, 4)) < 1500:
        assert time.monotonic() < deadline, first.log.read_text()
        time.sleep(0.05)
    first.stop(signal.SIGKILL)
    assert sum(o + 1 for o in stored_offsets(redis_client, redis_namespace, kafka_topic, 4)) < len(
        produced
    ), "the kill came too late to interrupt anything"
    second = start(daemons, tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_namespace)
    wait_consumed(redis_client, redis_namespace, kafka_topic, produced, 4)
    assert compare(second, produced) == []


def test_two_instances_in_one_group_equal_one(
    daemons, tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_client, redis_namespace,
    produced,
) -> None:  # fmt: skip
    one = start(daemons, tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_namespace)
    two = start(daemons, tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_namespace)
    wait_consumed(redis_client, redis_namespace, kafka_topic, produced, 4, 90)
    # Cooperative rebalancing hands the second member its share in a second round, possibly
    # after the first consumed everything: both must end up owning partitions.
    wait_until(lambda: one.assigned() and two.assigned(), 60, "both instances own partitions")
    assert compare(one, produced) == []
    assert compare(two, produced) == []


def test_sigterm_exits_cleanly_while_consuming(tmp_path, daemons) -> None:
    daemon = DaemonProcess(
        ["--metrics-addr", "127.0.0.1:0", "--sample-conversations", "3000", "--speedup", "50"],
        tmp_path / "embedded.log",
    )
    daemons.append(daemon)

    def consuming() -> bool:
        found = re.search(rb"^kvcast_events_total ([\d.]+)", daemon.raw("/metrics"), re.M)
        return found is not None and float(found.group(1)) > 0

    # Consuming by its own count (a fixed 1.5 s might end before the first event on a loaded
    # machine); the speedup leaves most of the 3,000 conversations still to come.
    wait_until(consuming, 60, "the daemon to consume")
    assert daemon.stop(signal.SIGTERM) == 0, daemon.log.read_text()
    assert os.path.exists(daemon.log)


def test_two_deployments_on_different_topics_never_share_a_group(
    daemons, tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_client, redis_namespace,
    produced,
) -> None:  # fmt: skip
    """With the default group ids (kvcast.NAMESPACE.TOPIC) a second deployment on another topic
    gets its partitions. Under one shared group id the group's leader assigns only the topics it
    subscribes to, and the other deployment got nothing (seen in a soak: it consumed 0 events)."""
    from kafka.admin import KafkaAdminClient, NewTopic

    other_topic, other_namespace = f"{kafka_topic}-other", f"{redis_namespace}-other"
    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    admin.create_topics([NewTopic(other_topic, 4, 1)])
    admin.close()
    other: Records = []
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=5)
    futures = [producer.send(other_topic, key=b"%d" % offset, value=value)
               for _, offset, value in produced]  # fmt: skip
    producer.flush()
    for future, (_, _, value) in zip(futures, produced, strict=True):
        metadata = future.get(timeout=10)
        other.append((metadata.partition, metadata.offset, value))
    producer.close()
    try:
        first = start(daemons, tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_namespace)
        second = start(daemons, tmp_path, kafka_bootstrap, other_topic, redis_url, other_namespace)
        wait_consumed(redis_client, redis_namespace, kafka_topic, produced, 4, 90)
        wait_consumed(redis_client, other_namespace, other_topic, other, 4, 90)
        assert compare(first, produced) == []
        assert compare(second, other) == []
    finally:
        for key in redis_client.scan_iter(match=f"{other_namespace}:*", count=1000):
            redis_client.delete(key)
