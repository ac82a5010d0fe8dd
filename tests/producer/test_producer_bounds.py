"""The producer bounded by bytes and honest at close (issue 32 item 3), against the real broker
and against a broker that is down (an unused loopback port: nothing listens there)."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from kvcast.producer import EventBuilder, KafkaEventProducer
from tests.producer.test_kafka_producer import read_back

SECRET = b"integration-test-secret-32-bytes"


def unused_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def served(producer: KafkaEventProducer, count: int, text: str = "") -> None:
    for n in range(count):
        body = {"model": "m", "messages": [{"role": "user", "content": f"q {n} {text}"}]}
        answer = {"id": f"chatcmpl-{n}", "usage": {"prompt_tokens": 10, "completion_tokens": 2},
                  "choices": [{"message": {"role": "assistant", "content": "ok"}}]}  # fmt: skip
        producer.record(body, answer)


def wait_for(condition, what: str, deadline_s: float = 10.0) -> None:
    """Wait (bounded) until ``condition()`` holds."""
    end = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def stuck_producer(**options) -> KafkaEventProducer:
    """A producer whose sender thread is stuck in kafka-python's send (no broker answers, and
    send waits up to a minute for the topic's metadata)."""
    return KafkaEventProducer(f"127.0.0.1:{unused_port()}", "nowhere",
                              EventBuilder(SECRET, include_text=True), api_version=(2, 5),
                              max_block_ms=60_000, **options)  # fmt: skip


@pytest.mark.parametrize("kafka_topic", [1], indirect=True)
def test_300_requests_reach_the_real_broker_and_close_reports_them(
    kafka_bootstrap: str, kafka_topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    producer = KafkaEventProducer(kafka_bootstrap, kafka_topic, EventBuilder(SECRET))
    served(producer, 300)
    with caplog.at_level(logging.INFO, logger="kvcast.producer.kafka"):
        report = producer.close(timeout_s=15)
    assert (report["recorded"], report["sent"], report["dropped"]) == (300, 300, 0)
    assert "300 recorded, 300 sent, 0 dropped" in caplog.text
    assert len(read_back(kafka_bootstrap, kafka_topic, 1, 300)) == 300


def test_broker_down_close_counts_every_queued_event_and_record_never_waits(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: "0 events sent, 0 dropped" after 300 served requests."""
    producer = stuck_producer()
    served(producer, 1)
    wait_for(lambda: producer.stats()["in_flight"] == 1, "the sender to be stuck in send")
    served(producer, 299)  # returns although the sender cannot take a single event
    stats = producer.stats()
    assert (stats["in_flight"], stats["queued"], stats["sent"]) == (1, 299, 0)
    with caplog.at_level(logging.WARNING, logger="kvcast.producer.kafka"):
        report = producer.close(timeout_s=0.5)
    assert report["recorded"] == 300 and report["sent"] + report["dropped"] == 300
    assert report["dropped_by_reason"]["closed_unsent"] == 300
    assert "300 recorded, 0 sent, 300 dropped (closed_unsent 300)" in caplog.text
    served(producer, 2)  # after close: the numbers stay as reported
    assert producer.stats() == report


def test_the_queue_is_bounded_by_bytes_and_by_count() -> None:
    producer = stuck_producer(max_buffer_bytes=20_000, max_queued=1_000)
    served(producer, 1)
    wait_for(lambda: producer.stats()["in_flight"] == 1, "the sender to be stuck in send")
    served(producer, 100, text="x" * 1_000)  # about 1.1 KB each: 18 fit in 20,000 bytes
    stats = producer.stats()
    assert 0 < stats["queued_bytes"] <= 20_000 and stats["queued"] < 20
    assert stats["dropped_by_reason"]["queue_full_bytes"] == 100 - stats["queued"]
    counted = stuck_producer(max_queued=5)
    served(counted, 1)
    wait_for(lambda: counted.stats()["in_flight"] == 1, "the sender to be stuck in send")
    served(counted, 20)
    assert counted.stats()["dropped_by_reason"]["queue_full_count"] == 15
    for each in (producer, counted):
        report = each.close(timeout_s=0.2)
        assert report["sent"] + report["dropped"] == report["recorded"]


def test_a_bad_request_and_an_oversized_event_are_counted_by_reason() -> None:
    producer = stuck_producer(max_request_size=5_000)
    producer.record("not a request", None)  # type: ignore[arg-type]
    served(producer, 1, text="y" * 10_000)
    report = producer.close(timeout_s=0.2)
    assert report["dropped_by_reason"]["build_error"] == 1
    assert report["dropped_by_reason"]["oversized"] == 1
    assert report["recorded"] == report["dropped"] == 2


class HeldBuilder(EventBuilder):
    """A builder that holds its first build until released: a request the serving path handed
    over (recorded) whose event is still being built when the producer is closed."""

    def __init__(self, secret: bytes) -> None:
        super().__init__(secret)
        self.building = threading.Event()
        self.release = threading.Event()

    def build(self, *args, **kwargs):
        self.building.set()
        assert self.release.wait(10)
        return super().build(*args, **kwargs)


@pytest.mark.parametrize("kafka_topic", [1], indirect=True)
def test_an_event_recorded_before_close_is_sent_not_dropped_after_close(
    kafka_bootstrap: str, kafka_topic: str
) -> None:
    """Before: "1 recorded, 0 sent, 1 dropped (after_close 1)" when close came mid-build."""
    builder = HeldBuilder(SECRET)
    producer = KafkaEventProducer(kafka_bootstrap, kafka_topic, builder)
    recording = threading.Thread(target=served, args=(producer, 1))
    recording.start()
    assert builder.building.wait(10)
    closing = threading.Thread(target=producer.close, kwargs={"timeout_s": 15})
    closing.start()
    wait_for(lambda: producer._closed, "close to begin")  # the race: close while building
    builder.release.set()
    recording.join(10)
    closing.join(20)
    report = producer.stats()
    assert (report["recorded"], report["sent"], report["dropped"]) == (1, 1, 0), report
    assert len(read_back(kafka_bootstrap, kafka_topic, 1, 1)) == 1
