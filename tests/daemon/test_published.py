"""The status document and its one-line form, for the primary process and for a worker."""

from __future__ import annotations

import orjson

from kvcast.daemon.published import Published, format_status


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
