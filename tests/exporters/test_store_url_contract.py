"""The URL contract: the daemon's store and an engine's TableClient given the SAME store URL
meet on the same key, on a real Redis (a non-zero DB), a real Redis Cluster and a real
Sentinel (a non-zero DB). Before one grammar, the engine's reader kept only the sentinel's
service name and read db 0 while the daemon wrote the DB named: the engine never saw a table.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from kvcast.daemon.stores.registry import open_store
from kvcast.exporters.kit.client import TableClient
from kvcast.stats.store_url import parse, table_key
from tests import services

pytestmark = pytest.mark.integration

DB = 3  # any DB but 0: the old engine-side reader fell back to 0


def doc(version: int) -> dict[str, Any]:
    """A one-row table whose version the engine must read back."""
    row = {"intent": "coding", "turn": 1, "p_continue": 0.42, "median_reuse_s": 60.0,
           "mu": None, "sigma": None, "conversations": version, "delay_samples": 0}  # fmt: skip
    return {"version": version, "generated_at": float(version), "window_conversations": 1,
            "defaults": {"p_continue": 0.5, "median_reuse_s": 150.0}, "states": [row]}  # fmt: skip


def meet(url: str, namespace: str) -> None:
    """The daemon publishes through ``open_store(url)``; an engine's client on ``url`` loads
    exactly that table."""
    store = open_store(url, namespace)
    try:
        store.publish_table(doc(7))
        client = TableClient(url, namespace=namespace, refresh_s=60, timeout_s=5.0)
        try:
            assert client.refresh(), client.last_error
            assert client.version == 7 and client.index.document == store.read_table()
        finally:
            client.close()
    finally:
        store.close()


def test_a_single_redis_with_a_non_zero_db(redis_url: str) -> None:
    import redis

    parts = urlsplit(redis_url)
    url = urlunsplit(parts._replace(path=f"/{DB}"))
    namespace = services.unique_name("kvcast-test")
    named = redis.Redis(**_where(url), db=DB)
    zero = redis.Redis(**_where(url), db=0)
    try:
        meet(url, namespace)
        assert named.exists(table_key(namespace)) and not zero.exists(table_key(namespace))
    finally:
        named.delete(table_key(namespace))
        named.close()
        zero.close()


def test_a_redis_cluster(redis_cluster: Any, redis_cluster_namespace: str) -> None:
    meet(redis_cluster.url, redis_cluster_namespace)


def test_a_sentinel_with_a_non_zero_db(redis_sentinel: Any, redis_sentinel_namespace: str) -> None:
    import redis

    url = f"{redis_sentinel.url}/{DB}"
    master = redis.Redis(host="127.0.0.1", port=redis_sentinel.master_port(), db=DB)
    try:
        meet(url, redis_sentinel_namespace)
        assert master.exists(table_key(redis_sentinel_namespace))
    finally:
        master.delete(table_key(redis_sentinel_namespace))
        master.close()


def _where(url: str) -> dict[str, Any]:
    parsed = parse(url)
    ((host, port),) = parsed.hosts
    return {"host": host, "port": port, **parsed.credentials()}
