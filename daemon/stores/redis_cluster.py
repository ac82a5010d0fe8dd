"""The Redis Cluster and Sentinel state stores (``redis+cluster://``, ``redis+sentinel://``).

**Sentinel** (``redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB]``,
``rediss+sentinel://`` for TLS): the plain :class:`RedisStore` and its layout, on the master
that the sentinels name for SERVICE. After a failover the next connection asks the sentinels
again (redis-py's ``Sentinel.master_for``); a write that reaches the demoted master is refused
(READONLY) and retried like any refused commit, so nothing is applied twice or lost. The URL's
credentials are the data nodes'; the sentinels are asked without AUTH unless the query gives
``sentinel_password`` (and ``sentinel_username``).

**Cluster** (``redis+cluster://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]``, ``rediss+cluster://``
for TLS; any node will do, the rest of the cluster is discovered): redis-py's ``RedisCluster``
follows MOVED/ASK and refreshes its slot map after a failover or a reshard. A namespace in a
cluster uses its own layout: every key a partition's commit touches carries the partition's hash
tag, so the commit stays one MULTI/EXEC in one slot while partitions spread over the shards::

    NAMESPACE:{NAMESPACE:P}:part, :open, :ids, :shared            the checkpoint
    NAMESPACE:{NAMESPACE:P}:buckets, :bucket:I, :delays:I, :sgaps:I the partition's window
    NAMESPACE:{NAMESPACE:P}:arr:starts, ..., :arr:meta, :counters  its share of the counters
    NAMESPACE:{NAMESPACE}:parts, :table, :epoch                    namespace-level keys

Arrival and event counters are kept per partition (one namespace-wide hash would put every
commit in the same slot) and the reader adds them up; ``parts`` (every partition that ever
committed) is written before each commit, outside its transaction (idempotent: a partition
listed without data reads as empty). The layout differs from one server's (``NAMESPACE:
{NAMESPACE}:...``): a deployment moved from one Redis to a cluster starts a new namespace.

Reads: one transaction per partition (a MULTI across slots is illegal), so each partition's
part of the window, counters and newest event time are one consistent snapshot; the listings
before them go through redis-py's cluster pipeline, one round trip per node. redis-py runs one
transaction per cluster pipeline, so the per-partition reads cannot be batched by node.
"""

from __future__ import annotations

import math
import time
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    RedisClusterException,
    SlotNotCoveredError,
    TryAgainError,
    WatchError,
)
from redis.retry import Retry
from redis.sentinel import Sentinel

from kvcast.daemon.stores.base import WindowState
from kvcast.daemon.stores.redis_errors import STORE_ERRORS, unavailable
from kvcast.daemon.stores.redis_records import decode_arrivals, decode_bucket, decode_counters
from kvcast.daemon.stores.redis_store import RedisStore
from kvcast.stats.arrivals import ArrivalStats
from kvcast.stats.config import StatsConfig
from kvcast.stats.engine import EventCounters
from kvcast.stats.partition import PartitionDelta
from kvcast.stats.store_url import (
    CLUSTER,
    SENTINEL,
    StoreURL,
    cluster_partition_key,
    key_prefix,
    parse,
    redact,
)
from kvcast.stats.window import StatsWindow, merge_anchored

# The grammar (schemes, hosts, options) is kvcast.stats.store_url's.
CLUSTER_SCHEMES = CLUSTER
SENTINEL_SCHEMES = SENTINEL
# Cluster-specific refusals: CLUSTERDOWN, no node for a slot, a topology being rebuilt.
_CLUSTER_ERRORS = (*STORE_ERRORS, ClusterError, RedisClusterException)
# Refusals after which nothing was applied and the slot map is (being) updated: MOVED/ASK
# (redis-py records the new owner), TRYAGAIN (keys split by a migration), CLUSTERDOWN and an
# uncovered slot (a failover in progress). Retried at once, a few times, by commits and reads.
_REDIRECTIONS = (AskError, TryAgainError, ClusterDownError, SlotNotCoveredError)
# A read whose partition was committed between its listing and its transaction is redone.
_READ_ATTEMPTS = 20


class _Cluster(RedisCluster):
    """RedisCluster whose transactions redis-py never re-sends by itself: after a lost
    connection it would send the MULTI/EXEC again on a new one, without the WATCH, and a
    commit whose EXEC had been applied would be applied twice. The store retries instead,
    re-checking the partition's offset.

    Each transaction is a new pipeline, whose count of errors starts at 0: with redis-py's
    ``reinitialize_steps`` (5) a transaction's connection error never asked for a new slot
    map, and after a failover every commit to the dead master's slots was refused until
    something else refreshed it (forever, where the namespace's other keys live elsewhere).
    A transaction asks at its first error (``reinitialize_steps`` 1); redis-py runs the
    refresh at the next attempt, at most once a second."""

    def pipeline(self, transaction: bool | None = None, shard_hint: Any = None) -> Any:
        if not transaction:
            return super().pipeline(transaction, shard_hint)
        return ClusterPipeline(
            nodes_manager=self.nodes_manager,
            commands_parser=self.commands_parser,
            startup_nodes=self.nodes_manager.startup_nodes,
            result_callbacks=self.result_callbacks,
            cluster_response_callbacks=self.cluster_response_callbacks,
            read_from_replicas=self.read_from_replicas,
            load_balancing_strategy=self.load_balancing_strategy,
            reinitialize_steps=1,
            retry=Retry(NoBackoff(), 0),
            lock=self._lock,
            transaction=True,
            event_dispatcher=self._event_dispatcher,
        )


def _redacted(url: str) -> str:
    """``url`` without its secrets, for messages."""
    return redact(url)


def _parse(url: str, schemes: tuple[str, ...]) -> StoreURL:
    parsed = parse(url)
    if parsed.scheme not in schemes:
        raise ValueError(f"store URL {redact(url)!r}: not a {schemes[0]}:// URL")
    return parsed


def parse_nodes(
    url: str,
) -> tuple[dict[str, Any], list[tuple[str, int]], list[str], dict[str, str]]:
    """Split a cluster or sentinel URL: (connection options, [(host, port)], path segments,
    query options), as :mod:`kvcast.stats.store_url` reads it; ValueError saying what is
    wrong, the password never quoted."""
    parsed = _parse(url, CLUSTER + SENTINEL)
    options: dict[str, Any] = {**parsed.credentials(), **({"ssl": True} if parsed.tls else {})}
    segments = [] if parsed.service is None else [parsed.service, str(parsed.db)]
    return options, list(parsed.hosts), segments, dict(parsed.options)


class RedisClusterStore(RedisStore):
    """:class:`StateStore` on a Redis Cluster, partitions spread over its shards (see the
    module docstring for the layout)."""

    _parts_in_commit = False
    _commit_attempts = 20
    _retry_now = _REDIRECTIONS
    _errors = _CLUSTER_ERRORS

    def __init__(self, url: str, namespace: str = "kvcast", timeout_s: float = 5.0) -> None:
        parsed = _parse(url, CLUSTER)
        shown = parsed.redacted()
        self._cluster: _Cluster | None = None
        self._settings: dict[str, Any] = {
            "startup_nodes": [ClusterNode(host, port) for host, port in parsed.hosts],
            "socket_timeout": timeout_s,
            "socket_connect_timeout": timeout_s,
            **parsed.credentials(),
            **parsed.tls_kwargs(),
        }
        super().__init__(shown, namespace, timeout_s, client=self)

    @property  # type: ignore[override]
    def _client(self) -> _Cluster:
        """The cluster client, made on first use: RedisCluster reads the slot map when made,
        and a cluster that does not answer yet must be a StoreUnavailable to retry (raised by
        the caller's error handling), as for one Redis, not a daemon that cannot start."""
        if self._cluster is None:
            self._cluster = _Cluster(**self._settings)
        return self._cluster

    @_client.setter
    def _client(self, value: Any) -> None:
        if value is not self:  # the base class's assignment of the placeholder
            self._cluster = value

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()

    def part_key(self, name: str, partition: str, *rest: object) -> str:
        """``NAMESPACE:{NAMESPACE:P}:name:rest``: the partition's own slot."""
        return cluster_partition_key(self.namespace, partition, name, *rest)

    def sum_key(self, partition: str, *parts: object) -> str:
        """The partition's own share of a namespace-wide counter, in the partition's slot."""
        return self.part_key(str(parts[0]), partition, *parts[1:])

    def _before_commit(self, delta: PartitionDelta) -> None:
        # The readers find the partition's keys through ``parts``: listed before its first
        # data exists, never after (a listed partition without data reads as empty).
        try:
            self._client.sadd(self.key("parts"), delta.partition)
        except self._errors as exc:
            raise unavailable(exc) from None

    def _partitions(self) -> list[str]:
        return sorted(p.decode() for p in self._client.smembers(self.key("parts")))

    def load_window(self, config: StatsConfig) -> WindowState:
        try:
            parts = self._partitions()
            pipe = self._client.pipeline(transaction=False)  # grouped by node by redis-py
            for part in parts:
                pipe.zrange(self.part_key("buckets", part), 0, -1)
            listed = pipe.execute() if parts else []
            shares = [self._read_partition(part, [int(i) for i in indices])
                      for part, indices in zip(parts, listed, strict=True)]  # fmt: skip
        except self._errors as exc:
            raise unavailable(exc) from None
        windows = []
        arrivals = ArrivalStats(config.rate_window_s)
        counters = EventCounters()
        newest = -math.inf
        anchors = {}
        for part, (indices, newest_ts, fetched, sums) in zip(parts, shares, strict=True):
            own = StatsWindow(config)
            batches = iter(fetched)
            for index in indices:
                own.buckets[index] = decode_bucket(next(batches), next(batches), next(batches))
            anchors[part] = float(newest_ts) if newest_ts is not None else -math.inf
            windows.append((own, anchors[part]))
            starts, cached, inputs, meta, events = sums
            arrivals.merge(decode_arrivals(config.rate_window_s, starts, cached, inputs, meta))
            _add_counters(counters, decode_counters(events))
            newest = max(newest, float(meta.get(b"newest_ts", -math.inf)))
        return WindowState(
            window=merge_anchored(windows, config),
            arrivals=arrivals,
            counters=counters,
            newest_event_time=newest,
            partition_newest=anchors,
        )

    def _read_partition(self, part: str, indices: list[int]) -> tuple[Any, ...]:
        """One partition's window, counters and newest event time in one transaction (its
        slot): (bucket indices, newest_ts, [hash, delays, gaps per bucket], counter hashes).
        Bucket indices listed before the transaction are checked in it: a commit in between
        that added a bucket makes the read start again with the new listing."""
        for _ in range(_READ_ATTEMPTS):
            pipe = self._client.pipeline(transaction=True)
            pipe.zrange(self.part_key("buckets", part), 0, -1)
            pipe.hget(self.part_key("part", part), "newest_ts")
            for index in indices:
                pipe.hgetall(self.part_key("bucket", part, index))
                pipe.lrange(self.part_key("delays", part, index), 0, -1)
                pipe.lrange(self.part_key("sgaps", part, index), 0, -1)
            for name in ("starts", "cached_tokens", "input_tokens", "meta"):
                pipe.hgetall(self.part_key("arr", part, name))
            pipe.hgetall(self.part_key("counters", part))
            try:
                results = pipe.execute()
            except (WatchError, *_REDIRECTIONS):  # the slot moved: read it again
                time.sleep(0.02)
                continue
            now = [int(i) for i in results[0]]
            if now == indices:
                return indices, results[1], results[2:-5], results[-5:]
            indices = now
        raise unavailable(RuntimeError(f"partition {part} kept changing during its read"))

    def expire(self, bucket_before: int, second_before: int) -> int:
        try:
            parts = self._partitions()
            if not parts:
                return 0
            pipe = self._client.pipeline(transaction=False)
            for part in parts:
                pipe.zrangebyscore(self.part_key("buckets", part), "-inf", f"({bucket_before}")
                for name in ("starts", "cached_tokens", "input_tokens"):
                    pipe.hkeys(self.part_key("arr", part, name))
            listed = iter(pipe.execute())
            deleted = 0
            for part in parts:
                stale = [int(i) for i in next(listed)]
                old_fields = [[f for f in next(listed) if int(f) < second_before]
                              for _ in range(3)]  # fmt: skip
                if not stale and not any(old_fields):
                    continue
                pipe = self._client.pipeline(transaction=True)  # the partition's slot
                if stale:
                    pipe.zrem(self.part_key("buckets", part), *[str(i) for i in stale])
                    for name in ("bucket", "delays", "sgaps"):
                        pipe.delete(*[self.part_key(name, part, i) for i in stale])
                for name, fields in zip(("starts", "cached_tokens", "input_tokens"), old_fields,
                                        strict=True):  # fmt: skip
                    if fields:
                        pipe.hdel(self.part_key("arr", part, name), *fields)
                pipe.execute()
                deleted += len(stale)
        except self._errors as exc:
            raise unavailable(exc) from None
        return deleted

    def keys_of(self, partition: str | None = None) -> list[str]:
        """Every key of this namespace (or of one partition) on every master: for tests and
        clean-up. SCAN, never KEYS."""
        # The layout's own spelling, cut before the tag closes (all partitions) or after it.
        tag = (
            key_prefix(self.namespace)[:-2]
            if partition is None
            else cluster_partition_key(self.namespace, partition, "")[:-1]
        )
        found: set[str] = set()
        for node in self._client.get_primaries():
            client = self._client.get_redis_connection(node)
            found.update(k.decode() for k in client.scan_iter(match=f"{_glob(tag)}*"))
        return sorted(found)


def _glob(text: str) -> str:
    """``text`` with the glob characters of a SCAN pattern escaped."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _add_counters(total: EventCounters, share: EventCounters) -> None:
    total.processed += share.processed
    total.duplicates += share.duplicates
    for reason, amount in share.rejected.items():
        total.rejected[reason] = total.rejected.get(reason, 0) + amount


def sentinel_master(url: str, timeout_s: float = 5.0) -> tuple[redis.Redis, str]:
    """(redis-py client of the master the sentinels name, the URL redacted), as the grammar
    reads the URL: its DB, the data nodes' credentials and TLS, the sentinels' own
    ``sentinel_*`` credentials."""
    parsed = _parse(url, SENTINEL)
    tls = parsed.tls_kwargs()
    sentinel = Sentinel(
        list(parsed.hosts),
        sentinel_kwargs={
            "socket_timeout": timeout_s,
            "socket_connect_timeout": timeout_s,
            **tls,
            **parsed.sentinel_kwargs(),
        },
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        db=parsed.db,
        **parsed.credentials(),
        **tls,
    )
    return sentinel.master_for(parsed.service or ""), parsed.redacted()


def open_sentinel_store(url: str, namespace: str = "kvcast", timeout_s: float = 5.0) -> RedisStore:
    """The plain :class:`RedisStore` on the master the sentinels name (module docstring)."""
    client, shown = sentinel_master(url, timeout_s)
    return RedisStore(shown, namespace, timeout_s, client=client)
