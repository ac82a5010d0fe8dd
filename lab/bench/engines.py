"""The engine benchmarks, each run in its engine's own venv, gathered for ``kvcast bench``.

vLLM and SGLang are not dependencies of kvcast and need different torch builds, so their
benchmarks (:mod:`kvcast.lab.bench.engine_bench`, :mod:`kvcast.lab.bench.sglang_bench`) run in
the venvs ``scripts/engine_venv.sh`` builds; this module starts them and reads their JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["ENGINE_BENCHES", "EngineBenchError", "run_engine_benches"]

# engine -> (benchmark module, the venv's interpreter unless KVCAST_BENCH_<ENGINE>_PYTHON says)
ENGINE_BENCHES = {
    "vllm": ("kvcast.lab.bench.engine_bench", ".venv-vllm/bin/python"),
    "sglang": ("kvcast.lab.bench.sglang_bench", ".venv-sglang/bin/python"),
}


class EngineBenchError(RuntimeError):
    """An engine's venv is missing, or its benchmark failed."""


def engine_python(engine: str) -> Path:
    _module, default = ENGINE_BENCHES[engine]
    return Path(os.environ.get(f"KVCAST_BENCH_{engine.upper()}_PYTHON", default))


def run_engine_benches(timeout_s: float = 1800.0) -> dict[str, Any]:
    """Each engine's figures (``{"vllm": {...,"rows": [...]}, "sglang": {...}}``)."""
    results: dict[str, Any] = {}
    for engine, (module, _default) in ENGINE_BENCHES.items():
        python = engine_python(engine)
        if not python.exists():
            raise EngineBenchError(
                f"{engine}: no interpreter at {python}; build the venv with "
                f"`bash scripts/engine_venv.sh {engine}` or set "
                f"KVCAST_BENCH_{engine.upper()}_PYTHON"
            )
        done = subprocess.run(
            [str(python), "-W", "ignore", "-m", module, "--json"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-5:]
            raise EngineBenchError(f"{engine}: {module} exited {done.returncode}: {tail}")
        results[engine] = json.loads(done.stdout.strip().splitlines()[-1])
    return results
