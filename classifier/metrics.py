"""Classification metrics: accuracy, macro-F1, per-class precision/recall/F1, sampling error.

Pure numpy. Macro-F1 averages the F1 of the classes of ``labels`` that occur in the truth (a
class with no true item is left out of the average; one that occurs but is never predicted
counts 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ClassMetrics:
    """One class: precision, recall, F1 (fractions) and its number of true items."""

    label: str
    precision: float
    recall: float
    f1: float
    support: int


@dataclass(frozen=True)
class Report:
    """Accuracy and macro-F1 (fractions) over ``n`` items, with per-class figures."""

    n: int
    accuracy: float
    macro_f1: float
    per_class: tuple[ClassMetrics, ...]

    @property
    def accuracy_se(self) -> float:
        """Binomial standard error of the accuracy."""
        return math.sqrt(max(self.accuracy * (1 - self.accuracy), 1e-12) / max(self.n, 1))

    def to_dict(self) -> dict:
        return {
            "n": self.n,
            "accuracy": self.accuracy,
            "accuracy_se": self.accuracy_se,
            "macro_f1": self.macro_f1,
            "per_class": {
                c.label: {
                    "precision": c.precision,
                    "recall": c.recall,
                    "f1": c.f1,
                    "support": c.support,
                }
                for c in self.per_class
            },
        }


def report(truth: Sequence[str], predicted: Sequence[str], labels: Sequence[str]) -> Report:
    """Metrics of ``predicted`` against ``truth`` over the classes ``labels``."""
    if len(truth) != len(predicted):
        raise ValueError("truth and predicted differ in length")
    t = np.asarray(truth, dtype=object)
    p = np.asarray(predicted, dtype=object)
    per_class = []
    for label in labels:
        tp = int(np.sum((t == label) & (p == label)))
        support = int(np.sum(t == label))
        predicted_n = int(np.sum(p == label))
        precision = tp / predicted_n if predicted_n else 0.0
        recall = tp / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_class.append(ClassMetrics(label, precision, recall, f1, support))
    present = [c.f1 for c in per_class if c.support > 0]
    accuracy = float(np.mean(t == p)) if len(t) else 0.0
    macro = float(np.mean(present)) if present else 0.0
    return Report(len(t), accuracy, macro, tuple(per_class))


def paired_difference(
    truth: Sequence[str], a: Sequence[str], b: Sequence[str]
) -> tuple[float, float]:
    """Accuracy of ``a`` minus accuracy of ``b`` on the same items, and its standard error.

    The error is that of the mean of per-item differences (correct_a - correct_b), which
    accounts for the two classifiers being scored on the same sample.
    """
    t = np.asarray(truth, dtype=object)
    diff = (np.asarray(a, dtype=object) == t).astype(float) - (
        np.asarray(b, dtype=object) == t
    ).astype(float)
    n = len(diff)
    if n < 2:
        return float(diff.mean()) if n else 0.0, float("inf")
    return float(diff.mean()), float(diff.std(ddof=1) / math.sqrt(n))
