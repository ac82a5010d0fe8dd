"""Heads: the SPEC architecture, the file format, refusal of another backbone, merges, training."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from kvcast.classifier.backbone import BackboneInfo
from kvcast.classifier.dataset import stratified_split
from kvcast.classifier.head import (
    HeadMismatch,
    MergedHead,
    PrototypeHead,
    at_taxonomy,
    build_mlp,
    load_head,
    read_metadata,
    save_head,
)
from kvcast.classifier.train import TrainConfig, lr_factor, train_head
from kvcast.stats.taxonomy import INTENTS_30, MERGE_10, MERGE_20

torch = pytest.importorskip("torch")
LABELS = tuple(INTENTS_30)


def test_mlp_is_exactly_the_spec_stack() -> None:
    kinds = [type(m).__name__ for m in build_mlp(384, 30)]
    block = ["Linear", "GELU", "Dropout"]
    assert kinds == ["LayerNorm", *block, *block, "Linear"]
    mlp = build_mlp(1024, 30)
    assert (mlp[1].in_features, mlp[1].out_features) == (1024, 2048)
    assert (mlp[4].in_features, mlp[4].out_features) == (2048, 1024)
    assert (mlp[7].in_features, mlp[7].out_features) == (1024, 30)
    assert mlp[3].p == 0.25


def clusters(n_per: int, dim: int, seed: int) -> tuple[np.ndarray, list[str]]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(len(LABELS), dim))
    x = np.concatenate([c + 0.6 * rng.normal(size=(n_per, dim)) for c in centres])
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32), [label for label in LABELS for _ in range(n_per)]


def test_training_learns_and_keeps_the_best_validation_epoch(tmp_path) -> None:
    x, y = clusters(12, 32, 0)
    splits = stratified_split(y, seed=1)
    part = {s: [k for k, v in enumerate(splits) if v == s] for s in ("train", "val", "test")}
    assert len(part["val"]) == len(part["test"]) == 30  # one of each class in 12
    result = train_head(
        x[part["train"]],
        [y[k] for k in part["train"]],
        x[part["val"]],
        [y[k] for k in part["val"]],
        LABELS,
        "fake/backbone",
        TrainConfig(epochs=4),
    )
    assert result.best_val_macro_f1 == max(f1 for _, f1 in result.history)
    assert result.history[result.best_epoch - 1][1] == result.best_val_macro_f1
    probs = result.head.predict_proba(x[part["test"]])
    truth = [y[i] for i in part["test"]]
    accuracy = np.mean([LABELS[k] == t for k, t in zip(probs.argmax(1), truth, strict=True)])
    assert accuracy > 0.8
    # Round trip through the file keeps the predictions (fp16 weights).
    path = save_head(result.head, tmp_path / "head.safetensors")
    again = load_head(path, BackboneInfo("fake/backbone", 32))
    agree = again.predict_proba(x).argmax(1) == result.head.predict_proba(x).argmax(1)
    assert np.mean(agree) > 0.98
    meta = read_metadata(path)
    assert meta["backbone"] == "fake/backbone" and meta["dim"] == "32" and meta["taxonomy"] == "30"


def test_schedule_warms_up_then_decays_to_zero() -> None:
    factors = [lr_factor(step, 100, 0.05) for step in range(100)]
    assert factors[0] == pytest.approx(0.2) and factors[4] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(factors[4:]))
    assert factors[-1] < 0.01


def test_head_refuses_a_backbone_of_another_dimension_or_name(tmp_path) -> None:
    protos = np.eye(30, 16, dtype=np.float32)
    path = save_head(PrototypeHead(protos, LABELS, "org/model-a", 16), tmp_path / "p.safetensors")
    assert load_head(path, BackboneInfo("org/model-a", 16)).dim == 16
    with pytest.raises(HeadMismatch, match="16-dim"):
        load_head(path, BackboneInfo("org/model-a", 384))
    with pytest.raises(HeadMismatch, match="model-a"):
        load_head(path, BackboneInfo("org/model-b", 16))


@pytest.mark.parametrize(("size", "merges"), [(20, MERGE_20), (10, MERGE_10)])
def test_a_30_class_head_answers_in_merged_taxonomies(size: int, merges) -> None:
    rng = np.random.default_rng(0)
    protos = rng.normal(size=(30, 8)).astype(np.float32)
    head = PrototypeHead(protos, LABELS, "m", 8, scale=3.0)
    merged = at_taxonomy(head, size)
    assert isinstance(merged, MergedHead) and merged.labels == tuple(merges)
    x = rng.normal(size=(5, 8)).astype(np.float32)
    fine, coarse = head.predict_proba(x), merged.predict_proba(x)
    assert np.allclose(coarse.sum(axis=1), 1.0, atol=1e-5)
    for col, label in enumerate(merged.labels):
        members = [LABELS.index(original) for original in merges[label]]
        assert np.allclose(coarse[:, col], fine[:, members].sum(axis=1), atol=1e-6)
