"""``--dead-letter-topic``: every rejected record, as it arrived, with where and why; a
partition's commit waits until its dead letters are acknowledged (real broker, real Redis)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import NewTopic

from kvcast.lab.bench.processes import wait_until
from kvcast.lab.bench.soak import compare, stored_offsets, wait_consumed, workload
from tests import services
from tests.support import produce, readiness, start_daemon

# Rejected for a field, for the payload as a whole, and 300 in a row (more than one poll's
# worth of the log's first-100 rejections: the dead letters need every one).
HOSTILE = (
    [b'{"session_id": "x", "turn": 0, "timestamp": 1.0, "input_tokens": 1, "output_tokens": 1}',
     b"not json at all", b'{"session_id": "y"}', b"\xff\xfe"]
    + [b'{"session_id": "z%d", "turn": -%d}' % (n, n) for n in range(300)]
)  # fmt: skip


def dead_letters(bootstrap: str, topic: str, count: int) -> dict[tuple[str, int], dict]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    found: dict[tuple[str, int], dict] = {}
    try:
        assigned = [TopicPartition(topic, 0)]
        consumer.assign(assigned)
        consumer.seek_to_beginning(*assigned)
        deadline = time.monotonic() + 30
        while len(found) < count and time.monotonic() < deadline:
            for messages in consumer.poll(timeout_ms=500).values():
                for message in messages:
                    headers = {k: v.decode() for k, v in message.headers}
                    where = (headers["kvcast.partition"], int(headers["kvcast.offset"]))
                    found[where] = {"value": message.value, "key": message.key, **headers}
        return found
    finally:
        consumer.close()


def mixed(seed: int) -> list[bytes]:
    lines = workload(3000, seed)  # enough event time for completed conversations
    return lines[:1500] + HOSTILE + lines[1500:]


@pytest.mark.parametrize("kafka_topic", [2], indirect=True)
def test_every_rejected_record_reaches_the_dead_letter_topic(
    tmp_path: Path, kafka_bootstrap: str, kafka_admin, kafka_topic: str, redis_url: str,
    redis_client, redis_namespace: str,
) -> None:  # fmt: skip
    dead = kafka_topic + "-dead"
    kafka_admin.create_topics([NewTopic(dead, 1, 1)])
    records: list = []
    produce(kafka_bootstrap, kafka_topic, mixed(3), records)
    daemon = start_daemon(tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_namespace,
                          "--dead-letter-topic", dead)  # fmt: skip
    try:
        wait_consumed(redis_client, redis_namespace, kafka_topic, records, 2)
        assert compare(daemon, records) == []  # the statistics are those of the reference
        hostile = {(f"{kafka_topic}:{p}", o): line for p, o, line in records if line in HOSTILE}
        found = dead_letters(kafka_bootstrap, dead, len(hostile))
        assert set(found) == set(hostile)
        for where, letter in found.items():
            assert letter["value"] == hostile[where]
            assert letter["key"] == f"{where[0]}:{where[1]}".encode()
        reasons = {letter["kvcast.reason"] for letter in found.values()}
        assert {"invalid_json", "missing_field", "out_of_range"} <= reasons, reasons
        by_value = {letter["value"]: letter for letter in found.values()}
        assert by_value[b'{"session_id": "y"}']["kvcast.field"] != ""
        assert by_value[b"not json at all"]["kvcast.field"] == ""
        assert daemon.stop() == 0
    finally:
        daemon.stop()
        kafka_admin.delete_topics([dead])


@pytest.mark.parametrize("kafka_topic", [2], indirect=True)
def test_commits_wait_for_an_unreachable_dead_letter_topic_then_lose_nothing(
    tmp_path: Path, kafka_bootstrap: str, kafka_topic: str, redis_url: str, redis_client,
    redis_namespace: str, own_broker,
) -> None:  # fmt: skip
    address, broker = own_broker
    admin = KafkaAdminClient(bootstrap_servers=address, **services.FAST_CLIENT_SETTINGS)
    admin.create_topics([NewTopic("dead", 1, 1)])
    admin.close()
    records: list = []
    produce(kafka_bootstrap, kafka_topic, mixed(4), records)
    broker.send_signal(signal.SIGSTOP)  # the dead-letter broker stops answering
    daemon = start_daemon(tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_namespace,
                          "--dead-letter-topic", f"kafka://{address}/dead")  # fmt: skip
    try:
        first_hostile: dict[int, int] = {}
        for partition, offset, line in records:
            if line in HOSTILE:
                first_hostile[partition] = min(first_hostile.get(partition, offset), offset)

        def refused() -> bool:
            status, body = readiness(daemon)
            state = body.get("components", {}).get("dead_letter", "")
            return status == 503 and state.startswith("unavailable")

        wait_until(refused, 60, "/readyz to name the dead-letter topic")
        time.sleep(3)
        stored = stored_offsets(redis_client, redis_namespace, kafka_topic, 2)
        for partition, offset in first_hostile.items():  # no commit past an unsent letter
            assert stored[partition] < offset, (partition, stored, first_hostile)
        broker.send_signal(signal.SIGCONT)
        wait_consumed(redis_client, redis_namespace, kafka_topic, records, 2, timeout=90)
        assert compare(daemon, records) == []
        hostile = {(f"{kafka_topic}:{p}", o) for p, o, line in records if line in HOSTILE}
        assert set(dead_letters(address, "dead", len(hostile))) == hostile
        wait_until(lambda: readiness(daemon)[0] == 200, 30, "/readyz 200 again")
        assert daemon.stop() == 0
    finally:
        broker.send_signal(signal.SIGCONT)
        daemon.stop()
