"""The Redis Cluster store against a real local cluster (3 masters, 1 replica each): URLs,
partitions spread over the shards, a URL naming a node that owns none of them, and a reshard
and a replica promotion while partition engines commit; the statistics must still equal the
offline reference exactly. And the Sentinel store through a real sentinel's failover."""

from __future__ import annotations

import math
import signal
import socket
import threading
import time
import urllib.error
import zlib

import orjson
import pytest
from redis.crc import key_slot

from kvcast.daemon.stores import StaleOwner, StoreUnavailable, open_store
from kvcast.daemon.stores.redis_cluster import RedisClusterStore, parse_nodes
from kvcast.lab.bench.processes import DaemonProcess, wait_until
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from kvcast.stats.config import StatsConfig
from kvcast.stats.engine import StatsEngine
from kvcast.stats.events import Event, parse_event
from kvcast.stats.partition import PartitionCheckpoint, PartitionDelta, PartitionEngine
from kvcast.stats.snapshot import take_snapshot
from tests.support import canonical

EMPTY = PartitionCheckpoint(offset=-1, newest_ts=-math.inf)
CONFIG = StatsConfig(completion_timeout_s=900, allowed_lateness_s=30, max_turn=8)
PARTITIONS = [f"t:{n}" for n in range(6)]


@pytest.fixture(scope="module")
def events() -> list[Event]:
    trace = generate(preset("mixed"), lambda0=1.0, conversations=300, seed=5, prompts=False)
    return [parse_event(raw) for raw in trace.events()]


def split(events: list[Event]) -> dict[str, list[Event]]:
    """Sessions hashed to partitions, as Kafka keys them."""
    parts: dict[str, list[Event]] = {p: [] for p in PARTITIONS}
    for event in events:
        parts[PARTITIONS[zlib.crc32(event.session_id.encode()) % len(PARTITIONS)]].append(event)
    return parts


def expected_snapshot(by_partition: dict[str, list[Event]]):
    engines = []
    for partition_events in by_partition.values():
        engine = StatsEngine(CONFIG)
        for event in partition_events:
            engine.apply(event, event.intent or "unknown")
        engines.append(engine)
    merged = engines[0]
    for other in engines[1:]:
        merged.merge(other)
    return merged.snapshot(max(e.tracker.newest_event_time for e in engines))


def stored_snapshot(store):
    state = store.load_window(CONFIG)
    return take_snapshot(state.window, state.arrivals, CONFIG, state.newest_event_time)


def slot_of(namespace: str, partition: str) -> int:
    return key_slot(f"{namespace}:{partition}".encode())


class Committer:
    """Partition engines committing every ``every`` events, as the daemon does: a refused
    commit (StoreUnavailable) is retried as it is; a fenced one (StaleOwner: the store has
    another offset, e.g. a commit whose reply was lost was applied) reloads the checkpoint
    and goes on from its offset."""

    def __init__(self, store, by_partition: dict[str, list[Event]], every: int = 5) -> None:
        self.store, self.by_partition, self.every = store, by_partition, every
        self.commits = 0
        self.during_fault = 0
        self.refused_during_fault = 0
        self.lost = 0  # partitions found behind at the end (an acknowledged commit lost)
        self.refused = 0
        self.reloads = 0
        self.error: BaseException | None = None
        # Commits from ``hold_at`` on wait for ``released``: some are sure to come after a fault.
        self.hold_at = -1
        self.released = threading.Event()

    def report(self) -> str:
        return (
            f"{self.commits} commits ({self.during_fault} during the fault), {self.refused}"
            f" refused and retried ({self.refused_during_fault} during the fault),"
            f" {self.reloads} reloads, {self.lost} found behind"
        )

    def commit(self, engine: PartitionEngine, partition: str) -> PartitionEngine:
        delta = engine.take_delta()
        deadline = time.monotonic() + 60
        while True:
            try:
                self.store.commit(delta)
                self.commits += 1
                return engine
            except StoreUnavailable:
                self.refused += 1
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
            except StaleOwner:
                self.reloads += 1
                return PartitionEngine(CONFIG, partition, self.load(partition))

    def load(self, partition: str) -> PartitionCheckpoint | None:
        """The partition's checkpoint, retried while the store refuses (as the daemon does)."""
        deadline = time.monotonic() + 60
        while True:
            try:
                return self.store.load_partition(partition)
            except StoreUnavailable:
                self.refused += 1
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def run(self, pause_s: float = 0.002) -> None:
        try:
            engines = {p: PartitionEngine(CONFIG, p, self.store.load_partition(p))
                       for p in PARTITIONS}  # fmt: skip
            while True:
                self._consume(engines, pause_s)
                # An acknowledged commit that a failover lost (replication is asynchronous)
                # leaves the stored offset behind: a live daemon finds out at its next commit
                # (StaleOwner) and reloads; here the partitions are done, so look.
                behind = [p for p in PARTITIONS if (self.load(p) or EMPTY).offset
                          != len(self.by_partition[p]) - 1]  # fmt: skip
                if not behind:
                    return
                for partition in behind:
                    self.lost += 1
                    engines[partition] = PartitionEngine(CONFIG, partition, self.load(partition))
        except BaseException as exc:  # reported by the test's thread join
            self.error = exc

    def _consume(self, engines: dict[str, PartitionEngine], pause_s: float) -> None:
        done = False
        while not done:
            done = True
            for partition, engine in list(engines.items()):
                partition_events = self.by_partition[partition]
                start = engine.offset + 1
                for offset in range(start, min(start + self.every, len(partition_events))):
                    event = partition_events[offset]
                    engine.apply(event, event.intent or "unknown", offset)
                if engine.pending_events:
                    if self.commits == self.hold_at:
                        self.released.wait(120)
                    engines[partition] = self.commit(engine, partition)
                if engines[partition].offset + 1 < len(partition_events):
                    done = False
                time.sleep(pause_s)


def commit_while(store, events: list[Event], fault) -> Committer:
    """Commit every partition's events in a thread while ``fault()`` runs in this one, from
    a fifth of the commits on; the last fifth waits for the fault to end."""
    by_partition = split(events)
    committer = Committer(store, by_partition)
    total = sum(len(e) for e in by_partition.values()) // committer.every
    committer.hold_at = total * 4 // 5
    thread = threading.Thread(target=committer.run, args=(0.005,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while committer.commits < total // 5:
        assert thread.is_alive() and time.monotonic() < deadline, committer.error
        time.sleep(0.01)
    commits_at_fault_start, refused_at_fault_start = committer.commits, committer.refused
    fault()
    commits_at_fault_end = committer.commits
    committer.during_fault = commits_at_fault_end - commits_at_fault_start
    committer.refused_during_fault = committer.refused - refused_at_fault_start
    committer.released.set()
    thread.join(timeout=180)
    assert not thread.is_alive()
    if committer.error is not None:
        raise committer.error
    assert committer.commits > commits_at_fault_end, "the fault ended after the last commit"
    # The fault must meet the stream: commits made while it ran, or commits it refused (the
    # committer is one thread, as a partition's commits are in order: once it reaches a
    # partition whose master is down it retries that commit until the replica takes over, so
    # a kill that lands just before that commit leaves no other commit during the fault).
    assert committer.during_fault + committer.refused_during_fault > 0, (
        "the fault missed the stream: nothing was committed or refused while it ran"
    )
    return committer


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+cluster://", "is not HOST:PORT"),
        ("redis+cluster://h:1,h", "'h' is not HOST:PORT"),
        ("redis+cluster://h:99999", "is not HOST:PORT"),
        ("redis+cluster://h:1/3", "database 0 only"),
        ("redis+cluster://h:1?foo=1", "unknown option 'foo'"),
        ("redis+cluster://h:1?ssl_ca_certs=/x", "needs TLS"),
        ("redis+sentinel://:secret@h:1", "/SERVICE_NAME"),
        ("redis+sentinel://h:1/mymaster/x", "/SERVICE_NAME"),
    ],
)
def test_bad_urls_are_refused_with_what_is_wrong(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        open_store(url, "ns")
    assert "secret" not in str(caught.value)


def test_urls_carry_credentials_and_tls() -> None:
    options, nodes, segments, query = parse_nodes(
        "rediss+cluster://user:p%40ss@a:7000,b:7001?ssl_cert_reqs=none"
    )
    assert options == {"username": "user", "password": "p@ss", "ssl": True}
    assert (
        nodes == [("a", 7000), ("b", 7001)]
        and segments == []
        and query == {"ssl_cert_reqs": "none"}
    )


def test_partitions_spread_over_the_masters(redis_cluster, redis_cluster_namespace, events):
    """Each partition's keys lie in the partition's own slot, and 16 partitions' slots lie on
    more than one master (one namespace-wide tag put them all on one)."""
    store = open_store(redis_cluster.url, redis_cluster_namespace)
    try:
        partitions = [f"t:{n}" for n in range(16)]
        for n, partition in enumerate(partitions):
            engine = PartitionEngine(CONFIG, partition)
            for offset, event in enumerate(events[n::16]):
                engine.apply(event, event.intent or "unknown", offset)
            engine.flush()
            store.commit(engine.take_delta())
        masters = set()
        for partition in partitions:
            keys = store.keys_of(partition)  # type: ignore[attr-defined]
            assert len(keys) > 5 and {key_slot(k.encode()) for k in keys} == {
                slot_of(redis_cluster_namespace, partition)
            }
            masters.add(redis_cluster.master_of(slot_of(redis_cluster_namespace, partition)))
        assert len(masters) >= 2
        state = store.load_window(CONFIG)
        assert state.counters.processed == sum(len(events[n::16]) for n in range(16))
    finally:
        store.close()


def test_a_url_naming_a_node_that_owns_no_partition_works(
    redis_cluster, redis_cluster_namespace, events
):
    """The URL names one master that serves none of the namespace's slots: every request is
    redirected (MOVED) and the stored statistics equal the reference."""
    namespace = redis_cluster_namespace
    used = {slot_of(namespace, p) for p in PARTITIONS} | {key_slot(f"{namespace}".encode())}
    owners = {redis_cluster.master_of(slot) for slot in used}
    others = [port for port in redis_cluster.slot_owners() if port not in owners]
    if not others:  # every master owns one of the slots: take a replica, which owns none
        others = [redis_cluster.replica_of(next(iter(redis_cluster.slot_owners())))]
    store = open_store(f"redis+cluster://127.0.0.1:{others[0]}", namespace)
    try:
        by_partition = split(events)
        Committer(store, by_partition, every=40).run(pause_s=0)
        assert canonical(stored_snapshot(store)) == canonical(expected_snapshot(by_partition))
    finally:
        store.close()


def test_a_reshard_mid_stream_changes_no_statistic(redis_cluster, redis_cluster_namespace, events):
    """Slots holding three partitions' keys move to another master (IMPORTING/MIGRATING,
    MIGRATE in small batches, as `redis-cli --cluster reshard` does) while every partition
    commits: 0 differences from the offline reference."""
    namespace = redis_cluster_namespace
    store = open_store(redis_cluster.url, namespace)
    moved: list[int] = []

    def reshard() -> None:
        for partition in PARTITIONS[:3]:
            slot = slot_of(namespace, partition)
            source = redis_cluster.master_of(slot)
            target = next(p for p in redis_cluster.slot_owners() if p != source)
            moved.append(redis_cluster.move_slot(slot, target, batch=1, pause_s=0.1))
            assert redis_cluster.master_of(slot) == target

    try:
        committer = commit_while(store, events, reshard)
        assert sum(moved) > 0  # keys were there to move
        expected = expected_snapshot(split(events))
        assert canonical(stored_snapshot(store)) == canonical(expected)
        assert store.load_window(CONFIG).counters.processed == len(events)
        print(f"reshard: {sum(moved)} keys moved; {committer.report()}")
    finally:
        store.close()


def test_a_replica_promotion_mid_stream_changes_no_statistic(
    redis_cluster, redis_cluster_namespace, events
):
    """The replica of the master holding a partition is promoted (CLUSTER FAILOVER) while
    every partition commits: the client follows the new master; 0 differences."""
    namespace = redis_cluster_namespace
    store = open_store(redis_cluster.url, namespace)
    slot = slot_of(namespace, PARTITIONS[0])
    before: dict[str, int] = {}

    def promote() -> None:
        master = redis_cluster.master_of(slot)
        replica = redis_cluster.replica_of(master)
        before["master"], before["replica"] = master, replica
        redis_cluster.promote(replica)

    try:
        committer = commit_while(store, events, promote)
        assert redis_cluster.master_of(slot) == before["replica"]
        expected = expected_snapshot(split(events))
        assert canonical(stored_snapshot(store)) == canonical(expected)
        assert store.load_window(CONFIG).counters.processed == len(events)
        print(f"failover: {committer.report()}")
    finally:
        store.close()


def test_a_master_killed_mid_stream_changes_no_statistic(
    redis_cluster, redis_cluster_namespace, events
):
    """The master holding a partition is killed (SIGKILL) while every partition commits; its
    replica takes over after the cluster's failure detection. Commits to its slots are refused
    meanwhile and retried; one acknowledged but not yet replicated would be lost with the
    master (Redis replicates asynchronously) and found by the offset check. 0 differences."""
    namespace = redis_cluster_namespace
    store = open_store(redis_cluster.url, namespace)
    slot = slot_of(namespace, PARTITIONS[0])
    ports: dict[str, int] = {}

    def kill() -> None:
        ports["killed"] = redis_cluster.master_of(slot)
        ports["new"] = redis_cluster.kill(ports["killed"])

    try:
        committer = commit_while(store, events, kill)
        assert redis_cluster.master_of(slot) == ports["new"] != ports["killed"]
        expected = expected_snapshot(split(events))
        assert canonical(stored_snapshot(store)) == canonical(expected)
        assert store.load_window(CONFIG).counters.processed == len(events)
        print(f"master killed: {committer.report()}")
    finally:
        store.close()
        if "killed" in ports:  # the session's cluster back to a replica per master
            redis_cluster.revive(ports["killed"])


def test_commits_follow_the_replica_that_took_over_with_nothing_else_to_refresh_the_map(
    redis_cluster, redis_cluster_namespace, events
):
    """A partition whose master dies, in a namespace whose other keys live on other masters:
    nothing but the partition's own commits meets the dead node, so they alone must make the
    client read the new slot map. Before, each commit was a new pipeline whose error count
    never reached redis-py's refresh threshold, and every commit was refused for good
    (reproduced: still refused 30 s after the takeover). The delta refused meanwhile is then
    committed as it was."""
    namespace = redis_cluster_namespace
    store = open_store(redis_cluster.url, namespace)
    parts_master = redis_cluster.master_of(key_slot(f"{namespace}:{{{namespace}}}:parts".encode()))
    partition = next(
        p
        for p in (f"t:{n}" for n in range(256))
        if redis_cluster.master_of(slot_of(namespace, p)) != parts_master
    )
    engine = PartitionEngine(CONFIG, partition, None)
    ports: dict[str, int] = {}

    def delta_of(start: int) -> PartitionDelta:
        for offset in range(start, start + 5):
            engine.apply(events[offset], events[offset].intent or "unknown", offset)
        return engine.take_delta()

    try:
        store.commit(delta_of(0))
        ports["killed"] = redis_cluster.master_of(slot_of(namespace, partition))
        # The first commit on the replica before the kill: this test is about the slot map,
        # not about an acknowledged write lost with its master (the offset check's case,
        # test_a_master_killed_mid_stream_changes_no_statistic). A CI run once failed so:
        # "stored offset -1, expected 4".
        redis_cluster.wait_replicated(ports["killed"])
        pending = delta_of(5)
        ports["new"] = redis_cluster.kill(ports["killed"])  # returns once the replica serves

        def committed() -> bool:
            try:
                store.commit(pending)
            except StoreUnavailable:
                return False
            return True

        wait_until(committed, 20, "the refused commit to reach the replica that took over")
        checkpoint = store.load_partition(partition)
        assert checkpoint is not None and checkpoint.offset == 9
        assert redis_cluster.master_of(slot_of(namespace, partition)) == ports["new"]
    finally:
        store.close()
        if "killed" in ports:
            redis_cluster.revive(ports["killed"])


def test_the_cluster_store_is_chosen_by_url(redis_cluster, redis_cluster_namespace) -> None:
    store = open_store(redis_cluster.url, redis_cluster_namespace)
    try:
        assert isinstance(store, RedisClusterStore)
        store.ping()
        assert store.epoch() == store.epoch()
    finally:
        store.close()


def test_a_sentinel_failover_mid_stream_changes_no_statistic(
    redis_sentinel, redis_sentinel_namespace, events
):
    """``redis+sentinel://``: the sentinel fails the master over to its replica while every
    partition commits; the store follows the new master; 0 differences."""
    store = open_store(redis_sentinel.url, redis_sentinel_namespace)
    ports: dict[str, int] = {}

    def failover() -> None:
        ports["before"] = redis_sentinel.master_port()
        ports["after"] = redis_sentinel.failover()

    try:
        committer = commit_while(store, events, failover)
        assert ports["after"] != ports["before"]
        expected = expected_snapshot(split(events))
        assert canonical(stored_snapshot(store)) == canonical(expected)
        assert store.load_window(CONFIG).counters.processed == len(events)
        print(f"sentinel failover: {committer.report()}")
    finally:
        store.close()


@pytest.mark.slow
def test_kvcast_run_on_a_cluster_url_naming_a_node_without_the_slots(
    redis_cluster, redis_cluster_namespace, tmp_path
) -> None:
    """The issue's crash: `kvcast run --store` at a node that does not own the namespace's
    slot died with MovedError. Now the daemon follows the redirections, commits every
    partition and publishes the table, which the store reads back from the cluster."""
    namespace = redis_cluster_namespace
    owner = redis_cluster.master_of(key_slot(namespace.encode()))
    other = next(port for port in redis_cluster.slot_owners() if port != owner)
    log_file = tmp_path / "events.jsonl"
    log_file.write_bytes(b"\n".join(orjson.dumps(
        {"session_id": f"s{n}", "turn": 1, "timestamp": float(n), "input_tokens": 50,
         "output_tokens": 10, "intent": "chitchat"}) for n in range(40)))  # fmt: skip
    daemon = DaemonProcess(
        ["--source", f"file://{log_file}", "--store", f"redis+cluster://127.0.0.1:{other}",
         "--namespace", namespace, "--metrics-addr", "127.0.0.1:0",
         "--refresh-interval", "0.3"],
        tmp_path / "daemon.log",
    )  # fmt: skip
    try:

        def complete() -> bool:
            try:  # 503 until the first table is published
                return daemon.get("/v1/table").get("window_conversations") == 40
            except urllib.error.HTTPError:
                return False

        wait_until(complete, 60, "the table to hold every conversation")
    finally:
        assert daemon.stop(signal.SIGTERM) == 0, daemon.text()
    assert "MovedError" not in daemon.text()
    store = open_store(redis_cluster.url, namespace)
    try:
        assert store.read_table()["window_conversations"] == 40
        assert store.load_window(CONFIG).counters.processed == 40
    finally:
        store.close()


def test_a_cluster_that_does_not_answer_is_unavailable_not_fatal() -> None:
    """Opening the store does not connect; every call until the cluster answers is a
    StoreUnavailable, which the daemon retries (as for one Redis)."""
    with socket.socket() as sock:  # a port nobody listens on: bound, never listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        store = open_store(f"redis+cluster://127.0.0.1:{port}", "ns")
        for call in (store.ping, store.epoch, lambda: store.load_window(CONFIG)):
            with pytest.raises(StoreUnavailable, match="cannot be connected"):
                call()
        store.close()
