"""The status document and its one-line form, for the primary process and for a worker."""

from __future__ import annotations

import itertools

import orjson

from kvcast.daemon.published import Published, format_status
from kvcast.stats.config import StatsConfig
from kvcast.stats.events import parse_event
from kvcast.stats.partition import PartitionDelta, PartitionEngine
from tests.support import VALID, forecast_doc


def _published(*, publishing: bool) -> Published:
    return Published(lambda: (True, "ok"), publishing=publishing)


def test_the_primary_reports_the_instance_counters_and_forecast() -> None:
    status = _published(publishing=True).status(events_per_s=1234.56)
    assert status["role"] == "primary"
    assert status["events_per_s"] == 1234.6
    assert status["processed"] == status["rejected"] == status["duplicates"] == 0
    assert status["hit_ratio"] is None  # nothing forecast yet
    orjson.dumps(status)  # --status-json prints it as it is
    line = format_status(status)
    assert line.startswith("kvcast | 1,235 events/s | processed 0 rejected 0 duplicates 0")
    assert "hit ratio - (single-class -, bound -, observed -)" in line
    assert line.endswith("| table v- | lag - | store not checked yet")


def test_a_worker_reports_only_its_own_rate_lag_and_store() -> None:
    status = _published(publishing=False).status(events_per_s=99.0)
    assert status == {
        "role": "worker",
        "events_per_s": 99.0,
        "lag": None,
        "store": "not checked yet",
    }
    assert format_status(status) == "kvcast worker | 99 events/s | lag - | store not checked yet"


def test_the_operations_document_keeps_a_point_every_30_s_of_the_last_hour() -> None:
    from kvcast.daemon.published import HISTORY_EVERY_S, HISTORY_POINTS

    published = _published(publishing=True)
    counters = {"processed": 10, "rejected": 3, "duplicates": 1,
                "rejected_by_reason": {"too_late": 2, "missing_field": 1}}  # fmt: skip
    for k in range(2 * HISTORY_POINTS * 6):  # a refresh every 5 s for two hours
        forecast = forecast_doc(computed_at=1_000.0 + 5 * k, hit_ratio=0.4)
        published.refreshed(forecast, None, counters, 0.01)
    published.status(events_per_s=250.04)
    doc = published.operations_document()
    history = doc["history"]
    assert len(history) == HISTORY_POINTS
    assert {b["at"] - a["at"] for a, b in itertools.pairwise(history)} == {HISTORY_EVERY_S}
    assert history[-1]["at"] >= 1_000.0 + 5 * (2 * HISTORY_POINTS * 6 - 1) - HISTORY_EVERY_S
    assert doc["events_per_s"] == 250.0
    assert doc["rejected_by_reason"] == {"too_late": 2, "missing_field": 1}
    assert doc["components"]["store"] == "ok" and doc["ready"] is True
    assert doc["forecast_age_s"] > 0
    orjson.dumps(doc)


def _delta(processed: int, duplicates: int, rejected: dict[str, int]) -> PartitionDelta:
    """A real partition delta with these counts (valid events, repeats, rejections)."""
    engine = PartitionEngine(StatsConfig(), "t:0")
    offset = 0
    for n in range(processed):
        event = parse_event(orjson.dumps({**VALID, "session_id": f"s{n}", "turn": 1}))
        engine.apply(event, "unknown", offset)
        offset += 1
    for _ in range(duplicates):
        event = parse_event(orjson.dumps({**VALID, "session_id": "s0", "turn": 1}))
        engine.apply(event, "unknown", offset)
        offset += 1
    for reason, count in rejected.items():
        for _ in range(count):
            engine.reject(reason, offset)
            offset += 1
    return engine.take_delta()


def test_counters_are_the_stores_plus_this_process_commits_since_the_refresh_read() -> None:
    """Between two refreshes, "processed" moves with each commit of this process; a commit
    made before the refresh had read the store is not added again."""
    published = _published(publishing=True)
    published.committed("t:0", _delta(5, 0, {}))  # stored before the refresh's read
    mark = published.own_commits()
    stored = {"processed": 5, "rejected": 1, "rejected_by_reason": {"too_late": 1},
              "duplicates": 0}  # fmt: skip
    published.refreshed(forecast_doc(), None, stored, 0.01, own_at_read=mark)
    assert published.status(0.0)["processed"] == 5
    published.committed("t:0", _delta(3, 2, {"invalid_json": 1}))  # after it
    status, counters = published.status(0.0), published.metrics_view().counters
    assert (status["processed"], status["duplicates"], status["rejected"]) == (8, 2, 2)
    assert counters["rejected_by_reason"] == {"invalid_json": 1, "too_late": 1}
    # the next refresh read all of it: the store's figures alone again
    stored = {"processed": 8, "rejected": 2, "rejected_by_reason": {"invalid_json": 1,
              "too_late": 1}, "duplicates": 2}  # fmt: skip
    published.refreshed(forecast_doc(), None, stored, 0.01, own_at_read=published.own_commits())
    assert published.metrics_view().counters == stored


def test_a_trickle_of_events_reads_with_a_decimal() -> None:
    published = _published(publishing=True)
    assert format_status(published.status(0.4)).startswith("kvcast | 0.4 events/s |")
    assert format_status(published.status(0.0)).startswith("kvcast | 0 events/s |")
    assert format_status(published.status(12.4)).startswith("kvcast | 12 events/s |")
