"""`kvcast run` against a real Kafka-protocol broker and a real Redis.

The reference is computed offline from the same records: one StatsEngine per partition fed
in offset order (a partition is the unit of ordering), merged. The daemon's /v1/table and
/v1/forecast must equal it exactly: after an uninterrupted run, after kill -9 and a restart,
and with two instances in one consumer group.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis
from kafka import KafkaProducer

from kvcast.daemon.pipeline import offline_statistics
from kvcast.daemon.publisher import capacity_grid
from kvcast.stats.config import StatsConfig
from kvcast.stats.forecast import forecast_from_sample
from kvcast.stats.generator import generate, preset
from kvcast.stats.table import table_document

pytestmark = pytest.mark.integration

STATS = StatsConfig(completion_timeout_s=900, allowed_lateness_s=30)
FLAGS = ["--completion-timeout", "900", "--allowed-lateness", "30", "--capacity-blocks", "3000"]
Records = list[tuple[int, int, bytes]]  # (partition, offset, payload)


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


def reference(records: Records) -> tuple[dict, dict]:
    snapshot, _ = offline_statistics(records, STATS)
    forecast = forecast_from_sample(
        snapshot.sample, capacity_blocks=3000, capacities=capacity_grid(3000)
    ).to_dict()
    return table_document(snapshot, STATS, 0), forecast


class DaemonProcess:
    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        self.handle = log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "kvcast.daemon.cli", "run", *args],
            stdout=self.handle,
            stderr=subprocess.STDOUT,
        )
        self.url = self._wait_for_url()

    def _wait_for_url(self) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            match = re.search(rb"serving (http://[\d.:]+)", self.log.read_bytes())
            if match:
                return match.group(1).decode()
            assert self.process.poll() is None, self.log.read_text()
            time.sleep(0.1)
        raise AssertionError(f"daemon did not start:\n{self.log.read_text()}")

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=5) as response:
            return orjson.loads(response.read())

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        self.process.send_signal(sig)
        code = self.process.wait(timeout=timeout)
        self.handle.close()
        return code


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
        *FLAGS,
    ]  # fmt: skip
    daemon = DaemonProcess(args, tmp_path / f"daemon-{len(daemons)}.log")
    daemons.append(daemon)
    return daemon


def stored_offsets(client: redis.Redis, namespace: str, topic: str, partitions: int) -> list[int]:
    prefix = f"{namespace}:{{{namespace}}}:part:{topic}:"
    return [int(client.hget(f"{prefix}{p}", "offset") or -1) for p in range(partitions)]


def wait_consumed(client, namespace, topic, records: Records, timeout: float = 60) -> None:
    last = defaultdict(lambda: -1)
    for partition, offset, _ in records:
        last[partition] = max(last[partition], offset)
    want = [last[p] for p in range(4)]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stored_offsets(client, namespace, topic, 4) == want:
            return
        time.sleep(0.2)
    raise AssertionError(f"not consumed: {stored_offsets(client, namespace, topic, 4)} != {want}")


def assert_published_equals_reference(daemon: DaemonProcess, records: Records) -> None:
    table, forecast = reference(records)
    deadline = time.monotonic() + 20
    while True:
        try:
            published_table, published = daemon.get("/v1/table"), daemon.get("/v1/forecast")
        except urllib.error.HTTPError as exc:  # 503 until the first refresh after the data
            if exc.code != 503 or time.monotonic() > deadline:
                raise
            time.sleep(0.3)
            continue
        if published_table["states"] == table["states"] or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert published_table["states"] == table["states"]
    assert published_table["window_conversations"] == table["window_conversations"]
    for key in ("hit_ratio", "hit_ratio_single_class", "upper_bound", "lambda0", "A_R", "E_B"):
        assert published[key] == forecast[key], key
    assert published["curve"] == forecast["curve"]


def test_uninterrupted_run_publishes_the_offline_statistics(
    daemons, tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_client, redis_namespace,
    produced,
) -> None:  # fmt: skip
    daemon = start(daemons, tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_namespace)
    wait_consumed(redis_client, redis_namespace, kafka_topic, produced)
    assert_published_equals_reference(daemon, produced)
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
    wait_consumed(redis_client, redis_namespace, kafka_topic, produced)
    assert_published_equals_reference(second, produced)


def test_two_instances_in_one_group_equal_one(
    daemons, tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_client, redis_namespace,
    produced,
) -> None:  # fmt: skip
    one = start(daemons, tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_namespace)
    two = start(daemons, tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_namespace)
    wait_consumed(redis_client, redis_namespace, kafka_topic, produced, timeout=90)
    assert_published_equals_reference(one, produced)
    assert_published_equals_reference(two, produced)
    assert "assigned" in one.log.read_text() and "assigned" in two.log.read_text()


def test_sigterm_exits_cleanly_while_consuming(tmp_path, daemons) -> None:
    daemon = DaemonProcess(
        ["--metrics-addr", "127.0.0.1:0", "--sample-conversations", "3000", "--speedup", "50"],
        tmp_path / "embedded.log",
    )
    daemons.append(daemon)
    time.sleep(1.5)
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
        wait_consumed(redis_client, redis_namespace, kafka_topic, produced, timeout=90)
        wait_consumed(redis_client, other_namespace, other_topic, other, timeout=90)
        assert_published_equals_reference(first, produced)
        assert_published_equals_reference(second, other)
    finally:
        for key in redis_client.scan_iter(match=f"{other_namespace}:*", count=1000):
            redis_client.delete(key)
