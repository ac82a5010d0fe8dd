"""The embedded default's source: a generated workload of valid events, as one partition."""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

import pytest

from kvcast.cli.demo import demo_source, embedded_source
from kvcast.daemon.instance import open_store_and_source
from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.sources import Record, ReplaySource
from kvcast.lab.bench.processes import DaemonProcess, wait_until
from kvcast.stats.config import StatsConfig
from kvcast.stats.events import Event, parse_event

# Event seconds per wall second so high that every record is due at once (no pacing waits).
INSTANT = 1e12


def drain(source: ReplaySource) -> list[Record]:
    """Every record of a finite source, through its public polling interface."""
    records: list[Record] = []
    while not source.finished():
        records.extend(source.poll(0.05, 10_000))
    return records


def events(source: ReplaySource) -> list[Event]:
    return [parse_event(record.value) for record in drain(source)]


def test_the_embedded_source_replays_valid_events_of_the_contract_as_one_partition() -> None:
    source = embedded_source(40, INSTANT, capacity_blocks=500, block_size=16)
    assert isinstance(source, ReplaySource)
    records = drain(source)
    assert records
    assert {record.partition for record in records} == {"embedded:0"}
    assert [record.offset for record in records] == list(range(len(records)))
    parsed = [parse_event(record.value) for record in records]  # raises on any invalid line
    assert all(e.intent is not None for e in parsed)
    timestamps = [e.timestamp for e in parsed]
    assert timestamps == sorted(timestamps)


def test_the_embedded_source_is_deterministic_for_a_seed() -> None:
    def values(seed: int) -> list[bytes]:
        source = embedded_source(30, INSTANT, capacity_blocks=500, block_size=16, seed=seed)
        return [record.value for record in drain(source)]

    assert values(3) == values(3)
    assert values(3) != values(4)
    assert values(7) == [
        record.value
        for record in drain(embedded_source(30, INSTANT, capacity_blocks=500, block_size=16))
    ]  # seed 7 by default


def test_cached_tokens_are_reported_and_never_exceed_the_input() -> None:
    parsed = events(embedded_source(60, INSTANT, capacity_blocks=500, block_size=16))
    assert all(e.cached_tokens is not None for e in parsed)
    assert all(0 <= e.cached_tokens <= e.input_tokens for e in parsed)  # type: ignore[operator]
    assert any(e.cached_tokens > 0 for e in parsed)  # type: ignore[operator]


@pytest.mark.parametrize("conversations,block_size", [(12, 16), (25, 32), (40, 8)])
def test_the_demo_source_honours_the_sample_size_and_block_size(
    conversations: int, block_size: int
) -> None:
    settings = DaemonSettings(
        sample_conversations=conversations,
        speedup=INSTANT,
        capacity_blocks=300,
        stats=StatsConfig(block_size=block_size),
    )
    source = demo_source(settings)
    assert isinstance(source, ReplaySource)
    parsed = events(source)
    assert len({e.session_id for e in parsed}) == conversations
    assert sum(e.turn == 1 for e in parsed) == conversations
    # Cache hits are whole blocks of block_size, capped at the request's input.
    for e in parsed:
        assert e.cached_tokens is not None
        assert e.cached_tokens % block_size == 0 or e.cached_tokens == e.input_tokens
    expected = embedded_source(conversations, INSTANT, 300, block_size)
    assert [parse_event(r.value) for r in drain(expected)] == parsed


def test_embedded_settings_without_a_demo_source_are_an_error() -> None:
    settings = DaemonSettings()
    assert settings.embedded
    with pytest.raises(ValueError, match="no --source given and no embedded sample workload"):
        open_store_and_source(settings)
    with pytest.raises(ValueError, match="embedded"):
        open_store_and_source(settings, demo_source=None)


def test_embedded_settings_take_the_given_demo_source() -> None:
    settings = DaemonSettings(sample_conversations=5, speedup=INSTANT)
    store, source = open_store_and_source(settings, demo_source=demo_source)
    try:
        assert isinstance(source, ReplaySource)
        assert len({e.session_id for e in events(source)}) == 5
        assert store.read_table() is None  # a fresh embedded (memory) store
    finally:
        store.close()


STATUS = re.compile(
    rb"^kvcast \| ([\d,]+) events/s \| processed ([\d,]+) .*\| table v([\d-]+) ", re.M
)
ENDED = re.compile(rb"^kvcast: the source has ended: ([\d,]+) events applied and stored;", re.M)


def number(text: bytes) -> int:
    return int(text.replace(b",", b""))


def run_demo(tmp_path: Path, **env: str) -> DaemonProcess:
    """``kvcast run`` on its embedded default (a small sample), status lines every 0.5 s."""
    return DaemonProcess(
        ["--metrics-addr", "127.0.0.1:0", "--status-interval", "0.5", "--commit-interval", "0.2"],
        tmp_path / "demo.log",
        env={**os.environ, "KVCAST_SAMPLE_CONVERSATIONS": "800", "KVCAST_SPEEDUP": "150", **env},
    )  # fmt: skip


def test_processed_moves_with_the_rate_between_refreshes(tmp_path: Path) -> None:
    """The status line's "processed" counts this process's commits as they are stored, not
    only at each refresh: with one refresh in an hour (the one at start, before any event),
    it still rises line by line while events flow (before: "processed 0" beside the rate)."""
    demo = run_demo(tmp_path, KVCAST_REFRESH_INTERVAL="3600")
    try:
        wait_until(lambda: len(STATUS.findall(demo.log.read_bytes())) >= 6, 60, "6 status lines")
    finally:
        assert demo.stop() == 0, demo.text()
    lines = [(number(rate), number(processed)) for rate, processed, _ in STATUS.findall(
        demo.log.read_bytes())]  # fmt: skip
    flowing = [processed for rate, processed in lines if rate > 0]
    assert len(flowing) >= 3 and flowing[-1] > 0, demo.text()
    assert len(set(flowing)) >= 2, demo.text()  # it moved while events came
    assert all(a <= b for a, b in itertools.pairwise(p for _, p in lines)), demo.text()
    applied = re.search(r"stopped on SIGTERM: ([\d,]+) events applied", demo.text())
    assert applied and flowing[-1] <= number(applied.group(1).encode())


def test_the_finite_demo_says_when_it_is_done_and_then_changes_nothing(tmp_path: Path) -> None:
    """The sample replayed and stored: one line says so; the status lines after it show every
    applied event as processed and the same table version, refresh after refresh. (Paced
    20 times faster than the other demos: what happens once the sample ends does not depend on
    how fast it was replayed, and at 150x the sample takes over a minute.)"""
    demo = run_demo(
        tmp_path, KVCAST_REFRESH_INTERVAL="0.2", KVCAST_TABLE_INTERVAL="0.2", KVCAST_SPEEDUP="3000"
    )
    try:
        wait_until(lambda: ENDED.search(demo.log.read_bytes()), 120, "the end of the sample")
        ended_at = ENDED.search(demo.log.read_bytes())
        assert ended_at is not None
        wait_until(lambda: len(STATUS.findall(demo.log.read_bytes()[ended_at.end() :])) >= 12,
                   60, "12 status lines after the end")  # fmt: skip
        after = STATUS.findall(demo.log.read_bytes()[ended_at.end() :])
    finally:
        assert demo.stop() == 0, demo.text()
    applied = number(ended_at.group(1))
    assert demo.text().count("the source has ended") == 1
    settled = after[2:]  # the refresh the end asked for has run (refresh every 0.2 s)
    assert {number(processed) for _, processed, _ in settled} == {applied}
    versions = {version for _, _, version in settled}
    assert len(versions) == 1 and versions != {b"-"}, after
    assert re.search(rf"stopped on SIGTERM: {applied:,} events applied, everything stored",
                     demo.text())  # fmt: skip
