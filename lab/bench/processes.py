"""Processes a soak or a fault test owns: a ``redis-server`` with an append-only file, and
``kvcast run`` as a subprocess with its log; plus the small waiting helpers they share."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(check: Callable[[], Any], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


class OwnRedis:
    """A ``redis-server`` of our own on a free port: append-only file, fsync always."""

    def __init__(self, directory: Path, extra: Sequence[str] = (), password: str | None = None):
        self.port = free_port()
        self.directory = directory
        self.extra = list(extra)
        self.password = password
        auth = f":{password}@" if password else ""
        self.url = f"redis://{auth}127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.directory),
                *self.extra]  # fmt: skip
        if self.password:
            args += ["--requirepass", self.password]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self.pings, 10, "redis-server to start")

    def client(self):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password)

    def pings(self) -> bool:
        import redis

        try:
            client = self.client()
            try:
                return bool(client.ping())
            finally:
                client.close()
        except (redis.RedisError, OSError):
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)
            self.process.wait(timeout=10)

    def restart(self, sig: int = signal.SIGTERM, down_s: float = 0.0) -> None:
        self.stop(sig)
        time.sleep(down_s)
        self.start()


class DaemonProcess:
    """``kvcast run ARGS`` as a subprocess; stdout and stderr go to ``log``."""

    def __init__(
        self,
        args: Sequence[str],
        log: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        prefix: Sequence[str] = (),
        start_timeout: float = 60,
    ) -> None:
        self.log = log
        self.handle = log.open("wb")
        self.process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "kvcast.cli.main", "run", *args],
            stdout=self.handle, stderr=subprocess.STDOUT, env=env, cwd=cwd,
        )  # fmt: skip
        self.url = self._wait_for_url(start_timeout)

    def _wait_for_url(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            match = re.search(rb"serving (http://[\d.:]+)", self.log.read_bytes())
            if match:
                return match.group(1).decode()
            if self.process.poll() is not None:
                raise RuntimeError(f"daemon exited:\n{self.text()}")
            time.sleep(0.05)
        raise TimeoutError(f"daemon did not start:\n{self.text()}")

    def text(self) -> str:
        return self.log.read_bytes().decode("utf-8", "replace")

    def raw(self, path: str) -> bytes:
        with urllib.request.urlopen(self.url + path, timeout=5) as response:
            return response.read()

    def get(self, path: str) -> dict:
        return orjson.loads(self.raw(path))

    def assigned(self) -> bool:
        """The daemon has been given partitions (its own log line, not kafka-python's)."""
        return b"kvcast.daemon.runner: assigned " in self.log.read_bytes()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        code = self.process.wait(timeout=timeout)
        self.handle.close()
        return code
