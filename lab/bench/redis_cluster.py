"""A real Redis Cluster of our own on loopback ports: ``redis-server --cluster-enabled yes``
processes joined by ``redis-cli --cluster create``, for tests and benchmarks.

    with LocalRedisCluster(Path("/tmp/c"), masters=3, replicas=1) as cluster:
        store = open_store(cluster.url, "ns")

Also what the fault tests do to one: move a slot between masters (``CLUSTER SETSLOT``
IMPORTING/MIGRATING, ``MIGRATE``, then NODE) and promote a replica (``CLUSTER FAILOVER``).
"""

from __future__ import annotations

import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from kvcast.lab.bench.processes import wait_until


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _ephemeral_start() -> int:
    """The first port the kernel hands out for outgoing connections (32768 where unknown)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free_node_port() -> int:
    """A free port P whose cluster bus port P + 10000 is free too, both below the kernel's
    ephemeral range: a bus port inside it was free when checked and then taken by a client's
    outgoing connection before the node bound it (the node aborts: "Failed listening on port
    ... (cluster)"), which failed a CI run's every cluster test."""
    top = _ephemeral_start() - 10000
    for _ in range(1000):
        port = random.randrange(min(10000, top - 1), top)
        if _bindable(port) and _bindable(port + 10000):
            return port
    raise RuntimeError("no free port pair for a cluster node")


class _LocalServers:
    """redis-server processes on loopback ports: their clients, and their end (:meth:`stop`,
    or the context)."""

    processes: dict[int, subprocess.Popen]

    def client(self, port: int):
        """A plain (not cluster-aware) client of the server on ``port``."""
        import redis

        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)

    def _pings(self, port: int) -> bool:
        import redis

        try:
            with self.client(port) as client:
                return bool(client.ping())
        except (redis.RedisError, OSError):
            return False

    def _replication_up(self, port: int) -> bool:
        """A master, or a replica whose link to its master is up (``INFO replication``)."""
        with self.client(port) as client:
            replication = client.info("replication")
        return replication.get("role") == "master" or replication.get("master_link_status") == "up"

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


class LocalRedisCluster(_LocalServers):
    """``masters`` masters with ``replicas`` replicas each, every node on a free port of
    127.0.0.1, files under ``directory``; :meth:`stop` (or the context) ends the processes."""

    def __init__(self, directory: Path, masters: int = 3, replicas: int = 1) -> None:
        for binary in ("redis-server", "redis-cli"):
            if shutil.which(binary) is None:
                raise FileNotFoundError(f"{binary} is not installed")
        self.directory = directory
        self.ports: list[int] = []
        while len(self.ports) < masters * (1 + replicas):
            port = _free_node_port()
            if port not in self.ports:
                self.ports.append(port)
        self.processes: dict[int, subprocess.Popen] = {}
        try:
            for port in self.ports:
                self._start(port)
            subprocess.run(
                ["redis-cli", "--cluster", "create",
                 *[f"127.0.0.1:{p}" for p in self.ports],
                 "--cluster-replicas", str(replicas), "--cluster-yes"],
                check=True, capture_output=True, timeout=60,
            )  # fmt: skip
            wait_until(self._ready, 60, "the cluster to be ok on every node")
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        """A ``redis+cluster://`` URL naming every node."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def _start(self, port: int) -> None:
        node_dir = self.directory / str(port)
        node_dir.mkdir(parents=True, exist_ok=True)
        self.processes[port] = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled",
             "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
             "--save", "", "--appendonly", "no", "--dir", str(node_dir)],
            stdout=(node_dir / "log").open("ab"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_until(lambda: self._pings(port), 10, f"redis-server on port {port}")

    def info(self, port: int) -> dict[str, str]:
        """``CLUSTER INFO`` of one node."""
        with self.client(port) as client:
            raw = client.execute_command("CLUSTER", "INFO")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return dict(line.split(":", 1) for line in text.split() if ":" in line)

    def _ready(self) -> bool:
        """Every live node says cluster_state:ok and agrees on every master's slots, and every
        live replica's link to its master is up.

        The last, because a replica that has not yet synchronised with its master refuses to
        take over when that master dies ("Disconnected from master for longer than allowed",
        ``cluster-replica-validity-factor``): a master killed a second after ``cluster
        create`` stayed failed for good, and a test that ran first in its session failed."""
        try:
            live = [p for p, proc in self.processes.items() if proc.poll() is None]
            views = {tuple(sorted(self.slot_owners(p).items())) for p in live}
            return (
                all(self.info(p).get("cluster_state") == "ok" for p in live)
                and len(views) == 1
                and all(self._replication_up(p) for p in live)
            )
        except Exception:  # a node still starting or being reconfigured: not ready yet
            return False

    def nodes(self, port: int | None = None) -> list[dict[str, object]]:
        """``CLUSTER NODES`` as seen from ``port`` (any live node by default): id, port,
        role (master/slave), master id, slot ranges."""
        port = port or next(p for p, proc in self.processes.items() if proc.poll() is None)
        with self.client(port) as client:
            raw = client.execute_command("CLUSTER", "NODES")
        text = raw.decode() if isinstance(raw, bytes) else raw
        rows = []
        for line in str(text).strip().splitlines():
            fields = line.split()
            flags = fields[2].split(",")
            rows.append({
                "id": fields[0], "port": int(fields[1].split("@")[0].rsplit(":", 1)[1]),
                "role": "master" if "master" in flags else "slave",
                "failed": "fail" in flags or "fail?" in flags,
                "master": fields[3], "slots": fields[8:],
            })  # fmt: skip
        return rows

    def slot_owners(self, port: int | None = None) -> dict[int, int]:
        """Master port -> number of slots it serves, as the node on ``port`` (any live one by
        default) sees it."""
        owners: dict[int, int] = {}
        for row in self.nodes(port):
            if row["role"] == "master" and not row["failed"]:
                count = 0
                for item in row["slots"]:  # type: ignore[union-attr]
                    if item.startswith("["):  # a slot being migrated: counted where it is
                        continue
                    lo, _, hi = item.partition("-")
                    count += int(hi or lo) - int(lo) + 1
                owners[int(row["port"])] = count  # type: ignore[arg-type]
        return owners

    def master_of(self, slot: int) -> int:
        """The port of the master serving ``slot``."""
        for row in self.nodes():
            if row["role"] != "master" or row["failed"]:
                continue
            for item in row["slots"]:  # type: ignore[union-attr]
                if item.startswith("["):
                    continue
                lo, _, hi = item.partition("-")
                if int(lo) <= slot <= int(hi or lo):
                    return int(row["port"])  # type: ignore[arg-type]
        raise LookupError(f"no master serves slot {slot}")

    def node_id(self, port: int) -> str:
        with self.client(port) as client:
            return client.execute_command("CLUSTER", "MYID").decode()

    def move_slot(self, slot: int, target: int, batch: int = 10, pause_s: float = 0.0) -> int:
        """Move ``slot`` to the master on port ``target`` the way ``redis-cli --cluster
        reshard`` does (IMPORTING/MIGRATING, MIGRATE the keys ``batch`` at a time, then NODE
        on every master), ``pause_s`` between batches so that clients meet ASK redirections;
        the number of keys moved."""
        source = self.master_of(slot)
        if source == target:
            return 0
        source_id, target_id = self.node_id(source), self.node_id(target)
        moved = 0
        with self.client(source) as src, self.client(target) as dst:
            dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
            src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
                src.execute_command("MIGRATE", "127.0.0.1", target, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
                time.sleep(pause_s)
            for row in self.nodes():
                if row["role"] == "master" and not row["failed"]:
                    with self.client(int(row["port"])) as node:  # type: ignore[arg-type]
                        node.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        wait_until(lambda: self.master_of(slot) == target, 30, f"slot {slot} to move")
        return moved

    def replica_of(self, master_port: int) -> int:
        """The port of a replica of the master on ``master_port``."""
        master_id = self.node_id(master_port)
        for row in self.nodes():
            if row["role"] == "slave" and row["master"] == master_id:
                return int(row["port"])  # type: ignore[arg-type]
        raise LookupError(f"the master on {master_port} has no replica")

    def promote(self, replica_port: int, timeout_s: float = 30) -> None:
        """``CLUSTER FAILOVER`` on a replica: it becomes the master of its slots (the old
        master its replica), once the old master has caught it up."""
        with self.client(replica_port) as client:
            client.execute_command("CLUSTER", "FAILOVER")
        wait_until(
            lambda: any(r["port"] == replica_port and r["role"] == "master"
                        for r in self.nodes(replica_port)) and self._ready(),
            timeout_s, f"the replica on {replica_port} to be promoted",
        )  # fmt: skip

    def wait_replicated(self, port: int, timeout_s: float = 10) -> None:
        """Wait until every replica of the master on ``port`` has received all it has written
        so far (its replication offset). Redis replicates asynchronously: a master killed
        before that takes its last writes with it, which a test of something else must rule
        out first."""
        with self.client(port) as client:
            written = int(client.info("replication")["master_repl_offset"])

            def received() -> bool:
                info = client.info("replication")
                replicas = [v for k, v in info.items() if k.startswith("slave") and k[5:].isdigit()]
                return bool(replicas) and all(int(r["offset"]) >= written for r in replicas)

            wait_until(received, timeout_s, f"the replicas of {port} to reach offset {written}")

    def kill(self, port: int, timeout_s: float = 60) -> int:
        """SIGKILL the master on ``port`` and wait until its replica has taken its slots (the
        other nodes' failure detection: ``cluster-node-timeout`` 2 s); the new master's port."""
        replica = self.replica_of(port)
        process = self.processes[port]
        process.kill()
        process.wait()
        wait_until(
            lambda: any(r["port"] == replica and r["role"] == "master"
                        for r in self.nodes(replica)) and self._ready(),
            timeout_s, f"the replica on {replica} to take over",
        )  # fmt: skip
        return replica

    def revive(self, port: int, timeout_s: float = 60) -> None:
        """Start the killed node on ``port`` again (its nodes.conf kept): it rejoins as a
        replica of the master that took its slots."""
        self._start(port)
        wait_until(
            lambda: any(r["port"] == port and r["role"] == "slave" and not r["failed"]
                        for r in self.nodes()) and self._ready(),
            timeout_s, f"the node on {port} to rejoin",
        )  # fmt: skip


class LocalSentinel(_LocalServers):
    """A master, ``replicas`` replicas and one sentinel (``redis-server --sentinel``, quorum
    1) watching the master as ``service``, all on free loopback ports under ``directory``."""

    def __init__(self, directory: Path, service: str = "kvcast", replicas: int = 1) -> None:
        if shutil.which("redis-server") is None:
            raise FileNotFoundError("redis-server is not installed")
        self.directory, self.service = directory, service
        self.processes: dict[int, subprocess.Popen] = {}
        self.data_ports = [_free_node_port() for _ in range(1 + replicas)]
        self.sentinel_port = _free_node_port()
        try:
            master = self.data_ports[0]
            for port in self.data_ports:
                extra = [] if port == master else ["--replicaof", "127.0.0.1", str(master)]
                self._start(port, ["--save", "", "--appendonly", "no", *extra])
            config = directory / "sentinel.conf"
            config.write_text(
                f"port {self.sentinel_port}\nbind 127.0.0.1\ndir {directory}\n"
                f"sentinel monitor {service} 127.0.0.1 {master} 1\n"
                f"sentinel down-after-milliseconds {service} 1000\n"
                f"sentinel failover-timeout {service} 5000\n"
            )
            self._start(self.sentinel_port, [], config=config)
            wait_until(self._replicas_known, 30, "the sentinel to see the replicas")
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{self.service}"

    def _start(self, port: int, args: list[str], config: Path | None = None) -> None:
        node_dir = self.directory / str(port)
        node_dir.mkdir(parents=True, exist_ok=True)
        if config is not None:
            head = [str(config), "--sentinel"]
        else:
            head = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(node_dir)]
        self.processes[port] = subprocess.Popen(
            ["redis-server", *head, *args],
            stdout=(node_dir / "log").open("ab"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_until(lambda: self._pings(port), 10, f"redis-server on port {port}")

    def master_port(self) -> int:
        """The master's port, as the sentinel names it."""
        with self.client(self.sentinel_port) as client:
            _, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
        return int(port)

    def _replicas_known(self) -> bool:
        """The sentinel knows every replica, and each has synchronised with the master (one
        that has not would lose the writes before the failover)."""
        with self.client(self.sentinel_port) as client:
            replicas = client.execute_command("SENTINEL", "REPLICAS", self.service)
        return len(replicas) == len(self.data_ports) - 1 and all(
            self._replication_up(port) for port in self.data_ports
        )

    def failover(self, timeout_s: float = 30) -> int:
        """``SENTINEL FAILOVER``: a replica becomes the master; its port once it serves writes."""
        old = self.master_port()
        with self.client(self.sentinel_port) as client:
            client.execute_command("SENTINEL", "FAILOVER", self.service)

        def promoted() -> bool:
            port = self.master_port()
            if port == old:
                return False
            with self.client(port) as client:
                return client.execute_command("ROLE")[0] == b"master"

        wait_until(promoted, timeout_s, "the sentinel's failover")
        return self.master_port()
