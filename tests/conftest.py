"""Shared fixtures. Service fixtures (Redis, Kafka) are for tests marked `integration`.

A service that does not answer fails the test when CI is set, else skips it, with a message
naming the service and how to start it (`scripts/services.sh start`; `make test` does it).

    @pytest.mark.integration
    def test_x(redis_client, redis_namespace, kafka_bootstrap, kafka_topic): ...

    @pytest.mark.parametrize("kafka_topic", [8], indirect=True)   # partitions, default 4
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from kvcast.lab.bench.processes import OwnRedis, free_port, wait_until
from tests import services
from tests.reliability.tally import TALLY
from tests.services import listening, missing, tansu_binary

# No per-example deadline: a deadline is a timing assertion, and on a loaded 2-core CI machine
# an example of microseconds can take 200 ms (Hypothesis then fails the test as flaky).
settings.register_profile("kvcast", deadline=None)
settings.load_profile("kvcast")

SERVICE_FIXTURES = {
    "redis_url",
    "redis_client",
    "redis_namespace",
    "kafka_bootstrap",
    "kafka_admin",
    "kafka_topic",
    "redis_cluster",
    "redis_sentinel",
}


def pytest_sessionfinish(session) -> None:
    """In a pytest-xdist worker: hand the reliability tally to the controller."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["reliability_tally"] = dict(TALLY)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """In the pytest-xdist controller: add a finished worker's tally."""
    TALLY.update(getattr(node, "workeroutput", {}).get("reliability_tally", {}))


def pytest_terminal_summary(terminalreporter) -> None:
    if sum(TALLY.values()):
        terminalreporter.write_sep("-", "reliability summary")
        terminalreporter.write_line(TALLY.line())


def pytest_configure(config):
    # kafka-python 3.0 loads its protocol schemas with deprecated importlib.resources calls.
    for api in ("read_text", "open_text"):
        config.addinivalue_line("filterwarnings", f"ignore:{api} is deprecated:DeprecationWarning")


def pytest_collection_modifyitems(items):
    # A test that uses a real service is an integration test even if its marker was forgotten,
    # so that `-m "not integration"` leaves it out.
    for item in items:
        if SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def redis_url() -> str:
    error = services.redis_error(services.REDIS_URL)
    if error:
        services.missing("Redis", services.REDIS_URL, error)
    return services.REDIS_URL


@pytest.fixture(scope="session")
def redis_client(redis_url):
    import redis

    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def redis_namespace(redis_client):
    """A key prefix of this test alone, `kvcast-test-<uuid>`; its keys are deleted afterwards."""
    namespace = services.unique_name("kvcast-test")
    yield namespace
    services.delete_keys(redis_client, f"{namespace}*")


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory):
    """A real Redis Cluster of this test session: 3 masters with a replica each on free
    loopback ports (`redis-server --cluster-enabled yes`), stopped at the end. Skipped (failed
    in CI) only when redis-server or redis-cli is not installed."""
    from kvcast.lab.bench.redis_cluster import LocalRedisCluster

    for binary in ("redis-server", "redis-cli"):
        if shutil.which(binary) is None:
            missing(f"{binary} binary (for a local Redis Cluster)", "PATH", "not installed")
    cluster = LocalRedisCluster(tmp_path_factory.mktemp("redis-cluster"), masters=3, replicas=1)
    yield cluster
    cluster.stop()


@pytest.fixture
def redis_cluster_namespace(redis_cluster):
    """A namespace of this test alone on the session's cluster; its keys deleted afterwards."""
    import redis

    namespace = services.unique_name("kvcast-test")
    yield namespace
    for port in redis_cluster.ports:
        with contextlib.suppress(redis.RedisError, OSError), redis_cluster.client(port) as client:
            if client.execute_command("ROLE")[0] == b"master":
                for key in client.scan_iter(match=f"{namespace}*", count=500):
                    client.delete(key)


@pytest.fixture(scope="session")
def redis_sentinel(tmp_path_factory: pytest.TempPathFactory):
    """A master, its replica and a sentinel (`redis-server --sentinel`) of this test session on
    free loopback ports, stopped at the end; skipped (failed in CI) without redis-server."""
    from kvcast.lab.bench.redis_cluster import LocalSentinel

    if shutil.which("redis-server") is None:
        missing("redis-server binary (for a local Sentinel)", "PATH", "not installed")
    sentinel = LocalSentinel(tmp_path_factory.mktemp("redis-sentinel"))
    yield sentinel
    sentinel.stop()


@pytest.fixture
def redis_sentinel_namespace(redis_sentinel):
    """A namespace of this test alone behind the session's sentinel; deleted afterwards."""
    import redis

    namespace = services.unique_name("kvcast-test")
    yield namespace
    with (
        contextlib.suppress(redis.RedisError, OSError),
        redis_sentinel.client(redis_sentinel.master_port()) as client,
    ):
        services.delete_keys(client, f"{namespace}*")


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    error = services.kafka_error(services.KAFKA_BOOTSTRAP)
    if error:
        services.missing("Kafka", services.KAFKA_BOOTSTRAP, error)
    return services.KAFKA_BOOTSTRAP


@pytest.fixture(scope="session")
def kafka_admin(kafka_bootstrap):
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=kafka_bootstrap, **services.FAST_CLIENT_SETTINGS)
    yield admin
    admin.close()


@pytest.fixture
def kafka_topic(request, kafka_admin) -> str:
    """A fresh topic (4 partitions unless parametrized indirectly), deleted afterwards."""
    from kafka.admin import NewTopic

    partitions = getattr(request, "param", 4)
    name = services.unique_name("kvcast-test")
    kafka_admin.create_topics([NewTopic(name, partitions, 1)])
    yield name
    with contextlib.suppress(Exception):  # a broker gone at teardown took the topic with it
        kafka_admin.delete_topics([name])


@pytest.fixture(autouse=True)
def _restore_gc_settings():
    """Commands run in-process tune the collector for the whole process (daemon/gc_tuning.py);
    undo it after each test so that no test depends on the order the tests ran in."""
    import gc

    threshold = gc.get_threshold()
    yield
    gc.set_threshold(*threshold)


# Services of a test's own, which it may stop, freeze (SIGSTOP) or restart without disturbing
# the shared ones: a redis-server with an append-only file (a restart keeps the state, as in
# production) and a tansu broker (its log in memory: freeze it, don't restart it).


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    if shutil.which("redis-server") is None:
        missing("redis-server binary", "PATH", "not installed")
    directory = tmp_path / "redis"
    directory.mkdir()
    server = OwnRedis(directory)
    yield server
    server.stop()


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    binary = tansu_binary()
    port = free_port()
    address = f"127.0.0.1:{port}"
    process = subprocess.Popen(
        [str(binary), "broker", "--listener-url", f"tcp://{address}",
         "--advertised-listener-url", f"tcp://{address}", "--silent"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    wait_until(lambda: listening(port), 10, "the broker to listen")
    yield address, process
    process.kill()
    process.wait()
