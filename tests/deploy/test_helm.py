"""The Helm chart (deploy/helm/kvcast), rendered and linted by a real Helm.

It must render the objects the Kustomize overlays render, take the values operators of a
kube-prometheus-stack and a Grafana sidecar set, write a kvcast.toml that kvcast itself
accepts, and refuse bad values before anything reaches a cluster, naming the value.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.manifests import Manifest, assert_wired, one, render_overlay
from tests.deploy.tools import CHART, DASHBOARD, ROOT, RULES, need, run

pytestmark = pytest.mark.integration

GPU_VALUES = CHART / "ci" / "gpu-values.yaml"
# Labels Helm's conventions add (release, chart, version, manager); the overlays have none.
HELM_LABELS = {
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/version",
    "helm.sh/chart",
}


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    """Run helm; its result whatever the exit status."""
    return subprocess.run(
        [need("helm"), *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


def template(*args: str, release: str = "kvcast") -> list[Manifest]:
    """The chart's objects, rendered by `helm template` with `args` (values, --set)."""
    done = helm("template", release, str(CHART), "--namespace", "serving", *args)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def kvcast_toml(docs: list[Manifest]) -> str:
    volumes = one(docs, "Deployment")["spec"]["template"]["spec"]["volumes"]
    (name,) = [v["configMap"]["name"] for v in volumes if v["name"] == "config"]
    return one(docs, "ConfigMap", name)["data"]["kvcast.toml"]


# -- lint and wiring -----------------------------------------------------------------------------


@pytest.mark.parametrize("values", [None, GPU_VALUES], ids=["cpu", "gpu"])
def test_chart_lints_clean_in_strict_mode(values: Path | None) -> None:
    args = ["lint", "--strict", str(CHART)] + (["-f", str(values)] if values else [])
    done = helm(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("values", [None, GPU_VALUES], ids=["cpu", "gpu"])
def test_chart_renders_a_wired_deployment(values: Path | None) -> None:
    docs = template(*(["-f", str(values)] if values else []))
    assert_wired(docs)
    kinds = sorted(doc["kind"] for doc in docs)
    assert kinds == sorted(["ConfigMap", "ConfigMap", "Deployment", "PodDisruptionBudget",
                            "PrometheusRule", "Service", "ServiceMonitor"])  # fmt: skip


# -- the same objects as Kustomize ---------------------------------------------------------------


def _without_helm_conventions(doc: Manifest) -> Manifest:
    """A chart object less what only Helm adds: its labels, the config checksum that rolls the
    pods (Kustomize's hashed ConfigMap name does that), and fields set to their defaults."""
    doc = copy.deepcopy(doc)
    for labels in _label_sets(doc):
        for key in HELM_LABELS:
            labels.pop(key, None)
    if doc["kind"] == "Deployment":
        doc["spec"]["template"]["metadata"].pop("annotations")
        for container in doc["spec"]["template"]["spec"]["containers"]:
            assert container.pop("imagePullPolicy") == "IfNotPresent"  # the default, tagged
    if doc["kind"] == "Service":
        assert doc["spec"].pop("type") == "ClusterIP"  # the default
    return doc


def _label_sets(doc: Manifest) -> list[dict[str, str]]:
    """The object's labels, its pods' and its selector's."""
    found = [doc["metadata"].get("labels", {})]
    if doc["kind"] == "Deployment":
        found.append(doc["spec"]["template"]["metadata"]["labels"])
    return found + _selectors(doc)


def _selectors(doc: Manifest) -> list[dict[str, str]]:
    spec = doc.get("spec", {})
    if doc["kind"] == "Service":
        return [spec["selector"]]
    return [spec["selector"]["matchLabels"]] if isinstance(spec.get("selector"), dict) else []


def _comparable(docs: list[Manifest]) -> dict[str, Any]:
    """Objects by kind: the config's name replaced, its TOML parsed (comments aside), and
    selectors without part-of (Kustomize's includeSelectors puts it there, Helm selects by
    release instead)."""
    found: dict[str, Any] = {}
    for doc in copy.deepcopy(docs):
        if doc["kind"] == "ConfigMap":
            doc["metadata"]["name"] = "CONFIG"
            doc["data"] = {"kvcast.toml": tomllib.loads(doc["data"]["kvcast.toml"])}
        if doc["kind"] == "Deployment":
            for volume in doc["spec"]["template"]["spec"]["volumes"]:
                if "configMap" in volume:
                    volume["configMap"]["name"] = "CONFIG"
        for selector in _selectors(doc):
            selector.pop("app.kubernetes.io/part-of", None)
        assert doc["kind"] not in found, doc["kind"]
        found[doc["kind"]] = doc
    return found


@pytest.mark.parametrize("overlay", ["cpu", "gpu"])
def test_chart_renders_the_objects_of_the_kustomize_overlay(overlay: str) -> None:
    values = ["-f", str(GPU_VALUES)] if overlay == "gpu" else []
    chart_docs = template(*values, "--set", "dashboard.enabled=false")
    chart = _comparable([_without_helm_conventions(doc) for doc in chart_docs])
    kustomize = _comparable(list(render_overlay(overlay).values()))
    assert sorted(chart) == sorted(kustomize)
    for kind in kustomize:
        assert chart[kind] == kustomize[kind], kind


# -- values operators set ------------------------------------------------------------------------


def test_monitoring_objects_take_the_stacks_labels() -> None:
    docs = template(
        "--set", "serviceMonitor.additionalLabels.release=kube-prometheus-stack",
        "--set", "prometheusRule.additionalLabels.release=kube-prometheus-stack",
        "--set", "serviceMonitor.interval=30s",
    )  # fmt: skip
    monitor, rule = one(docs, "ServiceMonitor"), one(docs, "PrometheusRule")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["endpoints"][0]["interval"] == "30s"
    # The rules are deploy/prometheus/kvcast-rules.yaml's, which promtool tests.
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    off = template("--set", "serviceMonitor.enabled=false", "--set", "prometheusRule.enabled=false")
    assert {"ServiceMonitor", "PrometheusRule"}.isdisjoint(doc["kind"] for doc in off)


def test_dashboard_is_a_configmap_for_the_grafana_sidecar() -> None:
    docs = template("--set", "dashboard.namespace=monitoring",
                    "--set", "dashboard.annotations.grafana_folder=LLM serving")  # fmt: skip
    dashboard = one(docs, "ConfigMap", "kvcast-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "LLM serving"}
    assert json.loads(dashboard["data"]["kvcast-dashboard.json"]) == json.loads(
        DASHBOARD.read_text()
    )
    relabelled = template("--set", "dashboard.labels.grafana_dashboard=null",
                          "--set", "dashboard.labels.team-dashboards=kvcast")  # fmt: skip
    labels = one(relabelled, "ConfigMap", "kvcast-dashboard")["metadata"]["labels"]
    assert "grafana_dashboard" not in labels and labels["team-dashboards"] == "kvcast"


def test_names_follow_the_release() -> None:
    docs = template(release="forecaster")
    assert {doc["metadata"]["name"] for doc in docs} == {
        "forecaster-kvcast", "forecaster-kvcast-config", "forecaster-kvcast-dashboard"
    }  # fmt: skip
    pod = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pod["app.kubernetes.io/instance"] == "forecaster"
    # Two releases in one namespace select only their own pods.
    other = one(template(release="other"), "Service")["spec"]["selector"]
    assert not other.items() <= pod.items()


def test_the_chart_can_create_the_credentials_secret() -> None:
    docs = template("--set", r"credentials.storeUrl=redis+cluster://:pw@redis-0:6379\,redis-1:6379",
                    "--set", "credentials.kafkaSaslPassword=s3cret")  # fmt: skip
    secret = one(docs, "Secret")
    assert secret["metadata"]["name"] == "kvcast-credentials"
    assert secret["stringData"] == {
        "store-url": "redis+cluster://:pw@redis-0:6379,redis-1:6379",
        "kafka-sasl-password": "s3cret",
    }
    assert_wired(docs, secret="kvcast-credentials")
    assert "pw" not in kvcast_toml(docs)
    # With an existing Secret (the default) the chart creates none.
    assert all(doc["kind"] != "Secret" for doc in template())
    assert_wired(template("--set", "credentials.existingSecret=redis-urls"), secret="redis-urls")


def test_a_config_change_rolls_the_pods() -> None:
    def checksum(*args: str) -> str:
        pod = one(template(*args), "Deployment")["spec"]["template"]
        return pod["metadata"]["annotations"]["checksum/config"]

    assert checksum() == checksum()
    assert checksum() != checksum("--set", "config.capacity-blocks=4000")


# -- kvcast accepts what the chart writes ----------------------------------------------------------


def print_config(toml_text: str, tmp_path: Path) -> dict[str, Any]:
    """kvcast's resolved settings for a kvcast.toml (its own validation, no connection), with
    the store URL in KVCAST_STORE as the pod has it from the Secret."""
    path = tmp_path / "kvcast.toml"
    path.write_text(toml_text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVCAST_")}
    env["KVCAST_STORE"] = "redis://redis:6379/0"
    args = ["run", "--config", str(path), "--print-config"]
    out = run([sys.executable, "-m", "kvcast.cli.main", *args], env=env)
    return json.loads(out)


def test_kvcast_accepts_the_rendered_config(tmp_path: Path) -> None:
    settings = print_config(kvcast_toml(template()), tmp_path)
    assert settings["capacity_blocks"] == 2275 and isinstance(settings["capacity_blocks"], int)
    assert settings["stats"]["block_size"] == 16 and settings["instances"] == 8
    assert settings["target_hit_ratios"] == [0.5, 0.7]
    assert settings["metrics_addr"] == "0.0.0.0:9400"
    assert settings["source"] == "kafka://kafka:9092/requests"


def test_every_kind_of_setting_reaches_kvcast(tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "http": {"port": 9500},
        "config": {
            "workers": 2, "shadow-sampling": 0.1, "max-open-conversations": 2_000_000,
            "completion-timeout": 900, "classifier": "off", "log-format": "json",
            "engine-metrics": "http://vllm-0:8000/metrics,http://vllm-1:8000/metrics",
            "target-hit-ratio": [0.6], "taxonomy": "20", "source": 'kafka://k:9092/"q"',
            "log-level": None,
        },
    }))  # fmt: skip
    docs = template("-f", str(values))
    text = kvcast_toml(docs)
    # Helm reads every number as a float; whole ones are written as integers, as typed.
    assert "max-open-conversations = 2000000\n" in text and "completion-timeout = 900\n" in text
    assert "log-level" not in text  # null removes a default
    settings = print_config(text, tmp_path)
    assert settings["workers"] == 2 and settings["shadow_sampling"] == 0.1
    assert settings["stats"]["max_open_conversations"] == 2_000_000
    assert settings["stats"]["completion_timeout_s"] == 900.0
    assert settings["classifier"] == "off" and settings["taxonomy"] == 20
    assert settings["engine_metrics"] == [
        "http://vllm-0:8000/metrics",
        "http://vllm-1:8000/metrics",
    ]
    assert settings["target_hit_ratios"] == [0.6]
    assert settings["source"] == 'kafka://k:9092/"q"'
    assert settings["metrics_addr"] == "0.0.0.0:9500"
    (container,) = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["ports"][0]["containerPort"] == 9500


# -- bad values ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("config.capacity-blocks=lots", "at '/config/capacity-blocks': got string, want integer"),
        ("config.capacty-blocks=4000", "additional properties 'capacty-blocks' not allowed"),
        ("config.shadow-sampling=2", "at '/config/shadow-sampling'"),
        ("config.classifier=gpu", "at '/config/classifier'"),
        ("config.metrics-addr=0.0.0.0:1", "additional properties 'metrics-addr' not allowed"),
        ("config.store=redis://:pw@r:6379", "additional properties 'store' not allowed"),
        ("replicaCount=-1", "at '/replicaCount'"),
        ("gpu.enabled=yes", "at '/gpu/enabled': got string, want boolean"),
        ("credentials.storeUrl=http://redis", "at '/credentials/storeUrl'"),
        ("serviceMonitor.interval=15", "at '/serviceMonitor/interval'"),
        ("serviceMonitr.enabled=false", "additional properties 'serviceMonitr' not allowed"),
        ("credentials.existingSecret=", "credentials: set existingSecret"),
    ],
)
def test_bad_values_are_refused_naming_the_value(setting: str, message: str) -> None:
    done = helm("template", "kvcast", str(CHART), "--set", setting)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


def test_a_table_in_config_is_refused_with_its_name() -> None:
    done = helm("template", "kvcast", str(CHART), "--set-json", 'config.extra-intents={"a":1}')
    assert done.returncode != 0
    assert "extra-intents" in done.stderr, done.stderr


# -- kept in step with the rest of the project -----------------------------------------------------


def test_the_schema_knows_every_kvcast_setting() -> None:
    done = subprocess.run([sys.executable, "scripts/chart_schema.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_chart_and_images_carry_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version
    (container,) = one(template(), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == f"kvcast/kvcast:{version}-cpu"


def test_the_chart_packages_with_its_linked_files(tmp_path: Path) -> None:
    done = helm("package", str(CHART), "--destination", str(tmp_path))
    assert done.returncode == 0, done.stderr
    (archive,) = tmp_path.glob("kvcast-*.tgz")
    docs = yaml.safe_load_all(run([need("helm"), "template", "kvcast", str(archive)]))
    rule = one([doc for doc in docs if doc], "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(RULES.read_text())


def test_the_deploy_guides_install_command_renders() -> None:
    guide = (ROOT / "deploy" / "README.md").read_text()
    section = guide.split("## Kubernetes (Helm)", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    (command,) = [line.split() for line in block.splitlines() if line.startswith("helm install")]
    assert command[:4] == ["helm", "install", "kvcast", "deploy/helm/kvcast"]
    docs = template(*command[4:])
    assert_wired(docs)
    assert one(docs, "ServiceMonitor")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert "capacity-blocks = 2275" in kvcast_toml(docs)
