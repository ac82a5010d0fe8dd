"""The producer against a real broker, and its events through a real ``kvcast run``.

Chat traffic as an OpenAI-compatible client and server exchange it (bodies, no session ids)
goes through :class:`KafkaEventProducer` into a topic; the daemon consuming it publishes the
table of the offline reference, every conversation's turns recovered, and no user text sits
in Kafka. An unreachable broker costs the serving path nothing: ``record`` never raises.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from kvcast.lab.bench.soak import Records, compare, wait_consumed
from kvcast.producer import EventBuilder, KafkaEventProducer
from tests.support import start_daemon

pytestmark = pytest.mark.integration

SECRET = b"integration-test-secret-32-bytes"


def chat_traffic(producer: KafkaEventProducer, conversations: int) -> None:
    """Three turns per conversation, interleaved, 20 s apart; replies as a server sends them."""
    histories = {
        n: [{"role": "system", "content": "You help with orders."},
            {"role": "user", "content": f"user text {n}: where is order {n}?"}]
        for n in range(conversations)
    }  # fmt: skip
    start = time.time() - 3 * 3600
    for turn in range(3):
        for n, history in histories.items():
            reply = f"reply {turn} to {n}"
            body = {"model": "m", "messages": history}
            usage = {"prompt_tokens": 40 * (turn + 1), "completion_tokens": 9,
                     "prompt_tokens_details": {"cached_tokens": 30 * turn}}  # fmt: skip
            message = {"role": "assistant", "content": reply}
            response = {"id": f"chatcmpl-{n}-{turn}", "usage": usage,
                        "choices": [{"message": message}]}  # fmt: skip
            producer.record(body, response, arrival_s=start + n * 4.0 + turn * 20.0)
            history += [{"role": "assistant", "content": reply},
                        {"role": "user", "content": f"user text {n}: and now?"}]  # fmt: skip


def read_back(bootstrap: str, topic: str, partitions: int, count: int) -> Records:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        assigned = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(assigned)
        consumer.seek_to_beginning(*assigned)
        records: Records = []
        deadline = time.monotonic() + 30
        while len(records) < count and time.monotonic() < deadline:
            for tp, messages in consumer.poll(timeout_ms=500).items():
                records += [(tp.partition, m.offset, m.value) for m in messages]
        return records
    finally:
        consumer.close()


@pytest.mark.parametrize("kafka_topic", [2], indirect=True)
def test_chat_traffic_reaches_the_published_table_with_its_turns_recovered(
    tmp_path: Path, kafka_bootstrap: str, kafka_topic: str, redis_url: str, redis_client,
    redis_namespace: str,
) -> None:  # fmt: skip
    producer = KafkaEventProducer(kafka_bootstrap, kafka_topic, EventBuilder(SECRET))
    chat_traffic(producer, 300)
    producer.close()
    assert (producer.sent, producer.dropped) == (900, 0)
    records = read_back(kafka_bootstrap, kafka_topic, 2, 900)
    assert len(records) == 900
    turns = defaultdict(list)
    for _, _, payload in records:
        assert b"user text" not in payload and b"reply" not in payload
        event = json.loads(payload)
        turns[event["session_id"]].append(event["turn"])
    assert len(turns) == 300 and all(sorted(t) == [1, 2, 3] for t in turns.values())
    daemon = start_daemon(tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_namespace)
    try:
        wait_consumed(redis_client, redis_namespace, kafka_topic, records, 2)
        assert compare(daemon, records) == []
        assert daemon.get("/v1/table")["states"]
        assert daemon.stop() == 0
    finally:
        if daemon.process.poll() is None:
            daemon.stop()


def test_an_unreachable_broker_never_reaches_the_serving_path() -> None:
    producer = KafkaEventProducer("127.0.0.1:1", "nowhere", EventBuilder(SECRET),
                                  max_queued=5, max_block_ms=200, request_timeout_ms=300,
                                  api_version=(2, 5))  # fmt: skip
    started = time.monotonic()
    for n in range(50):
        producer.record({"messages": [{"role": "user", "content": str(n)}]}, {})
    producer.record("not a request", None)  # type: ignore[arg-type]
    assert time.monotonic() - started < 1.0  # the serving thread never waits on Kafka
    producer.close(timeout_s=5)
    assert producer.sent == 0 and producer.dropped >= 45
