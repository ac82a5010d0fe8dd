"""The README's run command, started as a user would, answers over HTTP while it runs."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]


def readme_command(purpose: str) -> str:
    match = re.search(rf"^(make \w+)\s+# .*{purpose}", (ROOT / "README.md").read_text(), re.M)
    assert match, f"README has no command that {purpose}"
    return match.group(1)


def test_ci_runs_exactly_the_readme_test_command() -> None:
    command = readme_command("runs ruff and the whole test suite")
    assert command in (ROOT / ".ci" / "run").read_text()


def test_the_embedded_default_serves_its_endpoints(tmp_path: Path) -> None:
    command = readme_command("runs `kvcast run` on its embedded default")
    env = {
        **os.environ,
        "KVCAST_METRICS_ADDR": "127.0.0.1:0",
        "KVCAST_SAMPLE_CONVERSATIONS": "3000",
        "KVCAST_SPEEDUP": "3000",
        "KVCAST_STATUS_INTERVAL": "0.5",
        "KVCAST_REFRESH_INTERVAL": "0.5",
    }
    log = tmp_path / "run.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            command.split(), cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            url = None
            deadline = time.monotonic() + 120  # the first `make run` may build the venv
            while url is None and time.monotonic() < deadline:
                found = re.search(rb"serving (http://[\d.:]+)", log.read_bytes())
                url = found.group(1).decode() if found else None
                assert process.poll() is None, log.read_text()
                time.sleep(0.2)
            assert url, log.read_text()

            def get(path: str) -> tuple[int, bytes]:
                try:
                    with urllib.request.urlopen(url + path, timeout=5) as response:
                        return response.status, response.read()
                except urllib.error.HTTPError as error:
                    return error.code, error.read()

            deadline = time.monotonic() + 60
            while get("/readyz")[0] != 200:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            assert get("/healthz")[0] == 200
            status, body = get("/v1/forecast")
            forecast = orjson.loads(body)
            assert status == 200 and forecast["capacity_blocks"] == 2275
            assert len(forecast["curve"]) > 10
            deadline = time.monotonic() + 60
            while get("/v1/table")[0] != 200:  # 503 until something was observed
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.3)
            table = orjson.loads(get("/v1/table")[1])
            assert table["version"] >= 1 and table["states"] and table["window_conversations"]
            status, metrics = get("/metrics")
            assert status == 200 and b"kvcast_hit_ratio_forecast " in metrics
            deadline = time.monotonic() + 30
            while b"events/s" not in log.read_bytes():
                assert time.monotonic() < deadline
                time.sleep(0.2)
        finally:
            # SIGTERM to kvcast itself (make's child): make then exits with kvcast's status.
            children = subprocess.run(
                ["pgrep", "-P", str(process.pid)], capture_output=True, text=True
            ).stdout.split()
            for child in children:
                os.kill(int(child), signal.SIGTERM)
            try:
                code = process.wait(timeout=30)
            finally:
                if process.poll() is None:
                    os.killpg(process.pid, signal.SIGKILL)
    assert children and code == 0, log.read_text()
    # An operator sees why it stopped and that nothing was left unstored.
    assert re.search(r"kvcast: stopped on SIGTERM: [\d,]+ events applied, everything stored",
                     log.read_text()), log.read_text()  # fmt: skip
