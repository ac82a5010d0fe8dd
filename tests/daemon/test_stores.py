"""One contract for every state store: the in-memory one, Redis (a real server), Redis behind
a real Sentinel, and a real local Redis Cluster (its own layout: per-partition counters the
reader adds up).

The reference is always the plain :class:`StatsEngine` over the same events: whatever the
commit points, crashes, partitions or fencing, the stored statistics must equal it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import orjson
import pytest

from kvcast.daemon.refresh import compute_refresh
from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.stores import StaleOwner, StateStore, open_store
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from kvcast.stats.config import StatsConfig
from kvcast.stats.engine import StatsEngine
from kvcast.stats.events import Event, parse_event
from kvcast.stats.partition import PartitionEngine
from kvcast.stats.snapshot import take_snapshot
from tests.support import canonical, shared_prefix_events

CONFIG = StatsConfig(completion_timeout_s=900, allowed_lateness_s=30, max_turn=8)


@pytest.fixture(
    params=[
        "memory",
        pytest.param("redis", marks=pytest.mark.integration),
        pytest.param("cluster", marks=pytest.mark.integration),
        pytest.param("sentinel", marks=pytest.mark.integration),
    ]
)
def store(request: pytest.FixtureRequest) -> Iterator[StateStore]:
    if request.param == "memory":
        opened = open_store("memory://")
    elif request.param == "sentinel":  # the plain layout on the master a sentinel names
        url = request.getfixturevalue("redis_sentinel").url
        opened = open_store(url, namespace=request.getfixturevalue("redis_sentinel_namespace"))
    elif request.param == "cluster":  # a real 3-master cluster, partitions over its shards
        url = request.getfixturevalue("redis_cluster").url
        opened = open_store(url, namespace=request.getfixturevalue("redis_cluster_namespace"))
    else:
        url = request.getfixturevalue("redis_url")
        opened = open_store(url, namespace=request.getfixturevalue("redis_namespace"))
    yield opened
    opened.close()


def log_of(kind: str) -> list[Event]:
    """A partition's log: ``mixed`` (no block hashes), ``shared_prefixes`` (block hashes, so
    the shared-prefix sums, gaps and checkpoints go through the store too) or ``agent`` (agent
    endings on an epoch clock, so delays whose state intent is not the conversation's do)."""
    if kind == "mixed":
        trace = generate(preset("mixed"), lambda0=1.0, conversations=400, seed=11, prompts=False)
        raws = list(trace.events())
    elif kind == "agent":  # labelled by the responses' endings: states under their own intent
        trace = generate(
            preset("agent"), lambda0=0.05, conversations=25, seed=11, start_time=1.7e9,
            block_hashes=False,
        )  # fmt: skip
        # Six hours of it, so that the whole log stays within the window's maximum age.
        raws = [raw for raw in trace.events() if raw["timestamp"] < 1.7e9 + 6 * 3600]
    else:
        raws = shared_prefix_events(400, seed=11, rate_per_s=0.2)
    parsed = [parse_event(raw) for raw in raws]
    # A few duplicates, a rejected payload and a late event, as a real log has them.
    parsed[44:44] = [parsed[40], parsed[41]]
    return parsed


@pytest.fixture(scope="module", params=["mixed", "shared_prefixes", "agent"])
def events(request: pytest.FixtureRequest) -> list[Event]:
    return log_of(request.param)


@pytest.fixture(scope="module")
def mixed_events() -> list[Event]:
    """The log without block hashes: what the layouts before 0.2 could hold."""
    return log_of("mixed")


def reference(events: list[Event]) -> StatsEngine:
    engine = StatsEngine(CONFIG)
    for event in events:
        engine.apply(event, event.intent or "unknown")
    return engine


def stored_snapshot(store: StateStore):
    state = store.load_window(CONFIG)
    return take_snapshot(state.window, state.arrivals, CONFIG, state.newest_event_time), state


def run_partition(
    store: StateStore, events: list[Event], commit_every: int, partition: str = "t:0"
) -> PartitionEngine:
    engine = PartitionEngine(CONFIG, partition, store.load_partition(partition))
    for offset in range(engine.offset + 1, len(events)):
        event = events[offset]
        engine.apply(event, event.intent or "unknown", offset)
        if engine.pending_events >= commit_every:
            store.commit(engine.take_delta())
    store.commit(engine.take_delta())
    return engine


@pytest.mark.parametrize("commit_every", [1, 7, 10_000])
def test_committed_statistics_equal_the_reference(
    store: StateStore, events: list[Event], commit_every: int
) -> None:
    run_partition(store, events, commit_every)
    snapshot, state = stored_snapshot(store)
    expected = reference(events)
    assert canonical(snapshot) == canonical(expected.snapshot())
    assert snapshot.generated_at == expected.snapshot().generated_at
    assert state.counters.processed == expected.counters.processed
    assert state.counters.duplicates == expected.counters.duplicates == 2


@pytest.mark.parametrize("crash_at", [0, 1, 123, 777])
def test_a_crash_between_commits_loses_and_doubles_nothing(
    store: StateStore, events: list[Event], crash_at: int
) -> None:
    # The first owner applies events up to crash_at and commits every 50; what it applied
    # after its last commit dies with it.
    first = PartitionEngine(CONFIG, "t:0", store.load_partition("t:0"))
    for offset in range(crash_at):
        first.apply(events[offset], events[offset].intent or "unknown", offset)
        if first.pending_events >= 50:
            store.commit(first.take_delta())
    del first
    run_partition(store, events, commit_every=50)
    snapshot, state = stored_snapshot(store)
    expected = reference(events)
    assert canonical(snapshot) == canonical(expected.snapshot())
    assert state.counters.processed == expected.counters.processed


def test_a_fenced_owner_cannot_commit(store: StateStore, events: list[Event]) -> None:
    old = PartitionEngine(CONFIG, "t:0", store.load_partition("t:0"))
    new = PartitionEngine(CONFIG, "t:0", store.load_partition("t:0"))
    for offset in range(20):
        old.apply(events[offset], "x", offset)
        new.apply(events[offset], "x", offset)
    store.commit(new.take_delta())
    with pytest.raises(StaleOwner):
        store.commit(old.take_delta())
    assert store.load_partition("t:0").offset == 19


def test_partitions_add_up_like_instances(store: StateStore, events: list[Event]) -> None:
    by_partition: dict[str, list[Event]] = {"t:0": [], "t:1": [], "t:2": []}
    for event in events:
        by_partition[f"t:{sum(event.session_id.encode()) % 3}"].append(event)
    for partition, partition_events in by_partition.items():
        run_partition(store, partition_events, commit_every=13, partition=partition)
    snapshot, _ = stored_snapshot(store)
    engines = [reference(partition_events) for partition_events in by_partition.values()]
    merged = engines[0]
    for other in engines[1:]:
        merged.merge(other)
    newest = max(e.tracker.newest_event_time for e in engines)
    assert canonical(snapshot) == canonical(merged.snapshot(newest))


def test_flushed_partition_completes_every_conversation(
    store: StateStore, events: list[Event]
) -> None:
    engine = run_partition(store, events, commit_every=100)
    engine.flush()
    store.commit(engine.take_delta())
    snapshot, _ = stored_snapshot(store)
    expected = reference(events)
    expected.finish()
    assert canonical(snapshot) == canonical(expected.snapshot())
    assert store.load_partition("t:0").conversations == {}


def test_checkpoint_round_trips_open_conversations(store: StateStore, events: list[Event]) -> None:
    engine = run_partition(store, events[:300], commit_every=25)
    checkpoint = store.load_partition("t:0")
    assert checkpoint is not None and checkpoint.offset == 299
    assert set(checkpoint.conversations) == set(engine.tracker.open_items())
    assert checkpoint.seen_ids == engine.tracker.seen_ids()
    assert checkpoint.newest_ts == engine.tracker.newest_event_time


def test_expire_drops_old_buckets_and_seconds(store: StateStore, events: list[Event]) -> None:
    engine = run_partition(store, events, commit_every=100)
    engine.flush()
    store.commit(engine.take_delta())
    state = store.load_window(CONFIG)
    indices = sorted(state.window.buckets)
    cut = indices[len(indices) // 2]
    seconds = sorted(state.arrivals.seconds)
    second_cut = seconds[len(seconds) // 2]
    assert store.expire(cut, second_cut) == len(indices) // 2
    after = store.load_window(CONFIG)
    assert sorted(after.window.buckets) == indices[len(indices) // 2 :]
    assert min(after.arrivals.seconds) >= second_cut
    assert store.expire(cut, second_cut) == 0


def test_table_is_replaced_whole(store: StateStore) -> None:
    assert store.read_table() is None
    store.publish_table({"version": 1, "states": [{"intent": "x", "turn": 1}]})
    store.publish_table({"version": 2, "states": []})
    assert store.read_table() == {"version": 2, "states": []}


def test_empty_store_reads_as_no_data(store: StateStore) -> None:
    state = store.load_window(CONFIG)
    assert state.window.buckets == {} and state.counters.processed == 0
    assert state.newest_event_time == -math.inf
    assert store.load_partition("nope:0") is None
    assert np.isinf(state.arrivals.first_start)


def test_the_epoch_stays_while_the_data_lives(store: StateStore, events: list[Event]) -> None:
    """Every reader sees the same epoch, before and after commits and table publications."""
    first = store.epoch()
    assert isinstance(first, str) and first
    run_partition(store, events, commit_every=97)
    store.publish_table({"version": 1, "states": []})
    assert store.epoch() == first


@pytest.mark.integration
def test_a_redis_that_lost_its_data_has_a_new_epoch(redis_url, redis_client, redis_namespace):
    """The data gone (a restart without persistence, here its keys deleted): a new epoch, the
    same for every instance of the namespace, so each one knows to reload its partitions."""
    one, two = open_store(redis_url, redis_namespace), open_store(redis_url, redis_namespace)
    try:
        before = one.epoch()
        assert two.epoch() == before
        keys = list(redis_client.scan_iter(f"{redis_namespace}:*"))
        redis_client.delete(*keys)
        after = two.epoch()
        assert after != before and one.epoch() == after
    finally:
        one.close()
        two.close()


def test_each_partitions_window_is_anchored_at_its_own_newest_event(store: StateStore) -> None:
    """A partition whose clock runs 50 minutes ahead ages only its own conversations: before,
    the window was cut at the newest event of all partitions, and one producer's clock emptied
    every partition's part of the window (issue 18, item 4)."""
    config = StatsConfig(completion_timeout_s=60, allowed_lateness_s=0, window_max_age_s=1800,
                         bucket_s=60)  # fmt: skip

    def conversation(session: str, start: float) -> list[Event]:
        return [parse_event({"session_id": session, "turn": turn, "timestamp": start + 20 * turn,
                             "input_tokens": 100 * turn, "output_tokens": 5})
                for turn in (1, 2)]  # fmt: skip

    behind = [e for n in range(20) for e in conversation(f"a{n}", 1000.0 + 30 * n)]
    ahead = [e for n in range(20) for e in conversation(f"b{n}", 1000.0 + 30 * n)]
    ahead += conversation("jump", 1000.0 + 3000.0)  # this producer's clock: 50 minutes ahead
    for partition, events in (("t:0", behind), ("t:1", ahead)):
        engine = PartitionEngine(config, partition)
        for offset, event in enumerate(sorted(events, key=lambda e: e.timestamp)):
            engine.apply(event, "chitchat", offset)
        engine.flush()  # every conversation completes: all in the window's buckets
        store.commit(engine.take_delta())
    refresh = compute_refresh(
        store.load_window(config), DaemonSettings(stats=config, capacity_blocks=100), 1
    )
    counted = refresh.snapshot.window_conversations  # what the published table is made of

    def within_own_age(partition: str, newest_s: float) -> int:
        """Brute force: the partition's conversations whose last turn's bucket ends after its
        own newest event time minus the max age."""
        events = behind if partition == "t:0" else ahead
        last: dict[str, float] = {}
        for event in events:
            last[event.session_id] = max(last.get(event.session_id, 0.0), event.timestamp)
        return sum(1 for ts in last.values() if (ts // 60 + 1) * 60 > newest_s - 1800)

    expected = within_own_age("t:0", 1000.0 + 30 * 19 + 40) + within_own_age("t:1", 4040.0)
    assert counted == expected == 20 + 1  # all of t:0's; of t:1 only the jump's own


@pytest.mark.integration
def test_a_window_kept_in_the_layout_before_0_2_is_still_read_and_expired(
    redis_url: str, redis_client, redis_namespace: str, mixed_events: list[Event]
) -> None:
    store = open_store(redis_url, namespace=redis_namespace)
    run_partition(store, mixed_events, commit_every=100)
    before = stored_snapshot(store)[0]
    key = store.key  # type: ignore[attr-defined]
    indices = [int(i) for i in redis_client.zrange(key("buckets", "t:0"), 0, -1)]
    for index in indices:  # back to one window for all partitions, as 0.1 wrote it
        redis_client.rename(key("bucket", "t:0", index), key("bucket", index))
        if redis_client.exists(key("delays", "t:0", index)):
            redis_client.rename(key("delays", "t:0", index), key("delays", index))
    redis_client.rename(key("buckets", "t:0"), key("buckets"))
    redis_client.delete(key("parts"))
    assert canonical(stored_snapshot(store)[0]) == canonical(before)
    assert store.expire(max(indices) + 1, 0) == len(indices)
    assert not redis_client.exists(key("buckets")) and not store.load_window(CONFIG).window.buckets


@pytest.mark.integration
def test_gap_batches_an_earlier_daemon_wrote_as_pairs_still_read(
    redis_url: str, redis_client, redis_namespace: str
) -> None:
    """Before flat gaps a batch was ``[[gap_s, blocks], ...]``: a window written so (here
    rewritten so in Redis, batch by batch) must read as the flat one it stands for."""
    store = open_store(redis_url, namespace=redis_namespace)
    run_partition(store, log_of("shared_prefixes"), commit_every=50)
    before = stored_snapshot(store)[0]
    assert before.sample.shared_gap_s is not None and before.sample.shared_gap_s.size > 0
    key = store.key  # type: ignore[attr-defined]
    rewritten = 0
    for index in redis_client.zrange(key("buckets", "t:0"), 0, -1):
        gaps_key = key("sgaps", "t:0", int(index))
        batches = [orjson.loads(b) for b in redis_client.lrange(gaps_key, 0, -1)]
        if not batches:
            continue
        redis_client.delete(gaps_key)
        for flat in batches:
            redis_client.rpush(
                gaps_key, orjson.dumps([list(p) for p in zip(flat[::2], flat[1::2], strict=True)])
            )
            rewritten += 1
    assert rewritten > 1
    assert canonical(stored_snapshot(store)[0]) == canonical(before)
