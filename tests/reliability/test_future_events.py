"""An event from the future is rejected as ``future``; it cannot empty the table.

Against a real broker, Redis and ``kvcast run``: a workload in real (epoch) time on two
partitions, with one event whose timestamp is in milliseconds where seconds are expected
(x1000) in the middle. Before, that event was accepted: it anchored the window ~50,000 years
ahead, the next table had 0 states and replaced the good one in Redis. Now it is rejected
with the reason ``future`` (more than ``--max-future-skew`` ahead of its partition's newest
event and of the clock), counted, and the published table equals the offline reference.
"""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from kvcast.lab.bench.soak import Records, compare, wait_consumed, workload
from tests.reliability.tally import TALLY
from tests.support import produce, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def in_real_time(lines: list[bytes]) -> list[bytes]:
    """The workload moved so that its newest event is a minute old (epoch seconds)."""
    events = [orjson.loads(line) for line in lines]
    shift = time.time() - 60.0 - max(event["timestamp"] for event in events)
    for event in events:
        event["timestamp"] += shift
    return [orjson.dumps(event) for event in events]


@pytest.mark.parametrize("kafka_topic", [2], indirect=True)
def test_an_event_in_milliseconds_is_future_and_the_table_keeps_its_states(
    tmp_path: Path,
    kafka_bootstrap: str,
    kafka_topic: str,
    redis_url: str,
    redis_client,
    redis_namespace: str,
) -> None:
    lines = in_real_time(workload(1600, seed=23))
    middle = orjson.loads(lines[800])
    in_milliseconds = orjson.dumps(
        {**middle, "session_id": "clock-in-ms", "request_id": "clock-in-ms",
         "timestamp": middle["timestamp"] * 1000.0}
    )  # fmt: skip
    records: Records = []
    produce(kafka_bootstrap, kafka_topic, [*lines[:800], in_milliseconds, *lines[800:]], records)
    daemon = start_daemon(tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_namespace)
    try:
        wait_consumed(redis_client, redis_namespace, kafka_topic, records, 2)
        assert compare(daemon, records) == []
        metrics = daemon.raw("/metrics").decode()
        assert 'kvcast_events_rejected_total{reason="future"} 1.0' in metrics
        assert 'reason="too_late"' not in metrics  # nothing after it was pushed out
        assert daemon.get("/v1/table")["states"], "the table must keep its states"
        TALLY.add(hostile_inputs=1, events_compared=len(records))
        assert daemon.stop() == 0
    finally:
        if daemon.process.poll() is None:
            daemon.stop()
