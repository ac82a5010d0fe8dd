"""Where the backbone comes from: a configured path, else the production model from the Hugging
Face cache (never downloaded), else the packaged offline model, said in the log.

The production model (multilingual-e5-large-instruct, 1,024-dim) is not on this machine, so the
cache tests plant a real model (the packaged MiniLM's files) in a cache directory under the
production name: what is exercised is the discovery, the naming, the query prefix and the
choice of head, not e5's weights. Each case runs in a fresh interpreter because the hub reads
its cache location from the environment at import.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("sentence_transformers")

from kvcast.classifier.backbone import PACKAGED, PRODUCTION, QUERY_PREFIXES, packaged_path

PROBE = """
import json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
from kvcast.classifier.model import load_classifier
classifier = load_classifier(sys.argv[1] if len(sys.argv) > 1 else None, device="cpu")
info = classifier.encoder.info
print(json.dumps({"name": info.name, "dim": info.dim, "prefix": info.query_prefix,
                  "head": classifier.head.kind,
                  "intent": classifier.predict_texts(["write a haiku about rain"])[0].intent}))
"""


def plant_in_cache(hub: Path, repo_id: str) -> Path:
    """A Hugging Face cache entry for ``repo_id`` holding the packaged model's files."""
    source = packaged_path()
    assert source is not None
    entry = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = entry / "snapshots" / "0123456789abcdef"
    shutil.copytree(source, snapshot)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text("0123456789abcdef")
    return snapshot


def probe(hub: Path, *args: str) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "KVCAST_"))}
    env.update(HF_HUB_CACHE=str(hub), HF_HUB_OFFLINE="1")
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_production_model_in_the_cache_is_preferred(tmp_path: Path) -> None:
    snapshot = plant_in_cache(tmp_path / "hub", PRODUCTION)
    found, log = probe(tmp_path / "hub")
    assert found["name"] == PRODUCTION
    assert found["prefix"] == QUERY_PREFIXES[PRODUCTION]  # e5-instruct's "Instruct: ...\nQuery: "
    # No head is shipped for the production backbone: the zero-shot head serves, and says so.
    assert found["head"] == "prototype"  # the zero-shot head
    assert "zero-shot (no trained head for intfloat/multilingual-e5-large-instruct)" in log
    assert str(snapshot) in log and "packaged offline model" not in log


def test_without_the_production_model_the_packaged_one_serves_and_the_log_says_so(
    tmp_path: Path,
) -> None:
    (tmp_path / "hub").mkdir()
    found, log = probe(tmp_path / "hub")
    assert found["name"] == PACKAGED and found["dim"] == 384
    assert found["head"] == "mlp"  # the head shipped for the packaged backbone
    assert found["intent"] == "creative_writing"
    assert "not found in the model cache; using the packaged offline model" in log


def test_a_configured_path_wins_and_is_named_after_the_model_it_holds(tmp_path: Path) -> None:
    (tmp_path / "hub").mkdir()
    plant_in_cache(tmp_path / "hub", PRODUCTION)
    local = tmp_path / "models" / "all-MiniLM-L6-v2"
    source = packaged_path()
    assert source is not None
    shutil.copytree(source, local)
    found, log = probe(tmp_path / "hub", str(local))
    assert found["name"] == PACKAGED and found["head"] == "mlp"
    assert str(local) in log


def test_a_configured_path_that_is_not_a_directory_is_refused(tmp_path: Path) -> None:
    from kvcast.classifier.backbone import BackboneUnavailable, load_backbone

    with pytest.raises(BackboneUnavailable, match="is not a directory"):
        load_backbone(tmp_path / "missing", device="cpu")
