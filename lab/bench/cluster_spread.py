"""How a Redis Cluster namespace's commits spread over the masters: the partitions' commit
transactions (EXEC calls, from each master's ``INFO commandstats``) per master.

    python -m kvcast.lab.bench.cluster_spread          # starts 3 masters on loopback ports

The same generated workload (sessions hashed to partitions, as Kafka keys them), each
partition committing every ``commit_every`` events and flushed at the end.
"""

from __future__ import annotations

import argparse
import tempfile
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

from kvcast.daemon.stores import open_store
from kvcast.lab.bench.redis_cluster import LocalRedisCluster
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from kvcast.stats.config import StatsConfig
from kvcast.stats.events import parse_event
from kvcast.stats.partition import PartitionEngine


@dataclass(frozen=True)
class Spread:
    """One row: partitions, commits made, EXEC calls per master port."""

    partitions: int
    commits: int
    execs: dict[int, int]


def _execs(cluster: LocalRedisCluster) -> dict[int, int]:
    calls = {}
    for port in cluster.slot_owners():
        with cluster.client(port) as client:
            stats = client.info("commandstats").get("cmdstat_exec", {})
        calls[port] = int(stats.get("calls", 0))
    return calls


def run_cluster_spread(
    cluster: LocalRedisCluster,
    partitions: tuple[int, ...] = (16, 64),
    conversations: int = 3000,
    commit_every: int = 20,
) -> list[Spread]:
    config = StatsConfig(completion_timeout_s=900)
    trace = generate(preset("mixed"), lambda0=1.0, conversations=conversations, seed=3,
                     prompts=False)  # fmt: skip
    events = [parse_event(raw) for raw in trace.events()]
    rows = []
    for count in partitions:
        store = open_store(cluster.url, f"kvcast-bench-{uuid.uuid4().hex[:8]}")
        try:
            before = _execs(cluster)
            engines: dict[int, PartitionEngine] = {}
            commits = 0
            for offset, event in enumerate(events):
                partition = zlib.crc32(event.session_id.encode()) % count
                engine = engines.setdefault(partition, PartitionEngine(config, f"t:{partition}"))
                engine.apply(event, event.intent or "unknown", offset)
                if engine.pending_events >= commit_every:
                    store.commit(engine.take_delta())
                    commits += 1
            for engine in engines.values():
                engine.flush()
                store.commit(engine.take_delta())
                commits += 1
            after = _execs(cluster)
            rows.append(Spread(count, commits, {p: after[p] - before.get(p, 0) for p in after}))
        finally:
            for key in store.keys_of():  # type: ignore[attr-defined]
                store._client.delete(key)  # type: ignore[attr-defined]
            store.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--conversations", type=int, default=3000)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as directory,
        LocalRedisCluster(Path(directory), masters=3, replicas=0) as cluster,
    ):
        rows = run_cluster_spread(cluster, conversations=args.conversations)
    for row in rows:
        shares = ", ".join(f"{n / row.commits:.0%}" for n in sorted(row.execs.values()))
        print(f"{row.partitions:3d} partitions: {row.commits} commits, per master {shares}")


if __name__ == "__main__":
    main()
