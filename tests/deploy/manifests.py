"""What every way of installing kvcast on Kubernetes must render (Kustomize and Helm alike)."""

from __future__ import annotations

from typing import Any

import yaml

from tests.deploy.tools import DEPLOY, need, run

Manifest = dict[str, Any]

KINDS = {
    "Deployment",
    "Service",
    "ServiceMonitor",
    "PrometheusRule",
    "ConfigMap",
    "PodDisruptionBudget",
}


def render_overlay(overlay: str) -> dict[str, dict]:
    """The overlay's objects by kind (one of each)."""
    out = run([need("kubectl"), "kustomize", str(DEPLOY / "k8s" / "overlays" / overlay)])
    docs = [doc for doc in yaml.safe_load_all(out) if doc]
    kinds = [doc["kind"] for doc in docs]
    assert sorted(kinds) == sorted(KINDS), kinds
    return {doc["kind"]: doc for doc in docs}


def one(docs: list[Manifest], kind: str, name: str | None = None) -> Manifest:
    """The one object of `kind` (and `name`, when given) among `docs`."""
    found = [
        doc for doc in docs
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name)
    ]  # fmt: skip
    assert len(found) == 1, f"{len(found)} objects of kind {kind} named {name}"
    return found[0]


def assert_wired(docs: list[Manifest], secret: str = "kvcast-credentials") -> None:
    """The Deployment's probes, resources, Secret references and config volume, and the
    Service, ServiceMonitor and PodDisruptionBudget that find its pods."""
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]
    labels = pod["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (container,) = pod["spec"]["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    port_names = {port["name"] for port in container["ports"]}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] in port_names, probe
    assert {"requests", "limits"} <= set(container["resources"])
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    # Credentials come from the Secret, never from the ConfigMap.
    secrets = {
        env["name"]: env["valueFrom"]["secretKeyRef"]
        for env in container["env"]
        if "secretKeyRef" in env.get("valueFrom", {})
    }
    assert secrets["KVCAST_STORE"] == {"name": secret, "key": "store-url"}
    assert secrets["KVCAST_SOURCE"]["name"] == secret
    assert secrets["KVCAST_KAFKA_SASL_PASSWORD"]["name"] == secret
    # The config volume names the ConfigMap that holds kvcast.toml.
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    config = one(docs, "ConfigMap", volumes["config"]["configMap"]["name"])
    assert "kvcast.toml" in config["data"]
    assert container["args"][-2:] == ["--config", "/etc/kvcast/kvcast.toml"]
    # The Service, the ServiceMonitor and the PodDisruptionBudget find the pods.
    service = one(docs, "Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] in port_names
    monitor = one(docs, "ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
