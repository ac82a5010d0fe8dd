"""The compose stack's demo producer writes a generated workload to Kafka, keyed by session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.deploy.tools import DEPLOY
from tests.services import FAST_CLIENT_SETTINGS


@pytest.mark.integration
def test_demo_producer_sends_the_workload(kafka_bootstrap: str, kafka_topic: str) -> None:
    from kafka import KafkaConsumer

    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    args = ["--bootstrap", kafka_bootstrap, "--topic", kafka_topic]
    args += ["--lambda", "1", "--duration", "30", "--speedup", "5000"]
    producer = DEPLOY / "compose" / "demo_producer.py"
    done = subprocess.run(
        [sys.executable, str(producer), *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    sent = int(done.stdout.split("done, ")[1].split()[0])
    assert sent > 0

    consumer = KafkaConsumer(
        kafka_topic,
        bootstrap_servers=kafka_bootstrap,
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
        **FAST_CLIENT_SETTINGS,
    )
    try:
        records = list(consumer)
    finally:
        consumer.close()
    assert len(records) == sent
    for record in records:
        event = orjson.loads(record.value)
        assert record.key == event["session_id"].encode()
        assert {"turn", "timestamp", "input_tokens", "cached_tokens"} <= set(event)
