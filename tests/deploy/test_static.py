"""deploy/ as files: lint, compose, images, configs, the systemd unit, and no dangling names."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from tests.deploy.tools import DEPLOY, ROOT, need, run

COMPOSE = DEPLOY / "compose" / "compose.yaml"
DOCKERFILES = sorted((DEPLOY / "docker").glob("*.Dockerfile"))
CONFIGS = sorted(DEPLOY.rglob("kvcast.toml"))


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


@pytest.mark.integration
def test_yamllint_is_clean() -> None:
    run([need("yamllint"), "--strict", "-c", str(DEPLOY / "yamllint.yaml"), "deploy"])


@pytest.mark.integration
def test_docker_compose_accepts_the_stack() -> None:
    out = run([need("docker-compose"), "-f", str(COMPOSE), "config"])
    services = yaml.safe_load(out)["services"]
    expected = {"kafka", "redis", "kvcast", "demo-producer", "prometheus", "grafana",
                "hash-key", "engine-standin", "kvcast-tap", "chat-client"}  # fmt: skip
    assert set(services) == expected


def test_compose_names_only_existing_files() -> None:
    base = COMPOSE.parent
    stack = yaml.safe_load(COMPOSE.read_text())
    services, named = stack["services"], set(stack.get("volumes") or {})
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source in named:
                continue  # a volume of the stack's own (the tap's hash key)
            assert source.startswith("."), f"{name}: only bind mounts of repository files"
            assert (base / source).exists(), f"{name}: {source} does not exist"
        if "build" in service:
            context = base / service["build"]["context"]
            assert (context / service["build"]["dockerfile"]).is_file(), name
    kafka = services["kafka"]["environment"]
    assert "controller" in kafka["KAFKA_PROCESS_ROLES"] and "KAFKA_ZOOKEEPER_CONNECT" not in kafka


def test_compose_prometheus_and_grafana_find_what_is_mounted() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    targets = {
        service: {v.split(":")[1]: v.split(":")[0] for v in services[service]["volumes"]}
        for service in ("prometheus", "grafana")
    }
    config = yaml.safe_load((COMPOSE.parent / "prometheus.yml").read_text())
    for rule_file in config["rule_files"]:
        assert rule_file in targets["prometheus"], rule_file
        assert targets["prometheus"][rule_file] == "../prometheus/kvcast-rules.yaml"
    assert config["scrape_configs"][0]["static_configs"][0]["targets"] == ["kvcast:9400"]
    provisioning = COMPOSE.parent / "grafana" / "provisioning" / "dashboards" / "kvcast.yaml"
    path = yaml.safe_load(provisioning.read_text())["providers"][0]["options"]["path"]
    assert targets["grafana"][path] == "../grafana"


def test_kustomizations_name_only_existing_files() -> None:
    for kustomization in (DEPLOY / "k8s").rglob("kustomization.yaml"):
        doc = yaml.safe_load(kustomization.read_text())
        here = kustomization.parent
        named = list(doc.get("resources", []))
        named += [patch["path"] for patch in doc.get("patches", []) if "path" in patch]
        named += [f for gen in doc.get("configMapGenerator", []) for f in gen.get("files", [])]
        for name in named:
            path = here / name
            assert path.is_file() or (path / "kustomization.yaml").is_file(), f"{here}: {name}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_copies_existing_files_and_runs_unprivileged(dockerfile: Path) -> None:
    steps = dockerfile_instructions(dockerfile)
    ignore = (dockerfile.parent / (dockerfile.name + ".dockerignore")).read_text().split()
    for instruction, args in steps:
        if instruction != "COPY" or "--from=" in args:
            continue
        *sources, _dest = shlex.split(args)
        for source in sources:
            assert (ROOT / source).exists(), f"{dockerfile.name}: COPY {source} does not exist"
            assert f"!{source}" in ignore or f"!{source}/" in ignore, f"{source} is ignored"
    copied = {shlex.split(args)[0].rstrip("/") for instruction, args in steps
              if instruction == "COPY" and "--from=" not in args}  # fmt: skip
    with (ROOT / "pyproject.toml").open("rb") as f:
        package_dir = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    rooms = {folder.split("/")[0] for folder in package_dir.values()}
    assert rooms <= copied, f"{dockerfile.name}: packages not copied: {sorted(rooms - copied)}"
    assert sum(instruction == "FROM" for instruction, _ in steps) >= 2, "multi-stage"
    final = steps[max(i for i, (ins, _) in enumerate(steps) if ins == "FROM") :]
    users = [args for instruction, args in final if instruction == "USER"]
    assert users and users[-1].split(":")[0] not in ("0", "root"), "runs as root"
    (healthcheck,) = [args for instruction, args in final if instruction == "HEALTHCHECK"]
    assert "/opt/kvcast/healthcheck.py" in healthcheck
    assert "/healthz" in (DEPLOY / "docker" / "healthcheck.py").read_text()


def test_image_requirements_pin_every_dependency() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for line in (DEPLOY / "docker" / "requirements.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            pins[req.name.lower().replace("_", "-")] = spec.version
    wanted = project["dependencies"] + project["optional-dependencies"].get("classifier", [])
    for text in wanted:
        req = Requirement(text)
        name = req.name.lower().replace("_", "-")
        assert name in pins, f"{req.name} is not pinned: run deploy/docker/pin_requirements.py"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]}"


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_shipped_configs_are_accepted_by_kvcast(config: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVCAST_")}
    args = ["run", "--config", str(config), "--print-config"]
    out = run([sys.executable, "-m", "kvcast.cli.main", *args], env=env)
    settings = json.loads(out)
    assert settings["source"].startswith("kafka://")
    assert settings["metrics_addr"] == "0.0.0.0:9400"


@pytest.mark.integration
def test_systemd_unit_verifies(tmp_path: Path) -> None:
    unit = (DEPLOY / "systemd" / "kvcast.service").read_text()
    kvcast = Path(sys.executable).parent / "kvcast"
    assert "ExecStart=/opt/kvcast/bin/kvcast run --config /etc/kvcast/kvcast.toml" in unit
    copy = tmp_path / "kvcast.service"
    copy.write_text(unit.replace("/opt/kvcast/bin/kvcast", str(kvcast)))
    done = subprocess.run(
        [need("systemd-analyze"), "verify", str(copy)], capture_output=True, text=True
    )
    assert done.returncode == 0 and str(copy) not in done.stderr, done.stderr


def test_deploy_files_name_only_existing_paths() -> None:
    """Every repository path written in deploy/ (deploy/..., docs/...) exists; so does every
    backticked relative file name in deploy/README.md."""
    for path in DEPLOY.rglob("*"):
        if not path.is_file():
            continue
        text = path.read_text()
        for name in re.findall(r"(?<![\w/.])((?:deploy|docs|scripts|tests)/[\w./-]*\w)", text):
            assert (ROOT / name).exists(), f"{path.relative_to(ROOT)} names {name}"
    readme = (DEPLOY / "README.md").read_text()
    for name in re.findall(
        r"`([\w./-]+\.(?:yaml|yml|json|toml|py|txt|md|service|Dockerfile))`", readme
    ):
        assert (DEPLOY / name).exists() or (ROOT / name).exists(), f"README names {name}"
