"""The typed forecast and table documents serialise to exactly the JSON built as dicts before.

The reference is the old refresh's construction, written out here: ``Forecast.to_dict()`` with
the refresh's keys appended, the shadow document with its error, and ``table_document`` as
``kvcast.stats.table`` builds it. A renamed or added key on either side fails here.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import orjson
import pytest

from kvcast.stats.config import StatsConfig
from kvcast.stats.documents import DocumentError, ForecastDocument, ShadowCurve, TableDocument
from kvcast.stats.engine import StatsEngine
from kvcast.stats.events import parse_event
from kvcast.stats.forecast import forecast_from_sample
from kvcast.stats.snapshot import Snapshot
from kvcast.stats.table import table_document
from kvcast.stats.tiers import Tier
from tests.support import shared_prefix_events

CONFIG = StatsConfig()
CAPACITY = 2_000
TARGETS = (0.3, 0.6, 0.99)
COMMON: dict[str, Any] = {
    "capacity_blocks": CAPACITY,
    "block_size": CONFIG.block_size,
    "instances": 2,
    "kv_bytes_per_token": 1024,
}
SHADOW = {
    "hit_ratio": 0.21,
    "capacity_blocks": 2_000.0,
    "curve": [
        {"capacity_blocks": 1_000.0, "hit_ratio": 0.12},
        {"capacity_blocks": 2_000.0, "hit_ratio": 0.21},
        {"capacity_blocks": 4_000.0, "hit_ratio": None},
    ],
    "sampling_ratio": 0.05,
    "session_share": 1.0,
    "kept_accesses": 4_321,
    "window_start": 12.5,
    "events": 999,
    "cached_blocks": 77,
    "effectively_once": False,
}


@pytest.fixture(scope="module")
def snapshot() -> Snapshot:
    """A window of two intents whose conversations share prefixes."""
    engine = StatsEngine(CONFIG)
    for raw in shared_prefix_events(300, seed=3, block_size=CONFIG.block_size):
        event = parse_event(raw)
        engine.apply(event, "coding" if int(raw["session_id"][1:]) % 2 else "chitchat")
    engine.finish()
    return engine.snapshot()


def old_forecast_dict(snapshot: Snapshot, computed_at: float) -> dict[str, Any]:
    """The forecast as the refresh built it before the typed documents (a dict, keys added)."""
    forecast = forecast_from_sample(
        snapshot.sample,
        capacities=[CAPACITY / 2, CAPACITY, CAPACITY * 2],
        tiers=(Tier("host", 4_000),),
        **COMMON,
    ).to_dict()
    forecast["required_capacity_by_target"] = [
        forecast_from_sample(snapshot.sample, target=t, **COMMON).to_dict()["required_capacity"]
        for t in TARGETS
    ]
    forecast["event_time"] = snapshot.generated_at
    forecast["window_conversations"] = snapshot.window_conversations
    forecast["computed_at"] = computed_at
    return forecast


def new_forecast(snapshot: Snapshot, computed_at: float) -> ForecastDocument:
    return ForecastDocument(
        forecast=forecast_from_sample(
            snapshot.sample,
            capacities=[CAPACITY / 2, CAPACITY, CAPACITY * 2],
            tiers=(Tier("host", 4_000),),
            **COMMON,
        ),
        required_capacity_by_target=tuple(
            forecast_from_sample(snapshot.sample, target=t, **COMMON).required_capacity
            for t in TARGETS
        ),
        event_time=snapshot.generated_at,
        window_conversations=snapshot.window_conversations,
        computed_at=computed_at,
    )


def test_the_forecast_document_is_the_old_dict_byte_for_byte(snapshot: Snapshot) -> None:
    old = old_forecast_dict(snapshot, computed_at=1_700_000_000.25)
    new = new_forecast(snapshot, computed_at=1_700_000_000.25).to_dict()
    assert old["status"] == "ok" and old["tiers"] and old["by_intent"]  # a populated forecast
    assert list(new) == list(old)  # the same keys in the same order
    assert orjson.dumps(new) == orjson.dumps(old)


def test_the_shadow_sits_last_with_the_forecasts_error(snapshot: Snapshot) -> None:
    """As ``{**forecast, "shadow": {**shadow, "forecast_error": ...}}`` was."""
    doc = new_forecast(snapshot, 5.0).with_shadow(ShadowCurve.from_dict(SHADOW))
    old = old_forecast_dict(snapshot, 5.0)
    error = old["hit_ratio"] - SHADOW["hit_ratio"]
    expected = {**old, "shadow": {**SHADOW, "forecast_error": error}}
    assert orjson.dumps(doc.to_dict()) == orjson.dumps(expected)
    assert "shadow" not in new_forecast(snapshot, 5.0).to_dict()


def test_non_finite_values_serialise_as_null() -> None:
    nothing_seen = StatsEngine(CONFIG).snapshot().sample
    model = forecast_from_sample(nothing_seen, capacities=[CAPACITY], **COMMON)
    assert model.status == "no_data"
    model = replace(model, characteristic_time_s=math.inf, hit_ratio=math.nan)
    doc = ForecastDocument(model, (None,), None, 0, 1.0).to_dict()
    assert doc["characteristic_time_s"] is None and doc["hit_ratio"] is None
    assert doc["required_capacity_by_target"] == [None] and doc["event_time"] is None
    orjson.dumps(doc)


def test_the_table_document_is_the_old_dict_byte_for_byte(snapshot: Snapshot) -> None:
    old = table_document(snapshot, CONFIG, 7, characteristic_time_s=123.456, instances=2)
    assert old["states"] and old["shared"] is not None  # every part populated
    table = TableDocument.from_dict(old)
    assert table.states[0].intent == old["states"][0]["intent"]
    assert list(table.to_dict()) == list(old)
    assert orjson.dumps(table.to_dict()) == orjson.dumps(old)
    assert orjson.dumps(table.with_version(8).to_dict()) == orjson.dumps({**old, "version": 8})


def test_a_table_without_shared_blocks_keeps_shared_null(snapshot: Snapshot) -> None:
    old = table_document(replace(snapshot, shared=None), CONFIG, 1)
    assert old["shared"] is None
    assert orjson.dumps(TableDocument.from_dict(old).to_dict()) == orjson.dumps(old)


@pytest.mark.parametrize(
    ("where", "edit"),
    [
        ("table document", lambda d: d.pop("max_turn")),
        ("table document", lambda d: d.update(policy="iac")),
        ("table defaults", lambda d: d["defaults"].pop("median_reuse_s")),
        ("table state", lambda d: d["states"][0].update(p=d["states"][0].pop("p_continue"))),
        ("table shared", lambda d: d["shared"].update(extra=1)),
    ],
)
def test_a_table_dict_with_a_renamed_missing_or_added_key_is_refused(
    snapshot: Snapshot, where: str, edit: Any
) -> None:
    doc = orjson.loads(orjson.dumps(table_document(snapshot, CONFIG, 1)))
    edit(doc)
    with pytest.raises(DocumentError, match=where):
        TableDocument.from_dict(doc)


def test_only_version_and_time_stamp_leave_the_content_unchanged(snapshot: Snapshot) -> None:
    table = TableDocument.from_dict(table_document(snapshot, CONFIG, 1))
    assert table.content_differs(None)
    assert not replace(table, version=9, generated_at=1.0).content_differs(table)
    assert replace(table, max_turn=table.max_turn + 1).content_differs(table)
    assert replace(table, states=table.states[1:]).content_differs(table)
