"""The pipeline: raw payloads in, counted outcomes and labelled events out."""

from __future__ import annotations

import orjson

from kvcast.stats.config import StatsConfig
from kvcast.stats.replay import Pipeline


def event(**fields: object) -> bytes:
    base = {"session_id": "s", "turn": 1, "timestamp": 10.0, "input_tokens": 40, "output_tokens": 2}
    return orjson.dumps({**base, **fields})


def test_rejections_are_counted_by_reason_and_never_raise() -> None:
    pipeline = Pipeline(StatsConfig())
    assert pipeline.offer(event()) is True
    assert pipeline.offer(b"\x00garbage") is False
    assert pipeline.offer(event(turn=-1)) is False
    assert pipeline.offer(event(cached_tokens=41)) is False
    assert pipeline.offer(event()) is True  # a duplicate is valid, counted apart
    counters = pipeline.engine.counters
    assert counters.processed == 1 and counters.duplicates == 1
    assert dict(counters.rejected) == {
        "invalid_json": 1,
        "out_of_range": 1,
        "cached_exceeds_input": 1,
    }
    assert pipeline.last_rejection is not None
    assert "cached_tokens" in pipeline.last_rejection.detail
