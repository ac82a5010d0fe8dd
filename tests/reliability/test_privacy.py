"""No user text (``prompt``, ``messages``) reaches Redis, Kafka, logs, metrics or HTTP.

The daemon (Kafka + Redis, the classifier ``auto`` so the packaged model reads the texts when
installed, debug logging) consumes events whose prompts and messages are full of distinctive
strings (``SECRET-<hex>``), some of them in rejected events too. Then every Redis key and value
in the namespace, the daemon's stdout and stderr, /metrics, /v1/table, /v1/forecast,
/v1/status, /readyz, /healthz and the status page are scanned for them. kvcast writes nothing
to Kafka: the broker (our own) has no topic but the input one afterwards, and the input's end
offsets did not move.
"""

from __future__ import annotations

import random
import signal
import time
import uuid

import orjson
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from kvcast.lab.bench.processes import DaemonProcess, wait_until
from kvcast.lab.bench.soak import Records, wait_consumed, workload
from tests.reliability.tally import TALLY

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def redis_dump(client, namespace: str) -> list[bytes]:
    """Every key of the namespace and everything stored under it, as bytes."""
    out: list[bytes] = []
    for key in client.scan_iter(match=f"{namespace}*", count=500):
        out.append(key)
        kind = client.type(key).decode()
        if kind == "string":
            out.append(client.get(key) or b"")
        elif kind == "hash":
            for field, value in client.hgetall(key).items():
                out += [field, value]
        elif kind == "list":
            out += client.lrange(key, 0, -1)
        elif kind == "set":
            out += list(client.smembers(key))
        elif kind == "zset":
            out += [member for member, _ in client.zrange(key, 0, -1, withscores=True)]
        elif kind == "stream":
            out += [orjson.dumps(str(entry)) for entry in client.xrange(key)]
        else:
            out.append(f"unknown type {kind}".encode())
    return out


def test_no_user_text_reaches_redis_logs_metrics_http_or_kafka(
    tmp_path, own_broker, redis_url, redis_client, redis_namespace
) -> None:
    address, _ = own_broker
    topic = "requests"
    admin = KafkaAdminClient(bootstrap_servers=address)
    admin.create_topics([NewTopic(topic, 2, 1)])
    rng = random.Random(5)
    secrets: list[str] = []

    def secret() -> str:
        secrets.append(f"SECRET-{uuid.UUID(int=rng.getrandbits(128)).hex}")
        return secrets[-1]

    lines: list[bytes] = []
    for n, line in enumerate(workload(1500, seed=6)):
        event = orjson.loads(line)
        if n % 3:
            event.pop("intent", None)  # these go to the classifier
        event["prompt"] = f"please help with {secret()} and {secret()}"
        event["messages"] = [
            {"role": "system", "content": secret()},
            {"role": "user", "content": f"earlier {secret()}"},
            {"role": "assistant", "content": secret()},
            {"role": "user", "content": event["prompt"]},
        ]
        lines.append(orjson.dumps(event))
    lines += [  # rejected events carrying text: the rejection detail must not echo it
        orjson.dumps({"session_id": "x", "turn": secret(), "timestamp": 1.0}),
        orjson.dumps({"session_id": 5, "prompt": secret()}),
        orjson.dumps({**orjson.loads(lines[0]), "prompt": [secret()]}),
        orjson.dumps({**orjson.loads(lines[0]), "messages": [{"role": secret()}]}),
        f'{{"prompt": "{secret()}", broken'.encode(),
    ]
    producer = KafkaProducer(bootstrap_servers=address, linger_ms=5)
    futures = [(producer.send(topic, key=str(n % 7).encode(), value=line), line)
               for n, line in enumerate(lines)]  # fmt: skip
    producer.flush()
    records: Records = []
    for future, line in futures:
        metadata = future.get(timeout=10)
        records.append((metadata.partition, metadata.offset, line))
    producer.close()

    daemon = DaemonProcess(
        ["--source", f"kafka://{address}/{topic}", "--store", redis_url,
         "--namespace", redis_namespace, "--metrics-addr", "127.0.0.1:0",
         "--commit-interval", "0.2", "--refresh-interval", "0.3", "--table-interval", "0.1",
         "--status-interval", "0.5", "--classifier", "auto", "--classifier-budget", "1",
         "--log-level", "debug", "--completion-timeout", "900", "--allowed-lateness", "30"],
        tmp_path / "daemon.log", start_timeout=120,
    )  # fmt: skip
    try:
        wait_consumed(redis_client, redis_namespace, topic, records, 2, timeout=120)
        wait_until(lambda: _published(daemon), 30, "a published table and forecast")
        time.sleep(1.0)  # a few more status lines and refreshes
        pages = [
            daemon.raw(path)
            for path in (
                "/metrics",
                "/v1/table",
                "/v1/forecast",
                "/v1/status",
                "/healthz",
                "/",
                "/v1/table?pretty",
            )
        ]
        pages.append(_readyz(daemon))
        assert daemon.stop(signal.SIGTERM, timeout=30) == 0
    finally:
        if daemon.process.poll() is None:
            daemon.stop(signal.SIGKILL)
    stored = redis_dump(redis_client, redis_namespace)
    assert len(stored) > 10
    log = daemon.log.read_bytes()
    assert b"serving http" in log
    haystacks = {"redis": b"\n".join(stored), "log": log, "http": b"\n".join(pages)}
    leaks = [(where, s) for where, text in haystacks.items() for s in secrets
             if s.encode() in text]  # fmt: skip
    assert b"SECRET" not in b"".join(haystacks.values())
    topics = set(admin.list_topics())
    admin.close()
    consumer = KafkaConsumer(bootstrap_servers=address, auto_offset_reset="earliest",
                             consumer_timeout_ms=3000)  # fmt: skip
    consumer.assign([TopicPartition(topic, p) for p in range(2)])
    in_topic = sorted((m.partition, m.offset) for m in consumer)
    consumer.close()
    TALLY.add(hostile_inputs=len(secrets), events_compared=len(records), differences=len(leaks))
    assert leaks == []
    assert topics - {"__consumer_offsets"} == {topic}
    assert in_topic == sorted((p, o) for p, o, _ in records)  # nothing written to the input


def _published(daemon: DaemonProcess) -> bool:
    try:
        daemon.get("/v1/table")
        daemon.get("/v1/forecast")
        return True
    except Exception:
        return False


def _readyz(daemon: DaemonProcess) -> bytes:
    import urllib.error

    try:
        return daemon.raw("/readyz")
    except urllib.error.HTTPError as error:
        return error.read()
