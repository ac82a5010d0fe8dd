"""The adapters against the engines' released code: each engine's tests run in its own venv.

``scripts/engine_venv.sh vllm`` builds ``.venv-vllm`` (vLLM 0.33.0 with --no-deps and what its
cache modules import), ``scripts/engine_venv.sh sglang`` builds ``.venv-sglang`` (SGLang 0.5.23
likewise, on the torch its modules import); ``make test-engines`` (part of ``make test``) runs
this folder in each with ``KVCAST_ENGINE_TESTS`` naming that venv's engine. An engine's tests
are collected only where it is importable (the main venv installs neither); the engine that
``KVCAST_ENGINE_TESTS`` names missing is an error, never a silent skip.
"""

from __future__ import annotations

import importlib.util
import os

ENGINES = ("vllm", "sglang")
PRESENT = {engine: importlib.util.find_spec(engine) is not None for engine in ENGINES}

_expected = os.environ.get("KVCAST_ENGINE_TESTS")
if _expected is not None:
    if _expected not in ENGINES:
        raise RuntimeError(f"KVCAST_ENGINE_TESTS={_expected!r}: name one of {', '.join(ENGINES)}")
    if not PRESENT[_expected]:
        raise RuntimeError(
            f"KVCAST_ENGINE_TESTS={_expected} but {_expected} is not importable: build its venv "
            f"with scripts/engine_venv.sh {_expected} and run the tests with "
            f".venv-{_expected}/bin/python"
        )
collect_ignore_glob = [f"test_{engine}*.py" for engine, present in PRESENT.items() if not present]
