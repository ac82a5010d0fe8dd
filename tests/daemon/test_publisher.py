"""The refresher: what it publishes to the store, and what it refuses to publish."""

from __future__ import annotations

import logging

import orjson
import pytest

from kvcast.daemon.publisher import Publisher
from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.stores.memory import MemoryStore
from kvcast.daemon.stores.redis_store import RedisStore
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from kvcast.stats.config import StatsConfig
from kvcast.stats.ingest import ingest
from kvcast.stats.labeller import IntentLabeller
from kvcast.stats.partition import PartitionEngine
from kvcast.stats.replay import offline_statistics
from kvcast.stats.snapshot import take_snapshot
from tests.support import canonical

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


class _CommitsAfterTheRead:
    """A store on which ``late`` (a partition's delta) is committed right after the first
    window read: what another replica's commit does while this refresher computes."""

    def __init__(self, inner, late) -> None:
        self.inner, self.late = inner, late

    def load_window(self, config):
        state = self.inner.load_window(config)
        if self.late is not None:
            self.inner.commit(self.late)
            self.late = None
        return state

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("kind", ["memory", pytest.param("redis", marks=pytest.mark.integration)])
def test_a_bucket_committed_while_the_refresher_computes_is_never_expired(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """The window is not full (fewer conversations than window_conversations, none too old):
    nothing may expire. Partition p:1 commits its first completed conversations, older than
    any bucket of p:0, between the refresher's window read and its expiry: they stay, and the
    window equals the offline reference (before the fix the expiry, bounded by the oldest
    bucket the read saw, deleted them: the range rolling-restart case's differing figures)."""
    trace = generate(preset("mixed"), lambda0=1.0, conversations=300, seed=4, prompts=False)
    lines = [line.rstrip(b"\n") for line in trace.jsonl_lines()]
    first: dict[str, int] = {}
    for line in lines:  # sessions in order of their first event
        first.setdefault(orjson.loads(line)["session_id"], len(first))
    early = {session for session, rank in first.items() if rank < 60}
    records = [(int(orjson.loads(line)["session_id"] not in early), n, line)
               for n, line in enumerate(lines)]  # fmt: skip
    if kind == "memory":
        inner = MemoryStore()
    else:
        inner = RedisStore(request.getfixturevalue("redis_url"),
                           namespace=request.getfixturevalue("redis_namespace"))  # fmt: skip
    deltas = {}
    labeller = IntentLabeller()
    for partition in (0, 1):
        engine = PartitionEngine(STATS, f"p:{partition}")
        mine = [(engine, offset, line) for p, offset, line in records if p == partition]
        ingest(mine, labeller)
        deltas[partition] = engine.take_delta()
    late = deltas[0]  # the early sessions: the oldest completed conversations
    assert min(late.buckets) < min(deltas[1].buckets)
    inner.commit(deltas[1])
    publisher = Publisher(SETTINGS, _CommitsAfterTheRead(inner, late), lambda: (True, "ok"))
    publisher.refresh_once()  # read (p:1 alone), p:0 commits, expiry
    publisher.refresh_once()

    reference, _ = offline_statistics([(f"p:{p}", o, line) for p, o, line in records], STATS)
    state = inner.load_window(STATS)
    assert set(state.window.buckets) == set(late.buckets) | set(deltas[1].buckets)
    stored = take_snapshot(state.window, state.arrivals, STATS, state.newest_event_time,
                           age_limited=False)  # fmt: skip
    assert canonical(stored) == canonical(reference)
    forecast = publisher.published.forecast_document()
    assert forecast is not None
    assert forecast["window_conversations"] == reference.window_conversations
    inner.close()
