"""The real services the integration tests rely on answer, and a consumer group joins fast."""

from __future__ import annotations

import time

import pytest

from tests.services import FAST_GROUP_SETTINGS, unique_name

pytestmark = pytest.mark.integration


def test_redis_round_trips_a_key_in_the_test_namespace(redis_client, redis_namespace):
    key = f"{redis_namespace}:greeting"
    redis_client.set(key, b"hello", ex=60)
    assert redis_client.get(key) == b"hello"
    assert redis_client.ttl(key) > 0


def test_consumer_group_reads_all_keyed_messages_of_a_4_partition_topic(
    kafka_bootstrap, kafka_topic
):
    from kafka import KafkaConsumer, KafkaProducer

    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    sent = {f"k{i}".encode(): f"v{i}".encode() for i in range(100)}
    for key, value in sent.items():
        producer.send(kafka_topic, key=key, value=value)
    producer.flush()
    producer.close()

    started = time.monotonic()
    consumer = KafkaConsumer(
        kafka_topic,
        bootstrap_servers=kafka_bootstrap,
        group_id=unique_name("kvcast-test-group"),
        auto_offset_reset="earliest",
        **FAST_GROUP_SETTINGS,
    )
    received: dict[bytes, bytes] = {}
    partitions: set[int] = set()
    joined_after = None
    try:
        while len(received) < len(sent) and time.monotonic() - started < 20:
            for tp, records in consumer.poll(timeout_ms=200).items():
                partitions.add(tp.partition)
                received.update((r.key, r.value) for r in records)
            if joined_after is None and consumer.assignment():
                joined_after = time.monotonic() - started
    finally:
        consumer.close()

    assert received == sent
    assert partitions == {0, 1, 2, 3}  # 100 keys hash onto every partition
    assert joined_after is not None and joined_after < 10, f"group joined after {joined_after} s"
