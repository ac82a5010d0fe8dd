"""End to end: Debian's Prometheus scrapes a running `kvcast run` and evaluates the rules.

kvcast runs on its embedded default with a capacity of 4 KV blocks, so its forecast is near 0
and KvcastPredictedHitRatioLow (forecast < 0.3) must fire. Prometheus loads a copy of
deploy/prometheus/kvcast-rules.yaml in which only `for:` is set to 0s: the expressions and
thresholds are the shipped ones, and the test need not wait the rule's 15 minutes.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.tools import DEPLOY, ROOT, RULES, need

TIMEOUT_S = 90


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def wait_for(what: str, probe: Callable[[], Any], logs: list[Path]) -> Any:
    """Poll `probe` until it returns something truthy (errors count as not yet)."""
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            value = probe()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.5)
    tails = "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in logs)
    raise AssertionError(f"timed out waiting for {what}\n{tails}")


def start(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with log.open("wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env)


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture
def kvcast(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A `kvcast run` whose forecast is near 0; (host:port, log)."""
    log = tmp_path / "kvcast.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVCAST_")}
    args = ["--metrics-addr", "127.0.0.1:0", "--sample-conversations", "300"]
    args += ["--speedup", "5000", "--capacity-blocks", "4", "--refresh-interval", "1"]
    process = start([sys.executable, "-m", "kvcast.cli.main", "run", *args], log, env)
    try:

        def serving() -> str | None:
            assert process.poll() is None, log.read_text()
            found = re.search(r"serving http://([\d.]+:\d+)", log.read_text())
            return found.group(1) if found else None

        yield wait_for("kvcast to serve", serving, [log]), log
    finally:
        stop(process)


@pytest.mark.integration
def test_prometheus_scrapes_kvcast_and_fires_an_alert(kvcast, tmp_path: Path) -> None:
    binary = need("prometheus")
    target, kvcast_log = kvcast
    # The image's health check passes against a live daemon.
    port = target.rpartition(":")[2]
    env = {**os.environ, "KVCAST_METRICS_ADDR": f"0.0.0.0:{port}"}
    check = [sys.executable, str(DEPLOY / "docker" / "healthcheck.py")]
    assert subprocess.run(check, env=env, timeout=10).returncode == 0

    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule["for"] = "0s"
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": ["rules.yaml"],
        "scrape_configs": [{"job_name": "kvcast", "static_configs": [{"targets": [target]}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    api = f"http://127.0.0.1:{free_port()}"
    log = tmp_path / "prometheus.log"
    server = start(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address={api.removeprefix('http://')}",
        ],
        log,
    )
    logs = [log, kvcast_log]
    try:

        def query(expr: str) -> list[dict]:
            assert server.poll() is None, log.read_text()
            url = f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
            return get_json(url)["data"]["result"]

        (sample,) = wait_for(
            "the forecast series", lambda: query("kvcast_hit_ratio_forecast"), logs
        )
        assert sample["metric"]["job"] == "kvcast"
        assert 0 <= float(sample["value"][1]) < 0.3

        def firing() -> list[dict]:
            """The firing alerts, once the low hit ratio is among them. (KvcastDown, with its
            `for:` at 0 s here, fires until the first scrape and resolves at the evaluation after
            it: it must be gone by then, which the assertion below checks.)"""
            alerts = get_json(f"{api}/api/v1/alerts")["data"]["alerts"]
            alerts = [alert for alert in alerts if alert["state"] == "firing"]
            names = {alert["labels"]["alertname"] for alert in alerts}
            return alerts if "KvcastPredictedHitRatioLow" in names else []

        alerts = wait_for("KvcastPredictedHitRatioLow to fire", firing, logs)
        assert [alert["labels"]["alertname"] for alert in alerts] == ["KvcastPredictedHitRatioLow"]
        (alert,) = alerts
        assert alert["labels"]["severity"] == "warning"
        assert (ROOT / alert["annotations"]["runbook_url"]).is_file()

        groups = get_json(f"{api}/api/v1/rules")["data"]["groups"]
        loaded = {rule["name"]: rule["health"] for group in groups for rule in group["rules"]}
        expected = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
        assert set(loaded) == expected
        assert set(loaded.values()) == {"ok"}, loaded
    finally:
        stop(server)


@pytest.mark.integration
def test_prometheus_joins_the_tiers_and_fires_the_per_tier_alert(tmp_path: Path) -> None:
    """A tiered `kvcast run` (GPU 4 blocks, host 4 blocks: forecast near 0 in both) and an
    SGLang stand-in whose HiCache host tier serves half the input: the forecast's and the
    engine's `tier="host"` series meet in Prometheus, and the per-tier alert fires for host."""
    from tests.daemon.test_engine_metrics import Endpoint
    from tests.daemon.test_engine_tiers import Sglang0523, serving

    binary = need("prometheus")
    # Half the input from host memory, none from the GPU (so SGLang has no device series: the
    # gpu tiers do not meet), a request before each scrape.
    engine = Endpoint(serving(Sglang0523(), 2000, device=0, host=1000))
    log = tmp_path / "kvcast.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVCAST_")}
    args = ["--metrics-addr", "127.0.0.1:0", "--sample-conversations", "300", "--speedup", "5000",
            "--capacity-blocks", "4", "--block-size", "16", "--tier", "host=4",
            "--refresh-interval", "1", "--engine-metrics", engine.url,
            "--engine-scrape-interval", "0.5"]  # fmt: skip
    kvcast = start([sys.executable, "-m", "kvcast.cli.main", "run", *args], log, env)
    server = None
    try:

        def serving() -> str | None:
            assert kvcast.poll() is None, log.read_text()
            found = re.search(r"serving http://([\d.]+:\d+)", log.read_text())
            return found.group(1) if found else None

        target = wait_for("kvcast to serve", serving, [log])
        rules = yaml.safe_load(RULES.read_text())
        for group in rules["groups"]:
            for rule in group["rules"]:
                rule["for"] = "0s"
        (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": ["rules.yaml"],
            "scrape_configs": [{"job_name": "kvcast", "static_configs": [{"targets": [target]}]}],
        }
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        api = f"http://127.0.0.1:{free_port()}"
        prometheus_log = tmp_path / "prometheus.log"
        server = start(
            [binary, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address={api.removeprefix('http://')}"],
            prometheus_log,
        )  # fmt: skip
        logs = [prometheus_log, log]

        def tier_alerts() -> list[dict]:
            alerts = get_json(f"{api}/api/v1/alerts")["data"]["alerts"]
            return [
                alert for alert in alerts if alert["state"] == "firing"
                and alert["labels"]["alertname"] == "KvcastTierForecastDivergesFromEngines"
            ]  # fmt: skip

        (alert,) = wait_for("the per-tier alert to fire", tier_alerts, logs)
        assert alert["labels"]["tier"] == "host" and alert["labels"]["job"] == "kvcast"
        assert float(alert["value"]) > 0.1
        query = f"{api}/api/v1/query?" + urllib.parse.urlencode(
            {"query": 'kvcast_hit_ratio_forecast_tier{tier="host"}'}
        )
        (forecast,) = get_json(query)["data"]["result"]
        assert float(forecast["value"][1]) < 0.4  # the forecast's host share, far below 0.5
    finally:
        if server is not None:
            stop(server)
        stop(kvcast)
        engine.close()
