"""The adapters against the engines' released code: run in the engines' own venv.

``scripts/engine_venv.sh`` builds ``.venv-engines`` (vLLM 0.33.0 with --no-deps and what its
cache modules import); ``make test`` runs these tests there after the main suite. In a venv
without vLLM (the main one) they are not collected: the main suite does not install engines.
"""

from __future__ import annotations

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("vllm") else ["test_vllm*.py"]
