"""The Kubernetes manifests: every overlay renders, with the kinds and wiring operators need."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.deploy.manifests import KINDS, assert_wired
from tests.deploy.manifests import render_overlay as render
from tests.deploy.tools import DEPLOY, OVERLAYS, need, run


@pytest.mark.integration
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_a_wired_deployment(overlay: str) -> None:
    objects = render(overlay)
    assert_wired(list(objects.values()))
    # Kustomize names the ConfigMap by its content, so a changed config rolls the pods.
    assert objects["ConfigMap"]["metadata"]["name"].startswith("kvcast-config-")


@pytest.mark.integration
def test_the_overlays_differ_in_image_and_gpu() -> None:
    cpu, gpu = (render(o)["Deployment"]["spec"]["template"]["spec"] for o in ("cpu", "gpu"))
    assert cpu["containers"][0]["image"].endswith("-cpu")
    assert gpu["containers"][0]["image"].endswith("-cuda")
    assert "nvidia.com/gpu" not in cpu["containers"][0]["resources"]["limits"]
    assert gpu["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert any(t["key"] == "nvidia.com/gpu" for t in gpu["tolerations"])


@pytest.mark.integration
def test_the_kube_prometheus_stack_component_labels_only_the_monitoring_objects(
    tmp_path: Path,
) -> None:
    k8s = Path(os.path.relpath(DEPLOY / "k8s", tmp_path))  # kustomize takes no absolute paths
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [str(k8s / "overlays" / "cpu")],
        "components": [str(k8s / "components" / "kube-prometheus-stack")],
    }))  # fmt: skip
    out = run([need("kubectl"), "kustomize", str(tmp_path)])
    labelled = {
        doc["kind"]: doc["metadata"]["labels"].get("release")
        for doc in yaml.safe_load_all(out) if doc
    }  # fmt: skip
    assert labelled == {kind: None for kind in KINDS} | {
        "ServiceMonitor": "kube-prometheus-stack", "PrometheusRule": "kube-prometheus-stack"
    }  # fmt: skip
