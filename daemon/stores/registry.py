"""The state store for a URL, from a registry keyed by scheme (``memory``, ``redis``, ...)."""

from __future__ import annotations

from collections.abc import Callable

from kvcast.daemon.stores.base import StateStore
from kvcast.stats.store_url import parse


def _memory(url: str, namespace: str) -> StateStore:
    from kvcast.daemon.stores.memory import MemoryStore

    return MemoryStore()


def _redis(url: str, namespace: str) -> StateStore:
    from kvcast.daemon.stores.redis_store import RedisStore

    return RedisStore(url, namespace)


def _redis_cluster(url: str, namespace: str) -> StateStore:
    from kvcast.daemon.stores.redis_cluster import RedisClusterStore

    return RedisClusterStore(url, namespace)


def _redis_sentinel(url: str, namespace: str) -> StateStore:
    from kvcast.daemon.stores.redis_cluster import open_sentinel_store

    return open_sentinel_store(url, namespace)


STORES: dict[str, Callable[[str, str], StateStore]] = {
    "memory": _memory,
    "redis": _redis,
    "rediss": _redis,
    "redis+cluster": _redis_cluster,
    "rediss+cluster": _redis_cluster,
    "redis+sentinel": _redis_sentinel,
    "rediss+sentinel": _redis_sentinel,
}


def open_store(url: str, namespace: str = "kvcast") -> StateStore:
    """The store for ``url``; ValueError saying what is wrong with a URL outside the grammar
    (:mod:`kvcast.stats.store_url`), the password hidden."""
    return STORES[parse(url).scheme](url, namespace)
