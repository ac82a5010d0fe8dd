"""A record the dead-letter topic cannot take whole is sent cut, with ``kvcast.truncated``,
so its partition's commit goes on (real tansu broker, the daemon's own sink)."""

from __future__ import annotations

import time

from kafka.admin import NewTopic

from kvcast.exporters.dead_letter import TRUNCATED_BYTES, DeadLetterSink
from tests.daemon.test_dead_letter import dead_letters
from tests.services import unique_name


def test_a_letter_over_1_mib_is_delivered_cut_and_confirmed(
    kafka_bootstrap: str, kafka_admin
) -> None:
    """Before the cut, the producer refused the 1.2 MB letter for ever and ``confirm``
    raised DeadLetterUnavailable: its partition never committed again."""
    dead = unique_name("dead")
    kafka_admin.create_topics([NewTopic(dead, 1, 1)])
    sink = DeadLetterSink(kafka_bootstrap, dead, timeout_s=10.0)
    value = b'{"prompt": "' + b"x" * 1_200_000 + b'"}'
    try:
        sink.send("events:0", 7, value, "oversized", None)
        deadline = time.monotonic() + 15
        while not sink.confirm("events:0", 7):
            assert time.monotonic() < deadline, "the cut letter was never acknowledged"
            time.sleep(0.05)
    finally:
        sink.close()
    found = dead_letters(kafka_bootstrap, dead, 1)
    letter = found[("events:0", 7)]
    assert letter["kvcast.truncated"] == str(len(value))
    assert letter["kvcast.reason"] == "oversized"
    assert letter["value"] == value[:TRUNCATED_BYTES]
