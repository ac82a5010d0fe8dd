"""Dead letters that cannot stall the commits (issue 32, item 4), against the real tansu broker
and real Redis: a record the dead-letter producer cannot take whole is sent cut, with a header
saying so; a dead-letter outage holds back only the partitions whose letters wait."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kafka import KafkaProducer
from kafka.admin import NewTopic

from kvcast.exporters.dead_letter import TRUNCATED_BYTES
from kvcast.lab.bench.processes import free_port, wait_until
from kvcast.lab.bench.soak import compare, stored_offsets, wait_consumed, workload
from tests.daemon.test_dead_letter import dead_letters
from tests.support import produce, readiness, start_daemon

# Over the events' 1 MiB limit (rejected ``oversized``) and over the dead-letter producer's
# 1,048,576-byte request limit: before the fix its letter could never be sent.
BIG = b'{"session_id": "big", "turn": 0, "prompt": "' + b"x" * 1_200_000 + b'"}'


def send_to(bootstrap: str, topic: str, partition: int, lines: list[bytes]) -> list[int]:
    """Send ``lines`` to ``partition`` (requests up to 4 MiB); their acknowledged offsets."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, max_request_size=4 << 20)
    try:
        futures = [producer.send(topic, value=line, partition=partition) for line in lines]
        producer.flush()
        return [future.get(timeout=10).offset for future in futures]
    finally:
        producer.close()


@pytest.mark.parametrize("kafka_topic", [2], indirect=True)
def test_an_oversized_record_is_sent_cut_and_commits_go_on(
    tmp_path: Path, kafka_bootstrap: str, kafka_admin, kafka_topic: str, redis_url: str,
    redis_client, redis_namespace: str,
) -> None:  # fmt: skip
    """The 1.2 MB record arrives on the dead-letter topic as its first TRUNCATED_BYTES, with its
    kvcast.* headers and ``kvcast.truncated: 1200050``; every partition stores up to its end
    and /readyz is 200 (before: partition 0 never committed past it, /readyz 503)."""
    dead = kafka_topic + "-dead"
    kafka_admin.create_topics([NewTopic(dead, 1, 1)])
    records: list = []
    lines = workload(3000, 5)
    produce(kafka_bootstrap, kafka_topic, lines[:1500], records)
    (big_offset,) = send_to(kafka_bootstrap, kafka_topic, 0, [BIG])
    records.append((0, big_offset, BIG))
    produce(kafka_bootstrap, kafka_topic, lines[1500:], records)
    daemon = start_daemon(tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_namespace,
                          "--dead-letter-topic", dead)  # fmt: skip
    try:
        wait_consumed(redis_client, redis_namespace, kafka_topic, records, 2, timeout=15)
        assert compare(daemon, records) == []
        where = (f"{kafka_topic}:0", big_offset)
        letter = dead_letters(kafka_bootstrap, dead, 1)[where]
        assert letter["kvcast.truncated"] == str(len(BIG))
        assert letter["value"] == BIG[:TRUNCATED_BYTES]
        assert letter["kvcast.reason"] == "oversized"
        assert letter["key"] == f"{where[0]}:{where[1]}".encode()
        assert readiness(daemon)[0] == 200
        assert (
            'kvcast_events_rejected_total{reason="oversized"} 1' in daemon.raw("/metrics").decode()
        )
        assert daemon.stop() == 0
    finally:
        daemon.stop()
        kafka_admin.delete_topics([dead])


@pytest.mark.parametrize("kafka_topic", [2], indirect=True)
def test_a_dead_letter_outage_holds_back_only_its_partition(
    tmp_path: Path, kafka_bootstrap: str, kafka_topic: str, redis_url: str, redis_client,
    redis_namespace: str,
) -> None:  # fmt: skip
    """The dead-letter bootstrap is a loopback port nobody listens on (a broker that is down).
    A bad record on partition 0: once its letter has waited past the sink's 10 s, /readyz
    names the waiting partition, partition 0 stores nothing past the record, and events sent
    to partition 1 after that are still stored (before: every partition's commits stopped).
    Shutdown reports the held-back events (exit 1): their offsets were not stored."""
    good = workload(600, 6)
    before = send_to(kafka_bootstrap, kafka_topic, 0, [*good[:100], b"not json at all"])
    send_to(kafka_bootstrap, kafka_topic, 1, good[100:200])
    daemon = start_daemon(tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_namespace,
                          "--dead-letter-topic", f"kafka://127.0.0.1:{free_port()}/dead",
                          "--shutdown-timeout", "1")  # fmt: skip
    try:
        bad_offset = before[-1]

        def refused() -> bool:
            status, body = readiness(daemon)
            state = body.get("components", {}).get("dead_letter", "")
            return status == 503 and state.startswith("unavailable")

        wait_until(refused, 20, "/readyz to name the dead-letter topic")
        started = time.monotonic()
        later = send_to(kafka_bootstrap, kafka_topic, 1, good[200:600])
        wait_until(
            lambda: stored_offsets(redis_client, redis_namespace, kafka_topic, 2)[1] == later[-1],
            10, f"partition 1 to store up to {later[-1]} while partition 0 waits",
        )  # fmt: skip
        assert time.monotonic() - started < 10
        stored = stored_offsets(redis_client, redis_namespace, kafka_topic, 2)
        assert stored[0] < bad_offset, stored  # no commit past the unsent letter
        status, body = readiness(daemon)  # still waiting: nothing pretended it was delivered
        assert status == 503, body
        assert body["components"]["dead_letter"].endswith(f"waiting: {kafka_topic}:0"), body
        assert daemon.stop() == 1
        assert "consumed again at the next start: dead-letter topic" in daemon.text()
    finally:
        daemon.stop()
