#!/usr/bin/env bash
# The engines' own venv for tests/engines: vLLM's released wheel with --no-deps, exactly the
# packages its cache modules import (tests/engines/requirements-vllm.txt), the CPU torch the
# main venv uses, and kvcast itself (editable, no dependencies: the adapters need none).
# Kept apart so that the main venv stays CPU-sized and vLLM's pins never touch it.
# Usage: scripts/engine_venv.sh [VENV]   (default .venv-engines; rebuilt when its inputs change)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-engines}
PYTHON=${PYTHON:-python3}
STAMP="$VENV/.installed"
INPUTS=(tests/engines/requirements-vllm.txt scripts/engine_venv.sh pyproject.toml)
if [[ -f $STAMP ]] && [[ -z $(find "${INPUTS[@]}" -newer "$STAMP") ]]; then
    exit 0
fi
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet torch==2.13.0
"$VENV/bin/pip" install --quiet --no-deps vllm==0.33.0
"$VENV/bin/pip" install --quiet --no-deps -r tests/engines/requirements-vllm.txt
"$VENV/bin/pip" install --quiet --no-deps -e .
"$VENV/bin/pip" install --quiet "pytest>=8" "hypothesis>=6.100"
"$VENV/bin/python" -c "import vllm.v1.core.kv_cache_manager" # fails loudly if a module is missing
touch "$STAMP"
