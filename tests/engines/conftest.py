"""The adapters against the engines' released code: run in the engines' own venv.

``scripts/engine_venv.sh`` builds ``.venv-engines`` (vLLM 0.33.0 with --no-deps and what its
cache modules import); ``make test-engines`` (part of ``make test``) runs these tests there
with ``KVCAST_ENGINE_TESTS=1``. In a venv without vLLM (the main one) they are not collected:
the main suite does not install engines. With ``KVCAST_ENGINE_TESTS=1`` a missing vLLM is an
error, never a silent skip.
"""

from __future__ import annotations

import importlib.util
import os

HAS_VLLM = importlib.util.find_spec("vllm") is not None
if not HAS_VLLM and os.environ.get("KVCAST_ENGINE_TESTS") == "1":
    raise RuntimeError(
        "KVCAST_ENGINE_TESTS=1 but vllm is not importable: build the venv with "
        "scripts/engine_venv.sh and run the tests with .venv-engines/bin/python"
    )
collect_ignore_glob = [] if HAS_VLLM else ["test_vllm*.py"]
