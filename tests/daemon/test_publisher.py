"""The refresher: what it publishes to the store, and what it refuses to publish."""

from __future__ import annotations

import logging

import orjson
import pytest

from kvcast.daemon.publisher import Publisher
from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.stores.memory import MemoryStore
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from kvcast.stats.config import StatsConfig
from kvcast.stats.ingest import ingest
from kvcast.stats.labeller import IntentLabeller
from kvcast.stats.partition import PartitionEngine

STATS = StatsConfig(completion_timeout_s=600, allowed_lateness_s=30)
SETTINGS = DaemonSettings(stats=STATS, table_interval_s=0.001)


def test_an_event_time_jump_never_replaces_the_table_by_an_empty_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One event ten days ahead (seconds sent as milliseconds, say) anchors the window where no
    completed conversation is: the refresher keeps the last table, and says why, once."""
    trace = generate(preset("mixed"), lambda0=1.0, conversations=300, seed=4, prompts=False)
    lines = [line.rstrip(b"\n") for line in trace.jsonl_lines()]
    store = MemoryStore()
    engine = PartitionEngine(STATS, "p:0")
    labeller = IntentLabeller()
    ingest(((engine, n, line) for n, line in enumerate(lines)), labeller)
    store.commit(engine.take_delta())
    publisher = Publisher(SETTINGS, store, lambda: (True, "ok"))
    publisher.refresh_once()
    table = store.read_table()
    assert table is not None and table["version"] == 1 and table["states"]

    newest = max(orjson.loads(line)["timestamp"] for line in lines)
    jump = orjson.dumps({"session_id": "clock", "turn": 1, "timestamp": newest + 10 * 86_400,
                         "input_tokens": 64, "output_tokens": 4})  # fmt: skip
    ingest([(engine, len(lines), jump)], labeller)
    store.commit(engine.take_delta())
    with caplog.at_level(logging.WARNING, logger="kvcast.daemon.publisher"):
        for _ in range(3):
            publisher.refresh_once()
    assert store.read_table() == table  # the last good table stays, in Redis and over HTTP
    assert publisher.published.table_document() == table
    forecast = publisher.published.forecast_document()
    assert forecast is not None and forecast["window_conversations"] == 0
    said = [r.getMessage() for r in caplog.records if "keeping table v1" in r.getMessage()]
    assert len(said) == 1 and "window is empty" in said[0]
