"""Connection security: Redis AUTH and TLS, secrets kept out of output, HTTP on loopback.

Kafka SASL/SSL settings are checked in ``tests/daemon/test_kafka_security.py`` (tansu offers
neither, so only the handshake kafka-python starts can be seen).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from kvcast.daemon.settings import DaemonSettings, redact_url
from kvcast.lab.bench.processes import DaemonProcess, OwnRedis, free_port, wait_until
from kvcast.lab.bench.soak import workload
from tests.reliability.tally import TALLY
from tests.services import missing

PASSWORD = "pw-Zx81-tOp-sEcReT"


def kvcast(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvcast.cli.main", *args],
        capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})},
    )  # fmt: skip


def events_file(tmp_path: Path) -> Path:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(workload(1200, seed=3)) + b"\n")
    return path


def run_until_table(args: list[str], log: Path, client, namespace: str) -> DaemonProcess:
    daemon = DaemonProcess(args, log)
    try:
        wait_until(lambda: client.exists(f"{namespace}:{{{namespace}}}:table"), 60,
                   "the table in Redis")  # fmt: skip
        assert daemon.stop(signal.SIGTERM) == 0, daemon.text()
    finally:
        if daemon.process.poll() is None:
            daemon.stop(signal.SIGKILL)
    return daemon


@pytest.fixture
def redis_server_binary() -> None:
    if shutil.which("redis-server") is None:
        missing("redis-server binary", "PATH", "not installed")


@pytest.mark.integration
def test_redis_auth_works_and_the_password_never_shows(tmp_path, redis_server_binary) -> None:
    server = OwnRedis(tmp_path, password=PASSWORD)
    try:
        client = server.client()
        args = ["--source", f"file://{events_file(tmp_path)}", "--store", server.url,
                "--namespace", "auth", "--metrics-addr", "127.0.0.1:0", "--classifier", "off",
                "--status-interval",
                "0.2", "--refresh-interval", "0.2", "--log-level", "debug"]  # fmt: skip
        daemon = run_until_table(args, tmp_path / "daemon.log", client, "auth")
        outputs = {"log": daemon.text()}
        assert "store redis://:***@127.0.0.1" in outputs["log"]
        # A wrong password fails with a message that names neither password.
        wrong_url = server.url.replace(PASSWORD, "wr0ng-" + PASSWORD[::-1])
        wrong = DaemonProcess([*args[:2], "--store", wrong_url, *args[4:], "--shutdown-timeout",
                               "1"], tmp_path / "wrong.log")  # fmt: skip
        wait_until(lambda: "state store unavailable" in wrong.text(), 30, "the auth failure")
        assert wrong.stop(signal.SIGTERM) in (0, 1)  # 1 when applied events were lost
        outputs["wrong password"] = wrong.text()
        for url in (server.url, f"redis://kv:{PASSWORD}@h:1/0", f"rediss://:{PASSWORD}@h:1/0",
                    f"redis://h:1/0?password={PASSWORD}"):  # fmt: skip
            printed = kvcast("run", "--print-config", "--store", url)
            assert printed.returncode == 0, printed.stderr
            outputs[f"--print-config {url}"] = printed.stdout + printed.stderr
            env = kvcast("run", "--print-config", env={"KVCAST_STORE": url})
            outputs[f"KVCAST_STORE {url}"] = env.stdout + env.stderr
            helped = kvcast("run", "--help", env={"KVCAST_STORE": url})
            outputs[f"--help, KVCAST_STORE {url}"] = helped.stdout + helped.stderr
        client.close()
    finally:
        server.stop()
    leaks = [where for where, text in outputs.items() if PASSWORD in text or PASSWORD[::-1] in text]
    TALLY.add(hostile_inputs=len(outputs), differences=len(leaks))
    assert leaks == []


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.mark.integration
def test_a_password_never_stays_in_the_process_list(tmp_path, redis_server_binary) -> None:
    """``/proc/PID/cmdline`` is readable by every local user: a password given in ``--store``
    or ``--kafka-sasl-password`` is scrubbed from the process title as soon as the flags are
    parsed, and ``--store-password-file`` keeps it off the command line altogether."""
    server = OwnRedis(tmp_path, password=PASSWORD)
    titles: dict[str, str] = {}
    try:
        client = server.client()
        plain_url = server.url.replace(f":{PASSWORD}@", "")
        common = ["--source", f"file://{events_file(tmp_path)}", "--metrics-addr", "127.0.0.1:0",
                  "--classifier", "off", "--refresh-interval", "0.2"]  # fmt: skip
        flag = DaemonProcess(
            [*common, "--store", server.url, "--namespace", "title",
             "--kafka-sasl-password", PASSWORD],
            tmp_path / "flag.log",
        )  # fmt: skip
        try:
            wait_until(lambda: client.exists("title:{title}:table"), 60, "the table in Redis")
            titles["password in the flags"] = cmdline(flag.process.pid)
            assert "--store redis://:***@127.0.0.1" in titles["password in the flags"]
            assert "--kafka-sasl-password ***" in titles["password in the flags"]
        finally:
            flag.stop(signal.SIGTERM)
        secret = tmp_path / "redis-password"
        secret.write_text(PASSWORD + "\n")
        secret.chmod(0o600)
        from_file = DaemonProcess(
            [*common, "--store", plain_url, "--namespace", "pwfile",
             "--store-password-file", str(secret)],
            tmp_path / "file.log",
        )  # fmt: skip
        try:
            wait_until(lambda: client.exists("pwfile:{pwfile}:table"), 60, "the table in Redis")
            titles["password file"] = cmdline(from_file.process.pid)
            titles["password file, log"] = from_file.text()
        finally:
            assert from_file.stop(signal.SIGTERM) == 0
        both = kvcast("run", "--print-config", "--store", server.url,
                      "--store-password-file", str(secret))  # fmt: skip
        assert both.returncode == 2 and "give it in one place" in both.stderr
        titles["both, error"] = both.stderr
        client.close()
    finally:
        server.stop()
    leaks = [where for where, text in titles.items() if PASSWORD in text]
    TALLY.add(hostile_inputs=len(titles), differences=len(leaks))
    assert leaks == []


def make_certificate(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


@pytest.mark.integration
def test_rediss_url_with_auth_over_tls(tmp_path, redis_server_binary) -> None:
    if shutil.which("openssl") is None:
        missing("openssl", "PATH", "needed for a self-signed certificate")
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
    cert, key = make_certificate(tmp_path)
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
         "--tls-cert-file", str(cert), "--tls-key-file", str(key), "--tls-ca-cert-file",
         str(cert), "--tls-auth-clients", "no", "--requirepass", PASSWORD, "--save", "",
         "--dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        import redis

        def up() -> bool:
            if process.poll() is not None:
                return True
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        wait_until(up, 10, "redis-server with TLS")
        if process.poll() is not None:
            missing("redis-server with TLS", "tls-port", version.stdout.strip())
        url = f"rediss://:{PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={cert}"
        client = redis.Redis.from_url(url)
        args = ["--source", f"file://{events_file(tmp_path)}", "--store", url,
                "--namespace", "tls", "--metrics-addr", "127.0.0.1:0", "--classifier", "off",
                "--refresh-interval", "0.2"]  # fmt: skip
        daemon = run_until_table(args, tmp_path / "daemon.log", client, "tls")
        table = orjson.loads(client.get("tls:{tls}:table"))
        assert table["window_conversations"] > 0
        assert PASSWORD not in daemon.text()
        plain = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
        with pytest.raises(redis.RedisError):  # the port speaks TLS only
            plain.ping()
        client.close()
        TALLY.add(faults=0, hostile_inputs=1)
    finally:
        process.kill()
        process.wait()


def test_redact_url_hides_every_password_form() -> None:
    for url in (
        f"redis://:{PASSWORD}@h:1/0",
        f"redis://user:{PASSWORD}@h/0",
        f"rediss://:{PASSWORD}@h:6380/0?ssl_ca_certs=/x",
        f"redis://h:1/0?password={PASSWORD}",
        f"redis://h:1/0?db=1&password={PASSWORD}",
    ):
        assert PASSWORD not in redact_url(url), url  # fmt: skip
    assert redact_url("redis://h:1/0?db=1") == "redis://h:1/0?db=1"


def test_http_binds_loopback_by_default() -> None:
    assert DaemonSettings().http_host_port() == ("127.0.0.1", 9400)
    printed = kvcast("run", "--print-config")
    assert orjson.loads(printed.stdout)["metrics_addr"] == "127.0.0.1:9400"


@pytest.mark.slow
def test_the_default_server_is_unreachable_from_other_interfaces(tmp_path) -> None:
    """With no --metrics-addr the server answers on 127.0.0.1 and nowhere else."""
    with socket.socket() as sock:
        if sock.connect_ex(("127.0.0.1", 9400)) == 0:
            pytest.skip("port 9400 is taken here; the settings test covers the default")  # allowed
    external = _external_address()
    if external is None:
        pytest.skip("no non-loopback IPv4 address on this machine")  # allowed: nothing to probe
    daemon = DaemonProcess(["--sample-conversations", "500"], tmp_path / "daemon.log")
    try:
        assert daemon.url == "http://127.0.0.1:9400"
        assert daemon.raw("/healthz")
        with socket.socket() as sock:
            assert sock.connect_ex((external, 9400)) != 0
        assert daemon.stop(signal.SIGTERM) == 0
    finally:
        if daemon.process.poll() is None:
            daemon.stop(signal.SIGKILL)


def _external_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("10.255.255.255", 1))
            address = sock.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address
