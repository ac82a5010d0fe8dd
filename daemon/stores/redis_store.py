"""The Redis state store: statistics shared by every daemon instance of a namespace.

This is the layout of one Redis server (``redis://``, ``rediss://``) and of the master behind
Sentinel (``redis+sentinel://``, the same keys). A Redis Cluster (``redis+cluster://``) uses
its own, with a hash tag per partition so that partitions spread over the shards
(:mod:`kvcast.daemon.stores.redis_cluster`); the two do not read each other's keys, so moving
a deployment from one server to a cluster starts a new namespace.

Keys all start with ``NAMESPACE:{NAMESPACE}:`` (a literal prefix for ACLs, and one hash tag:
the whole namespace in one slot). Layout:

- ``part:P`` hash (offset, newest_ts), ``open:P`` hash (session -> open conversation),
  ``ids:P`` hash (request id -> event time), ``shared:P`` hash (shared block id as JSON ->
  its last reference, event time): partition P's checkpoint;
- ``parts`` set of the partitions with window buckets; per partition P, ``buckets:P`` sorted
  set of its bucket indices, ``bucket:P:I`` hash of counts and sums, ``delays:P:I`` list of
  delay-sample batches and ``sgaps:P:I`` list of shared-block gap batches: its window,
  additive across its owners over time. The window read is
  every partition's cut at its own age limit (``part:P`` newest_ts), then merged. (Before
  version 0.2 the buckets were one window for all partitions: ``buckets``, ``bucket:I``,
  ``delays:I``; such keys are still read, anchored at the newest event time of all, and
  expired as usual.)
- ``arr:starts``, ``arr:cached``, ``arr:input`` hashes per event-time second and ``arr:meta``
  (first/newest start, start count): the arrival counters;
- ``counters`` hash: events processed, duplicates, rejected by reason;
- ``table``: the published priority table (one SET, so readers never see half of it);
- ``epoch``: a random id made by the first instance that finds none; a Redis that lost its data
  lost it too, so every instance sees a new one and reloads its partitions.

A commit is one MULTI/EXEC guarded by WATCH on ``part:P``: applied whole, or not at all.
Keys are named by :meth:`RedisStore.key` (namespace-level), :meth:`RedisStore.part_key` (a
partition's) and :meth:`RedisStore.sum_key` (the counters every partition adds into), which
the cluster layout overrides.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson
import redis
from redis.exceptions import WatchError

from kvcast.daemon.stores.base import StaleOwner, WindowState
from kvcast.daemon.stores.redis_errors import STORE_ERRORS, unavailable
from kvcast.daemon.stores.redis_records import (
    arrival_sums,
    bucket_sums,
    counter_sums,
    decode_arrivals,
    decode_bucket,
    decode_counters,
    delays_batch,
    gaps_batch,
)
from kvcast.stats.arrivals import ArrivalStats
from kvcast.stats.config import StatsConfig
from kvcast.stats.partition import PartitionCheckpoint, PartitionDelta
from kvcast.stats.store_url import key_prefix, parse, table_key
from kvcast.stats.window import (
    Bucket,
    StatsWindow,
    merge_anchored,
)

# Keep the smaller (ARGV[3] == "min") or larger value of a hash field; floats as text.
_KEEP_EXTREME = """
local current = redis.call('HGET', KEYS[1], ARGV[1])
local value = tonumber(ARGV[2])
if current == false
   or (ARGV[3] == 'min' and value < tonumber(current))
   or (ARGV[3] == 'max' and value > tonumber(current)) then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
return 0
"""

# HINCRBY into several hashes in one script call: for each KEYS[k], ARGV holds the number n of
# its pairs, then n (field, amount) pairs. One call per commit (a commit touches thousands of
# fields in dozens of hashes) instead of one per hash: the server's time per commit -13 %,
# the commit's -1 to -10 % (docs/performance.md).
_HINCRBY_HASHES = """
local at = 1
for k = 1, #KEYS do
  local last = at + 2 * tonumber(ARGV[at])
  for i = at + 1, last, 2 do
    redis.call('HINCRBY', KEYS[k], ARGV[i], ARGV[i + 1])
  end
  at = last + 1
end
return 0
"""


class _Increments:
    """The HINCRBYs of one commit, queued as a single script call by :meth:`queue`."""

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.args: list[Any] = []

    def add(self, key: str, pairs: list[Any]) -> None:
        """HINCRBY each (field, amount) pair of ``pairs`` (flat) into the hash ``key``."""
        if pairs:
            self.keys.append(key)
            self.args.append(len(pairs) // 2)
            self.args += pairs

    def queue(self, pipe: Any) -> None:
        if self.keys:
            pipe.execute_command("EVAL", _HINCRBY_HASHES, len(self.keys), *self.keys, *self.args)


class RedisStore:
    """:class:`StateStore` on a Redis server (``redis://`` or ``rediss://`` URL, AUTH in it)."""

    # Whether the commit itself adds its partition to ``parts`` (inside the transaction, when it
    # has buckets): true for one server; the cluster layout does it before, in another slot.
    _parts_in_commit = True
    # Attempts of a commit, when its WATCH fired (on a cluster: its slot moved while watched;
    # the next attempt finds the offset changed if someone did commit) or the server refused
    # it with one of ``_retry_now`` (a redirection: nothing applied). One server: one attempt,
    # a fired WATCH is a concurrent owner.
    _commit_attempts = 1
    _retry_now: tuple[type[BaseException], ...] = ()
    # What is reported as StoreUnavailable (retried with backoff by the daemon).
    _errors: tuple[type[BaseException], ...] = STORE_ERRORS

    def __init__(
        self,
        url: str,
        namespace: str = "kvcast",
        timeout_s: float = 5.0,
        client: Any | None = None,
    ) -> None:
        """``client``: an already configured redis-py client (Sentinel's master) instead of
        one made from ``url`` (then only named in messages)."""
        if client is None:  # the URL as the grammar reads it (kvcast.stats.store_url)
            parsed = parse(url)
            if parsed.kind != "redis":
                raise ValueError(f"store URL {parsed.redacted()!r}: not a redis[s]:// URL")
            ((host, port),) = parsed.hosts
            connection: dict[str, Any] = {**parsed.credentials(), **parsed.tls_kwargs()}
            if connection.pop("ssl", False):
                connection["connection_class"] = redis.SSLConnection
            # A pool as redis-py's from_url makes it: no retry of its own (the daemon's
            # backoff retries a StoreUnavailable).
            pool = redis.ConnectionPool(
                host=host,
                port=port,
                db=parsed.db,
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
                **connection,
            )
            client = redis.Redis(connection_pool=pool)
        self._client = client
        self.namespace = namespace
        self.prefix = key_prefix(namespace)

    def key(self, *parts: object) -> str:
        """A namespace-level key: ``parts`` joined by ``:`` after the namespace's prefix."""
        return self.prefix + ":".join(str(p) for p in parts)

    def part_key(self, name: str, partition: str, *rest: object) -> str:
        """A key of partition ``partition`` (its checkpoint, its window): here ``name:P:rest``
        under the namespace's one hash tag."""
        return self.key(name, partition, *rest)

    def sum_key(self, partition: str, *parts: object) -> str:
        """A key of the counters every partition adds into (arrivals, events): here one for
        the whole namespace; the cluster layout keeps one per partition."""
        return self.key(*parts)

    def ping(self) -> None:
        try:
            self._client.ping()
        except self._errors as exc:
            raise unavailable(exc) from None

    def epoch(self) -> str:
        """The ``epoch`` key, created (a random id) by the first instance that finds none: a
        Redis that lost its data has lost this key too, and the next reader makes a new one."""
        key = self.key("epoch")

        def read() -> bytes:
            value = self._client.get(key)  # a read: answered even by a full Redis
            if value is None:  # SET NX: idempotent, so a retried attempt is harmless
                pipe = self._client.pipeline(transaction=True)
                pipe.set(key, uuid.uuid4().hex, nx=True)
                pipe.get(key)
                _, value = pipe.execute()
            return value

        return self._retrying(read).decode()

    def _retrying(self, read: Callable[[], Any]) -> Any:
        """``read()``, again after a short pause when refused with one of ``_retry_now``
        (at most ``_commit_attempts`` times); any store error as StoreUnavailable."""
        for attempt in range(1, self._commit_attempts + 1):
            try:
                return read()
            except (WatchError, *self._retry_now) as exc:  # a slot moved: nothing was read
                if attempt == self._commit_attempts:
                    raise unavailable(exc) from None
                time.sleep(min(0.5, 0.02 * attempt))
            except self._errors as exc:
                raise unavailable(exc) from None
        raise AssertionError("unreachable")

    def load_partition(self, partition: str) -> PartitionCheckpoint | None:
        def read() -> list[Any]:
            pipe = self._client.pipeline(transaction=True)
            pipe.hgetall(self.part_key("part", partition))
            pipe.hgetall(self.part_key("open", partition))
            pipe.hgetall(self.part_key("ids", partition))
            pipe.hgetall(self.part_key("shared", partition))
            return pipe.execute()

        meta, conversations, ids, shared = self._retrying(read)
        if not meta:
            return None
        return PartitionCheckpoint(
            offset=int(meta[b"offset"]),
            newest_ts=float(meta[b"newest_ts"]),
            conversations={k.decode(): v for k, v in conversations.items()},
            seen_ids={k.decode(): float(v) for k, v in ids.items()},
            shared_blocks={orjson.loads(k): float(v) for k, v in shared.items()},
        )

    def commit(self, delta: PartitionDelta) -> None:
        self._before_commit(delta)
        for attempt in range(1, self._commit_attempts + 1):
            try:
                self._commit_once(delta)
                return
            except WatchError as exc:
                if self._commit_attempts == 1:  # one server: only a commit fires the WATCH
                    raise StaleOwner(
                        f"partition {delta.partition} was committed concurrently"
                    ) from None
                # On a cluster a moving slot fires it too; a concurrent owner's commit shows
                # at the next attempt's offset check (StaleOwner). Still moving: retry later.
                if attempt == self._commit_attempts:
                    raise unavailable(exc) from None
                time.sleep(min(0.5, 0.02 * attempt))
            except self._retry_now as exc:  # refused before anything was applied
                if attempt == self._commit_attempts:
                    raise unavailable(exc) from None
                time.sleep(min(0.5, 0.02 * attempt))
            except self._errors as exc:
                raise unavailable(exc) from None

    def _before_commit(self, delta: PartitionDelta) -> None:
        """What a commit writes outside its transaction, first (idempotent): nothing here."""

    def _commit_once(self, delta: PartitionDelta) -> None:
        """One WATCH/MULTI/EXEC; WatchError when ``part:P`` changed (or, on a cluster, its
        slot moved) in between, StaleOwner when the stored offset is not the delta's base."""
        part_key = self.part_key("part", delta.partition)
        with self._client.pipeline(transaction=True) as pipe:
            pipe.watch(part_key)
            stored = pipe.hget(part_key, "offset")
            stored_offset = int(stored) if stored is not None else -1
            if stored_offset != delta.base_offset:
                raise StaleOwner(
                    f"partition {delta.partition}: stored offset {stored_offset},"
                    f" expected {delta.base_offset}",
                    stored_offset,
                )
            pipe.multi()
            self._queue_delta(pipe, delta)
            pipe.execute()

    def _queue_delta(self, pipe: Any, delta: PartitionDelta) -> None:
        part = delta.partition
        pipe.hset(
            self.part_key("part", part),
            mapping={"offset": delta.offset, "newest_ts": repr(delta.newest_ts)},
        )
        if delta.upserts:
            pipe.hset(self.part_key("open", part), mapping=delta.upserts)
        if delta.removals:
            pipe.hdel(self.part_key("open", part), *delta.removals)
        if delta.ids_added:
            pipe.hset(
                self.part_key("ids", part),
                mapping={k: repr(v) for k, v in delta.ids_added.items()},
            )
        if delta.ids_removed:
            pipe.hdel(self.part_key("ids", part), *delta.ids_removed)
        if delta.shared_upserts:
            pipe.hset(
                self.part_key("shared", part),
                mapping={orjson.dumps(k): repr(v) for k, v in delta.shared_upserts.items()},
            )
        if delta.shared_removals:
            pipe.hdel(
                self.part_key("shared", part), *[orjson.dumps(k) for k in delta.shared_removals]
            )
        # EVAL by name: redis-py's cluster pipeline has no eval(); the command is the same.
        pipe.execute_command(
            "EVAL", _KEEP_EXTREME, 1, self.sum_key(part, "arr", "meta"), "newest_ts",
            repr(delta.newest_ts), "max",
        )  # fmt: skip
        increments = _Increments()
        if delta.buckets and self._parts_in_commit:
            pipe.sadd(self.key("parts"), part)
        for index, bucket in delta.buckets.items():
            self._queue_bucket(pipe, increments, part, index, bucket)
        self._queue_arrivals(pipe, increments, part, delta.arrivals)
        increments.add(self.sum_key(part, "counters"), counter_sums(delta.counters))
        increments.queue(pipe)

    def _queue_bucket(
        self, pipe: Any, increments: _Increments, part: str, index: int, bucket: Bucket
    ) -> None:
        pipe.zadd(self.part_key("buckets", part), {str(index): index})
        increments.add(self.part_key("bucket", part, index), bucket_sums(bucket))
        if bucket.delays:
            pipe.rpush(self.part_key("delays", part, index), delays_batch(bucket))
        if bucket.shared_gaps:
            pipe.rpush(self.part_key("sgaps", part, index), gaps_batch(bucket))

    def _queue_arrivals(
        self, pipe: Any, increments: _Increments, part: str, arrivals: ArrivalStats
    ) -> None:
        for name, pairs in arrival_sums(arrivals).items():
            increments.add(self.sum_key(part, "arr", name), pairs)
        if arrivals.start_count:
            meta = self.sum_key(part, "arr", "meta")
            increments.add(meta, ["start_count", arrivals.start_count])
            pipe.execute_command(
                "EVAL", _KEEP_EXTREME, 1, meta, "first_start", repr(arrivals.first_start), "min"
            )
            pipe.execute_command(
                "EVAL", _KEEP_EXTREME, 1, meta, "newest_start", repr(arrivals.newest_start), "max"
            )

    def load_window(self, config: StatsConfig) -> WindowState:
        try:
            parts = sorted(p.decode() for p in self._client.smembers(self.key("parts")))
            pipe = self._client.pipeline(transaction=False)
            for part in parts:
                pipe.zrange(self.key("buckets", part), 0, -1)
                pipe.hget(self.part_key("part", part), "newest_ts")
            pipe.zrange(self.key("buckets"), 0, -1)  # the window as one before 0.2
            listed = pipe.execute()
            owners = [(part, [int(i) for i in listed[2 * n]], listed[2 * n + 1])
                      for n, part in enumerate(parts)]  # fmt: skip
            legacy = [int(i) for i in listed[-1]]
            pipe = self._client.pipeline(transaction=True)
            for part, indices, _ in owners:
                for index in indices:
                    pipe.hgetall(self.key("bucket", part, index))
                    pipe.lrange(self.key("delays", part, index), 0, -1)
                    pipe.lrange(self.key("sgaps", part, index), 0, -1)
            for index in legacy:
                pipe.hgetall(self.key("bucket", index))
                pipe.lrange(self.key("delays", index), 0, -1)
            for name in ("starts", "cached_tokens", "input_tokens", "meta"):
                pipe.hgetall(self.key("arr", name))
            pipe.hgetall(self.key("counters"))
            results = pipe.execute()
        except self._errors as exc:
            raise unavailable(exc) from None
        starts, cached, inputs, meta, counters = results[-5:]
        newest = float(meta.get(b"newest_ts", -math.inf))
        fetched = iter(results[:-5])
        partitions = []
        anchors = {}
        for part, indices, newest_ts in owners:
            own = StatsWindow(config)
            for index in indices:
                own.buckets[index] = decode_bucket(next(fetched), next(fetched), next(fetched))
            anchors[part] = float(newest_ts) if newest_ts is not None else -math.inf
            partitions.append((own, anchors[part]))
        if legacy:
            old = StatsWindow(config)
            for index in legacy:
                old.buckets[index] = decode_bucket(next(fetched), next(fetched))
            partitions.append((old, newest))
        return WindowState(
            window=merge_anchored(partitions, config),
            arrivals=decode_arrivals(config.rate_window_s, starts, cached, inputs, meta),
            counters=decode_counters(counters),
            newest_event_time=newest,
            partition_newest=anchors,
        )

    def expire(self, bucket_before: int, second_before: int) -> int:
        try:
            parts = sorted(p.decode() for p in self._client.smembers(self.key("parts")))
            owners = [(self.key("buckets", part), part) for part in parts]
            owners.append((self.key("buckets"), None))  # the window as one before 0.2
            pipe = self._client.pipeline(transaction=False)
            for zset, _ in owners:
                pipe.zrangebyscore(zset, "-inf", f"({bucket_before}")
            stale_lists = pipe.execute()
            pipe = self._client.pipeline(transaction=True)
            deleted = 0
            for (zset, part), stale in zip(owners, stale_lists, strict=True):
                if not stale:
                    continue
                indices = [int(i) for i in stale]
                where = () if part is None else (part,)
                pipe.zrem(zset, *[str(i) for i in indices])
                pipe.delete(*[self.key("bucket", *where, i) for i in indices])
                pipe.delete(*[self.key("delays", *where, i) for i in indices])
                pipe.delete(*[self.key("sgaps", *where, i) for i in indices])
                deleted += len(indices)
            for name in ("starts", "cached_tokens", "input_tokens"):
                key = self.key("arr", name)
                old = [f for f in self._client.hkeys(key) if int(f) < second_before]
                if old:
                    pipe.hdel(key, *old)
            pipe.execute()
        except self._errors as exc:
            raise unavailable(exc) from None
        return deleted

    def publish_table(self, document: dict[str, Any]) -> None:
        try:
            self._client.set(table_key(self.namespace), orjson.dumps(document))
        except self._errors as exc:
            raise unavailable(exc) from None

    def read_table(self) -> dict[str, Any] | None:
        try:
            raw = self._client.get(table_key(self.namespace))
        except self._errors as exc:
            raise unavailable(exc) from None
        return None if raw is None else orjson.loads(raw)

    def close(self) -> None:
        self._client.close()
