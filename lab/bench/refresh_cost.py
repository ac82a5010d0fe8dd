"""What a refresh costs as partitions grow: each partition's window is stored apart (and cut at
its own age limit), so the refresher reads partitions x buckets hashes from Redis.

    python -m kvcast.lab.bench.refresh_cost --redis redis://127.0.0.1:6379 [--local-cluster]

``--cluster URL`` (or ``--local-cluster``: 3 masters started here on loopback ports) adds the
same rows for the Redis Cluster layout (``redis+cluster://``: each partition in its own slot,
read in one transaction per partition, counters summed over partitions).

The same generated workload (sessions hashed to partitions, as Kafka keys them), committed
complete, then ``load_window`` and the refresh's computation timed, best of ``repeats``; the
1-partition row is the baseline (one window, as before per-partition windows). Keys go under
a fresh namespace, deleted afterwards.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
import zlib
from dataclasses import dataclass

from kvcast.daemon.refresh import compute_refresh
from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.stores import open_store
from kvcast.daemon.stores.redis_cluster import RedisClusterStore
from kvcast.daemon.stores.redis_store import RedisStore
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from kvcast.stats.config import StatsConfig
from kvcast.stats.events import parse_event
from kvcast.stats.partition import PartitionEngine


@dataclass(frozen=True)
class RefreshCost:
    """One row: store layout (``redis``, ``cluster``), partitions, buckets in the merged
    window, seconds to read and to compute."""

    store: str
    partitions: int
    buckets: int
    load_s: float
    compute_s: float


def run_refresh_cost(
    redis_url: str,
    partitions: tuple[int, ...] = (1, 16, 64),
    conversations: int = 10_000,
    repeats: int = 5,
    cluster_url: str | None = None,
) -> list[RefreshCost]:
    """Rows for one Redis at ``redis_url`` (None: none) and, with ``cluster_url``, a cluster."""
    config = StatsConfig(completion_timeout_s=900)
    settings = DaemonSettings(stats=config, capacity_blocks=3000)
    trace = generate(preset("mixed"), lambda0=1.0, conversations=conversations, seed=3,
                     prompts=False)  # fmt: skip
    events = [parse_event(raw) for raw in trace.events()]
    rows = []
    targets = [("redis", url) for url in (redis_url,) if url]
    targets += [("cluster", url) for url in (cluster_url,) if url]
    for (layout, url), count in ((t, c) for t in targets for c in partitions):
        store = open_store(url, f"kvcast-bench-{uuid.uuid4().hex[:8]}")
        try:
            engines: dict[int, PartitionEngine] = {}
            for offset, event in enumerate(events):
                partition = zlib.crc32(event.session_id.encode()) % count
                engine = engines.setdefault(partition, PartitionEngine(config, f"t:{partition}"))
                engine.apply(event, event.intent or "unknown", offset)
            for engine in engines.values():
                engine.flush()
                store.commit(engine.take_delta())
            load_s = compute_s = float("inf")
            for _ in range(repeats):
                started = time.perf_counter()
                state = store.load_window(config)
                load_s = min(load_s, time.perf_counter() - started)
                started = time.perf_counter()
                compute_refresh(state, settings, 1)
                compute_s = min(compute_s, time.perf_counter() - started)
            rows.append(RefreshCost(layout, count, len(state.window.buckets), load_s, compute_s))
        finally:
            _delete_namespace(store)
            store.close()
    return rows


def _delete_namespace(store) -> None:
    """Delete the benchmark's keys (SCAN; on a cluster, on every master, one key at a time)."""
    if isinstance(store, RedisClusterStore):
        for key in store.keys_of():
            store._client.delete(key)
    elif isinstance(store, RedisStore):
        for key in store._client.scan_iter(f"{store.namespace}*"):
            store._client.delete(key)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis", default="redis://127.0.0.1:6379")
    parser.add_argument("--conversations", type=int, default=10_000)
    parser.add_argument("--cluster", help="a redis+cluster:// URL: add its rows")
    parser.add_argument("--local-cluster", action="store_true",
                        help="start a 3-master cluster on loopback ports for the rows")  # fmt: skip
    args = parser.parse_args()
    if args.local_cluster:
        from pathlib import Path

        from kvcast.lab.bench.redis_cluster import LocalRedisCluster

        with (
            tempfile.TemporaryDirectory() as directory,
            LocalRedisCluster(Path(directory), masters=3, replicas=0) as cluster,
        ):
            rows = run_refresh_cost(args.redis, conversations=args.conversations,
                                    cluster_url=cluster.url)  # fmt: skip
    else:
        rows = run_refresh_cost(args.redis, conversations=args.conversations,
                                cluster_url=args.cluster)  # fmt: skip
    base = rows[0].load_s
    for row in rows:
        print(f"{row.store:7s} {row.partitions:3d} partitions: {row.buckets} buckets, load_window "
              f"{row.load_s * 1e3:.1f} ms ({row.load_s / base:.1f}x), refresh computation "
              f"{row.compute_s * 1e3:.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
