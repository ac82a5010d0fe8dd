"""The refresh: from the stored window to the forecast, the candidate table and what may expire."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcast.daemon.refresh import (
    CURVE_POINTS,
    capacity_grid,
    compute_refresh,
    expiry_bounds,
    should_publish,
)
from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.stores import WindowState
from kvcast.daemon.stores.memory import MemoryStore
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from kvcast.stats.config import StatsConfig
from kvcast.stats.documents import TableDocument
from kvcast.stats.forecast import forecast_from_sample
from kvcast.stats.ingest import ingest
from kvcast.stats.labeller import IntentLabeller
from kvcast.stats.partition import PartitionEngine
from kvcast.stats.snapshot import take_snapshot
from tests.support import canonical

STATS = StatsConfig(completion_timeout_s=600, allowed_lateness_s=30, max_turn=8)
SETTINGS = DaemonSettings(stats=STATS, capacity_blocks=400, target_hit_ratios=(0.2, 0.4, 0.6))


def workload(conversations: int, seed: int, lambda0: float = 1.0) -> list[bytes]:
    trace = generate(
        preset("mixed"),
        lambda0=lambda0,
        conversations=conversations,
        seed=seed,
        cached_capacity_blocks=400,
    )
    return [line.rstrip(b"\n") for line in trace.jsonl_lines()]


def fill(
    store: MemoryStore,
    config: StatsConfig,
    lines: list[bytes],
    *,
    commit_every: int = 50,
    finish: bool = True,
    partition: str = "p:0",
) -> None:
    """Ingest ``lines`` as one partition, committing a delta every ``commit_every`` offsets."""
    engine = PartitionEngine(config, partition, store.load_partition(partition))
    labeller = IntentLabeller()
    for start in range(0, len(lines), commit_every):
        chunk = lines[start : start + commit_every]
        ingest(((engine, start + n, line) for n, line in enumerate(chunk)), labeller)
        store.commit(engine.take_delta())
    if finish:
        engine.flush()
        store.commit(engine.take_delta())


def newest_timestamp(lines: list[bytes]) -> float:
    return max(orjson.loads(line)["timestamp"] for line in lines)


# -- capacity_grid -----------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [1, 16, 400, 2275, 10**6])
def test_the_capacity_grid_is_geometric_from_a_sixteenth_to_sixteen_times_with_n_in_the_middle(
    capacity: int,
) -> None:
    grid = capacity_grid(capacity)
    assert len(grid) == CURVE_POINTS == 17
    assert grid[0] == capacity / 16
    assert grid[CURVE_POINTS // 2] == capacity
    assert grid[-1] == capacity * 16
    ratios = [b / a for a, b in itertools.pairwise(grid)]
    assert ratios == pytest.approx([math.sqrt(2)] * (CURVE_POINTS - 1), rel=1e-12)


# -- compute_refresh ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lines() -> list[bytes]:
    return workload(conversations=300, seed=21)


@pytest.fixture(scope="module")
def state(lines: list[bytes]) -> WindowState:
    store = MemoryStore()
    fill(store, STATS, lines)
    return store.load_window(STATS)


def test_a_refresh_forecasts_with_the_capacity_curve_and_one_capacity_per_target(
    lines: list[bytes], state: WindowState
) -> None:
    refresh = compute_refresh(state, SETTINGS, table_version=7)
    forecast = refresh.forecast.to_dict()
    assert forecast["status"] == "ok"
    assert forecast["capacity_blocks"] == SETTINGS.capacity_blocks
    assert forecast["block_size"] == STATS.block_size
    assert forecast["instances"] == SETTINGS.instances
    curve = forecast["curve"]
    assert [point["capacity_blocks"] for point in curve] == capacity_grid(SETTINGS.capacity_blocks)
    assert curve[CURVE_POINTS // 2]["hit_ratio"] == pytest.approx(forecast["hit_ratio"])
    hit_ratios = [point["hit_ratio"] for point in curve]
    assert hit_ratios == sorted(hit_ratios)  # more capacity never hits less
    required = forecast["required_capacity_by_target"]
    assert [entry["target"] for entry in required] == list(SETTINGS.target_hit_ratios)
    reached = [entry["blocks"] for entry in required if entry["status"] == "ok"]
    assert reached and reached == sorted(reached)  # a higher target needs no fewer blocks
    orjson.dumps(forecast)  # the forecast document is JSON as it is


@pytest.mark.parametrize("kv_bytes_per_token", [None, 2048])
def test_each_targets_capacity_is_the_forecast_of_that_target(
    state: WindowState, kv_bytes_per_token: int | None
) -> None:
    """The refresh answers every target with one solve of the model; each answer is the one
    a forecast asked for that target alone gives, with the same instances and bytes."""
    settings = replace(SETTINGS, instances=2, kv_bytes_per_token=kv_bytes_per_token)
    refresh = compute_refresh(state, settings, table_version=1)
    sample = refresh.snapshot.sample
    alone = tuple(
        forecast_from_sample(
            sample, settings.capacity_blocks, STATS.block_size, 2,
            kv_bytes_per_token=kv_bytes_per_token, target=target,
        ).required_capacity
        for target in settings.target_hit_ratios
    )  # fmt: skip
    assert refresh.forecast.required_capacity_by_target == alone
    assert {r.status for r in alone} == {"ok"}  # 0.2-0.6 are within reach of this workload


def test_a_refresh_is_stamped_with_the_newest_event_time_and_the_window_it_read(
    lines: list[bytes], state: WindowState
) -> None:
    refresh = compute_refresh(state, SETTINGS, table_version=7)
    assert state.newest_event_time == newest_timestamp(lines)
    assert refresh.forecast.event_time == state.newest_event_time
    assert refresh.snapshot.generated_at == state.newest_event_time
    expected = take_snapshot(state.window, state.arrivals, STATS, state.newest_event_time)
    assert canonical(refresh.snapshot) == canonical(expected)
    everything = sum(bucket.conversations for bucket in state.window.buckets.values())
    assert refresh.forecast.window_conversations == expected.window_conversations == everything


def test_a_refresh_table_is_at_the_given_version_with_the_snapshot_states(
    state: WindowState,
) -> None:
    refresh = compute_refresh(state, SETTINGS, table_version=7)
    table = refresh.table.to_dict()
    assert table["version"] == 7
    assert table["generated_at"] == state.newest_event_time
    assert table["max_turn"] == STATS.max_turn
    assert table["window_conversations"] == refresh.snapshot.window_conversations
    assert table["states"] == [s.to_dict() for s in refresh.snapshot.states]
    assert table["states"]
    assert compute_refresh(state, SETTINGS, table_version=8).table.version == 8


def test_the_table_carries_the_forecasts_characteristic_time(state: WindowState) -> None:
    """The density horizon: the table's T_C is the forecast's, to three significant digits
    (so that a table is not republished for every wiggle of T_C)."""
    refresh = compute_refresh(state, SETTINGS, table_version=7)
    t_c = refresh.forecast.forecast.characteristic_time_s
    assert t_c is not None and t_c > 0
    assert refresh.table.characteristic_time_s == float(f"{t_c:.3g}")
    assert refresh.table.characteristic_time_s == pytest.approx(t_c, rel=5e-3)
    empty = compute_refresh(MemoryStore().load_window(STATS), SETTINGS, table_version=0)
    assert empty.table.characteristic_time_s is None


def test_a_refresh_of_an_empty_store_has_no_data_and_no_event_time() -> None:
    refresh = compute_refresh(MemoryStore().load_window(STATS), SETTINGS, table_version=0)
    forecast = refresh.forecast.to_dict()
    assert forecast["status"] == "no_data"
    assert forecast["event_time"] is None
    assert len(forecast["curve"]) == CURVE_POINTS
    assert all(point["hit_ratio"] is None for point in forecast["curve"])
    assert [e["status"] for e in forecast["required_capacity_by_target"]] == ["no_data"] * 3
    assert refresh.table.version == 0 and refresh.table.states == ()
    orjson.dumps(forecast)


# -- should_publish ----------------------------------------------------------------------------


def tables(lines: list[bytes]) -> tuple[TableDocument, TableDocument, TableDocument]:
    """Tables at version 0 of: an empty store, the first half of ``lines``, all of them."""
    store = MemoryStore()
    empty = compute_refresh(store.load_window(STATS), SETTINGS, 0).table
    fill(store, STATS, lines[: len(lines) // 2])
    half = compute_refresh(store.load_window(STATS), SETTINGS, 0).table
    fill(store, STATS, lines[len(lines) // 2 :], partition="p:1")
    full = compute_refresh(store.load_window(STATS), SETTINGS, 0).table
    return empty, half, full


def test_nothing_is_published_while_warming_up(lines: list[bytes]) -> None:
    empty, _, _ = tables(lines)
    # Nothing observed, nothing published before, version 0: engines use the defaults anyway.
    assert not should_publish(None, empty, since_published_s=math.inf, table_interval_s=10)


def test_the_first_change_is_published_at_once(lines: list[bytes]) -> None:
    _, half, _ = tables(lines)
    assert should_publish(None, half, since_published_s=0.0, table_interval_s=10)


def test_an_empty_table_is_published_when_a_version_exists_already(lines: list[bytes]) -> None:
    empty, _, _ = tables(lines)
    # A restart that finds a published table (version 3) but no window: not a warm-up.
    assert should_publish(None, replace(empty, version=3), math.inf, 10)


def test_an_unchanged_content_is_never_published_again(lines: list[bytes]) -> None:
    _, half, _ = tables(lines)
    previous = replace(half, version=4, generated_at=1.0)
    again = replace(half, version=4, generated_at=99.0)  # only the time stamp moved
    assert not should_publish(previous, again, since_published_s=1e9, table_interval_s=10)


def test_a_change_waits_for_the_table_interval_since_the_last_publication(
    lines: list[bytes],
) -> None:
    _, half, full = tables(lines)
    previous = replace(half, version=4)
    current = replace(full, version=4)
    assert not should_publish(previous, current, since_published_s=9.99, table_interval_s=10)
    assert should_publish(previous, current, since_published_s=10.0, table_interval_s=10)
    assert should_publish(previous, current, since_published_s=60.0, table_interval_s=10)


# -- expiry_bounds -----------------------------------------------------------------------------


def test_nothing_may_expire_before_any_bucket_or_conversation_start() -> None:
    assert (
        expiry_bounds(MemoryStore().load_window(STATS), _snapshot_of(MemoryStore()), STATS) is None
    )

    # Conversation starts seen, none completed yet: no bucket.
    started = MemoryStore()
    fill(started, STATS, workload(conversations=20, seed=3)[:30], finish=False)
    state = started.load_window(STATS)
    assert state.arrivals.start_count > 0 and not state.window.buckets
    assert expiry_bounds(state, _snapshot_of(started), STATS) is None

    # Completed conversations, but none of their first turns seen (and no cached_tokens).
    later_turns = [
        line
        for line in generate(preset("mixed"), lambda0=1.0, conversations=40, seed=4).jsonl_lines()
        if orjson.loads(line)["turn"] > 1
    ]
    no_starts = MemoryStore()
    fill(no_starts, STATS, later_turns)
    state = no_starts.load_window(STATS)
    assert state.window.buckets and not math.isfinite(state.arrivals.newest_start)
    assert expiry_bounds(state, _snapshot_of(no_starts), STATS) is None


def _snapshot_of(store: MemoryStore, config: StatsConfig = STATS):
    state = store.load_window(config)
    now = state.newest_event_time if math.isfinite(state.newest_event_time) else None
    return take_snapshot(state.window, state.arrivals, config, now)


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    conversations=st.integers(5, 150),
    lambda0=st.sampled_from([0.1, 0.5, 2.0]),
    bucket_s=st.sampled_from([5.0, 30.0, 120.0]),
    window_conversations=st.integers(1, 60),
    window_max_age_s=st.sampled_from([300.0, 3_600.0, 86_400.0]),
    rate_window_s=st.integers(1, 300),
    commit_every=st.sampled_from([7, 100]),
)
def test_expiry_never_drops_a_bucket_in_the_window_nor_a_second_in_the_rate_window(
    seed: int,
    conversations: int,
    lambda0: float,
    bucket_s: float,
    window_conversations: int,
    window_max_age_s: float,
    rate_window_s: int,
    commit_every: int,
) -> None:
    config = StatsConfig(
        completion_timeout_s=600,
        allowed_lateness_s=30,
        max_turn=8,
        bucket_s=bucket_s,
        window_conversations=window_conversations,
        window_max_age_s=window_max_age_s,
        rate_window_s=rate_window_s,
    )
    settings_ = DaemonSettings(stats=config, capacity_blocks=400)
    store = MemoryStore()
    fill(store, config, workload(conversations, seed, lambda0), commit_every=commit_every)
    state = store.load_window(config)
    refresh = compute_refresh(state, settings_, table_version=1)
    bounds = expiry_bounds(state, refresh.snapshot, config)
    assert bounds is not None
    bucket_before, second_before = bounds
    in_window = {id(b) for b in state.window.buckets_in_window(refresh.snapshot.generated_at)}
    for index, bucket in state.window.buckets.items():
        if id(bucket) in in_window:
            assert index >= bucket_before
    newest_second = math.floor(state.arrivals.newest_start)
    assert newest_second - rate_window_s + 1 >= second_before

    store.expire(bucket_before, second_before)
    after = store.load_window(config)
    again = compute_refresh(after, settings_, table_version=1)
    assert canonical(again.snapshot) == canonical(refresh.snapshot)
    assert again.table == refresh.table
    # Expiring is idempotent, and what is left expires nothing more at the same bounds.
    assert store.expire(bucket_before, second_before) == 0


def test_expiry_drops_what_can_never_enter_the_window_again() -> None:
    config = StatsConfig(
        completion_timeout_s=600,
        allowed_lateness_s=30,
        bucket_s=30,
        window_conversations=20,
        rate_window_s=60,
    )
    store = MemoryStore()
    fill(store, config, workload(conversations=200, seed=9))
    state = store.load_window(config)
    snapshot = _snapshot_of(store, config)
    bounds = expiry_bounds(state, snapshot, config)
    assert bounds is not None
    bucket_before, second_before = bounds
    assert min(state.window.buckets) < bucket_before  # old buckets exist and may go
    assert min(state.arrivals.seconds) < second_before
    assert store.expire(bucket_before, second_before) > 0
    after = store.load_window(config)
    assert min(after.window.buckets) == bucket_before
    assert min(after.arrivals.seconds) >= second_before
    assert canonical(_snapshot_of(store, config)) == canonical(snapshot)


def test_a_window_short_of_conversations_expires_by_each_partitions_own_age_limit() -> None:
    """Not full (window_conversations above all there is): only the age limit expires, and a
    partition behind the others in event time keeps what its own limit keeps."""
    config = StatsConfig(
        completion_timeout_s=600,
        allowed_lateness_s=30,
        bucket_s=30,
        window_conversations=10_000,
        window_max_age_s=300,
    )
    lines = workload(conversations=200, seed=9)
    store = MemoryStore()
    fill(store, config, lines, partition="p:0")
    behind = newest_timestamp(lines) - 2_000  # p:1's events stop 2000 s earlier
    fill(store, config, [ln for ln in lines if orjson.loads(ln)["timestamp"] <= behind],
         partition="p:1")  # fmt: skip
    state = store.load_window(config)
    assert sum(b.conversations for b in state.window.buckets.values()) < 10_000
    settings_ = DaemonSettings(stats=config, capacity_blocks=400)
    refresh = compute_refresh(state, settings_, table_version=1)
    bounds = expiry_bounds(state, refresh.snapshot, config)
    assert bounds is not None
    bucket_before, second_before = bounds
    anchor = state.partition_newest["p:1"]
    assert anchor == min(state.partition_newest.values())
    assert (bucket_before + 1) * config.bucket_s > anchor - config.window_max_age_s
    assert bucket_before * config.bucket_s <= anchor - config.window_max_age_s
    assert store.expire(bucket_before, second_before) > 0  # p:0's old buckets and p:1's aged
    after = store.load_window(config)
    assert set(after.window.buckets) == set(state.window.buckets)
    again = compute_refresh(after, settings_, table_version=1)
    assert canonical(again.snapshot) == canonical(refresh.snapshot)
    assert store.expire(bucket_before, second_before) == 0
