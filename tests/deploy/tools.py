"""Helpers for the deploy/ checks: paths, and the external tools they run.

A missing tool fails the test in CI (CI=true) and skips it elsewhere, naming the tool and how
to install it (`scripts/check_deploy.sh install`, which `make test` runs first).
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from tests import services

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "kvcast"
# Where `scripts/check_deploy.sh install` puts the tools no system package ships (helm).
LOCAL_TOOLS = ROOT / ".tools" / "bin"
RULES = DEPLOY / "prometheus" / "kvcast-rules.yaml"
DASHBOARD = DEPLOY / "grafana" / "kvcast-dashboard.json"
OVERLAYS = ("cpu", "gpu")
INSTALL_HINT = "install it with `scripts/check_deploy.sh install` (`make test` does this)"


def need(tool: str) -> str:
    """The path of `tool` (on PATH or in .tools/bin); fails (CI) or skips (elsewhere) when it
    is not installed."""
    path = shutil.which(tool) or shutil.which(tool, path=str(LOCAL_TOOLS))
    if path is None:
        services.unavailable(f"{tool} is not installed; {INSTALL_HINT}")
    return path


def run(
    args: Sequence[str], cwd: Path = ROOT, env: dict[str, str] | None = None, timeout: float = 60
) -> str:
    """Run a tool; its stdout, or an assertion error with everything it printed."""
    done = subprocess.run(
        list(args), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout
