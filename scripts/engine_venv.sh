#!/usr/bin/env bash
# An engine's own venv for tests/engines: the engine's released wheel with --no-deps, exactly
# the packages its imported modules need (tests/engines/requirements-ENGINE.txt), the torch it
# imports, and kvcast itself (editable, no dependencies: the adapters need none).
# Kept apart so that the main venv stays CPU-sized and the engines' pins never touch it.
#   vllm:   vLLM 0.33.0 on the CPU torch 2.13.0 the main venv uses.
#   sglang: SGLang 0.5.23, whose modules import triton and torchvision: torch 2.14.1,
#           torchvision 0.29.1 and triton 3.8.0 (pip takes them from this machine's disk).
# Usage: scripts/engine_venv.sh vllm|sglang [VENV]   (default .venv-ENGINE; rebuilt when its
# inputs change)
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINE=${1:?usage: scripts/engine_venv.sh vllm|sglang [VENV]}
VENV=${2:-.venv-$ENGINE}
PYTHON=${PYTHON:-python3}
case $ENGINE in
    vllm)
        TORCH=(torch==2.13.0)
        WHEEL=vllm==0.33.0
        CHECK="import vllm.v1.core.kv_cache_manager"
        ;;
    sglang)
        TORCH=(torch==2.14.1 torchvision==0.29.1 triton==3.8.0)
        WHEEL=sglang==0.5.23
        CHECK="import sglang.srt.mem_cache.unified_radix_cache, sglang.srt.mem_cache.common"
        ;;
    *)
        echo "scripts/engine_venv.sh: unknown engine '$ENGINE' (vllm or sglang)" >&2
        exit 2
        ;;
esac
REQUIREMENTS=tests/engines/requirements-$ENGINE.txt
STAMP="$VENV/.installed"
INPUTS=("$REQUIREMENTS" scripts/engine_venv.sh pyproject.toml)
if [[ -f $STAMP ]] && [[ -z $(find "${INPUTS[@]}" -newer "$STAMP") ]]; then
    exit 0
fi
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet "${TORCH[@]}"
"$VENV/bin/pip" install --quiet --no-deps "$WHEEL"
"$VENV/bin/pip" install --quiet --no-deps -r "$REQUIREMENTS"
"$VENV/bin/pip" install --quiet --no-deps -e .
"$VENV/bin/pip" install --quiet "pytest>=8" "hypothesis>=6.100"
"$VENV/bin/python" -c "$CHECK" # fails loudly if a module is missing
touch "$STAMP"
