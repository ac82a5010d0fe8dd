"""The Kubernetes manifests: every overlay renders, with the kinds and wiring operators need."""

from __future__ import annotations

import pytest
import yaml

from tests.deploy.tools import DEPLOY, OVERLAYS, need, run

KINDS = {
    "Deployment",
    "Service",
    "ServiceMonitor",
    "PrometheusRule",
    "ConfigMap",
    "PodDisruptionBudget",
}


def render(overlay: str) -> dict[str, dict]:
    """The overlay's objects by kind (one of each)."""
    out = run([need("kubectl"), "kustomize", str(DEPLOY / "k8s" / "overlays" / overlay)])
    docs = [doc for doc in yaml.safe_load_all(out) if doc]
    kinds = [doc["kind"] for doc in docs]
    assert sorted(kinds) == sorted(KINDS), kinds
    return {doc["kind"]: doc for doc in docs}


@pytest.mark.integration
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_a_wired_deployment(overlay: str) -> None:
    objects = render(overlay)
    deployment = objects["Deployment"]
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
    assert secrets["KVCAST_STORE"] == {"name": "kvcast-credentials", "key": "store-url"}
    assert secrets["KVCAST_SOURCE"]["name"] == "kvcast-credentials"
    # The config volume names the generated (hashed) ConfigMap, which holds kvcast.toml.
    config = objects["ConfigMap"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == config["metadata"]["name"]
    assert "kvcast.toml" in config["data"]
    assert container["args"][-1] == "/etc/kvcast/" + "kvcast.toml"
    # The Service, the ServiceMonitor and the PodDisruptionBudget find the pods.
    service = objects["Service"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] in port_names
    monitor = objects["ServiceMonitor"]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"]
    pdb = objects["PodDisruptionBudget"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()


@pytest.mark.integration
def test_the_overlays_differ_in_image_and_gpu() -> None:
    cpu, gpu = (render(o)["Deployment"]["spec"]["template"]["spec"] for o in ("cpu", "gpu"))
    assert cpu["containers"][0]["image"].endswith("-cpu")
    assert gpu["containers"][0]["image"].endswith("-cuda")
    assert "nvidia.com/gpu" not in cpu["containers"][0]["resources"]["limits"]
    assert gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert any(t["key"] == "nvidia.com/gpu" for t in gpu["tolerations"])
