"""Train a head end to end: read labelled JSONL, embed, split, train, evaluate (``train-head``).

The training part is the ``train`` split plus, unless ``with_examples`` is off, the taxonomy's
own example requests and descriptions (:mod:`kvcast.classifier.examples`, never part of the
evaluation set); the ``val`` split picks the epoch; the ``test`` split is only scored, never
trained on or used for any choice. The zero-shot head is scored on the same items.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvcast.classifier.backbone import Encoder
from kvcast.classifier.dataset import Example, assign_splits, read_examples
from kvcast.classifier.head import Head, MLPHead, at_taxonomy
from kvcast.classifier.metrics import Report, paired_difference, report
from kvcast.classifier.model import IntentClassifier
from kvcast.classifier.train import TrainConfig, TrainResult, train_head
from kvcast.classifier.zeroshot import prototype_texts, zero_shot_head
from kvcast.stats.taxonomy import TAXONOMIES, merge_map


@dataclass
class FitResult:
    """The trained head and how it and the zero-shot head score on the val and test splits."""

    head: MLPHead
    training: TrainResult
    counts: dict[str, int]
    val: Report
    test: Report | None
    zero_shot_test: Report | None
    test_gain: tuple[float, float] | None
    """Trained minus zero-shot accuracy on the test split, and its paired standard error."""

    def to_dict(self) -> dict:
        return {
            "backbone": self.head.backbone,
            "dim": self.head.dim,
            "taxonomy": len(self.head.labels),
            "counts": self.counts,
            "best_epoch": self.training.best_epoch,
            "best_val_macro_f1": self.training.best_val_macro_f1,
            "val": self.val.to_dict(),
            "test": self.test.to_dict() if self.test else None,
            "zero_shot_test": self.zero_shot_test.to_dict() if self.zero_shot_test else None,
            "test_gain": list(self.test_gain) if self.test_gain else None,
        }


def _predict(head: Head, embeddings: np.ndarray) -> list[str]:
    if len(embeddings) == 0:
        return []
    return [head.labels[k] for k in head.predict_proba(embeddings).argmax(axis=1)]


def example_training_set(encoder: Encoder, taxonomy: int) -> tuple[np.ndarray, list[str]]:
    """Embeddings and labels of the taxonomy's descriptions and example requests."""
    mapping = merge_map(taxonomy)
    texts = prototype_texts(encoder)
    flat = [text for group in texts.values() for text in group]
    labels = [mapping[label] for label, group in texts.items() for _ in group]
    return encoder.encode(flat), labels


def fit(
    examples: list[Example],
    encoder: Encoder,
    taxonomy: int = 30,
    config: TrainConfig | None = None,
    with_examples: bool = True,
    seed: int = 0,
) -> FitResult:
    """Train and evaluate a ``taxonomy``-class head on labelled examples (see module doc)."""
    labels = TAXONOMIES[taxonomy]
    splits = np.asarray(assign_splits(examples, seed))
    intents = np.asarray([e.intent for e in examples], dtype=object)
    zero = zero_shot_head(encoder)
    classifier = IntentClassifier(encoder, zero, taxonomy)
    embeddings = classifier.embed([e.window for e in examples])
    part = {name: splits == name for name in ("train", "val", "test")}
    train_x, train_y = embeddings[part["train"]], list(intents[part["train"]])
    if with_examples:
        extra_x, extra_y = example_training_set(encoder, taxonomy)
        train_x, train_y = np.concatenate([train_x, extra_x]), train_y + extra_y
    val_x, val_y = embeddings[part["val"]], list(intents[part["val"]])
    training = train_head(
        train_x, train_y, val_x, val_y, labels, encoder.info.name, config or TrainConfig(seed=seed)
    )
    head = training.head
    val = report(val_y, _predict(head, val_x), labels)
    test = zero_test = gain = None
    if part["test"].any():
        test_x, test_y = embeddings[part["test"]], list(intents[part["test"]])
        trained_pred = _predict(head, test_x)
        zero_pred = _predict(at_taxonomy(zero, taxonomy), test_x)
        test = report(test_y, trained_pred, labels)
        zero_test = report(test_y, zero_pred, labels)
        gain = paired_difference(test_y, trained_pred, zero_pred)
    counts = {name: int(mask.sum()) for name, mask in part.items()}
    counts["train_examples_added"] = len(train_y) - counts["train"]
    head.metrics = {
        "val_accuracy": val.accuracy,
        "val_macro_f1": val.macro_f1,
        "test_accuracy": test.accuracy if test else None,
        "test_macro_f1": test.macro_f1 if test else None,
        "best_epoch": training.best_epoch,
        "counts": counts,
    }
    return FitResult(head, training, counts, val, test, zero_test, gain)


def fit_file(
    path: str | Path,
    encoder: Encoder,
    taxonomy: int = 30,
    config: TrainConfig | None = None,
    with_examples: bool = True,
    seed: int = 0,
) -> FitResult:
    """:func:`fit` on a labelled JSONL file (labels merged to ``taxonomy``)."""
    return fit(read_examples(path, taxonomy), encoder, taxonomy, config, with_examples, seed)
