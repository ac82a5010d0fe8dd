"""The intent classifier: backbone + head + input rendering, synchronous and batched.

:func:`load_classifier` picks the backbone (see :mod:`kvcast.classifier.backbone`), then the head:
a configured head file; else the head shipped for that backbone; else the zero-shot head. The
asynchronous, latency-bounded front for the daemon is :class:`kvcast.classifier.worker.Worker`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvcast.classifier.backbone import PACKAGED, Encoder, load_backbone
from kvcast.classifier.head import Head, at_taxonomy, check_backbone, load_head
from kvcast.classifier.inputs import Window, render, single
from kvcast.stats.taxonomy import UNKNOWN

log = logging.getLogger(__name__)

HEADS_DIR = Path(__file__).resolve().parent / "heads"
SHIPPED_HEADS: dict[str, str] = {PACKAGED: "all-MiniLM-L6-v2.intents30.safetensors"}
"""Backbone name -> file in :data:`HEADS_DIR` of the head trained on the project's data."""


@dataclass(frozen=True)
class Prediction:
    """An intent label and the head's probability for it (0..1; 0 for ``unknown``)."""

    intent: str
    confidence: float

    def to_dict(self) -> dict[str, object]:
        return {"intent": self.intent, "confidence": round(self.confidence, 6)}


class IntentClassifier:
    """Classify windows of user messages. Not thread-safe: one caller (or the worker) at a time.

    ``min_confidence``: predictions below it become ``unknown`` (0 disables).
    """

    def __init__(
        self,
        encoder: Encoder,
        head: Head,
        taxonomy: int = 30,
        min_confidence: float = 0.0,
        batch_size: int = 64,
    ) -> None:
        check_backbone(head.backbone, head.dim, encoder.info)
        self.encoder = encoder
        self.head = at_taxonomy(head, taxonomy)
        self.taxonomy = taxonomy
        self.min_confidence = min_confidence
        self.batch_size = batch_size

    @property
    def labels(self) -> tuple[str, ...]:
        return self.head.labels

    def render(self, window: Window) -> str:
        """The backbone input of one window (prefix, turn markers, truncation)."""
        info = self.encoder.info
        spans = self.encoder.token_spans
        return render(window, info.query_prefix, info.max_tokens, spans, info.special_tokens)

    def embed(self, windows: Sequence[Window]) -> np.ndarray:
        """Embeddings (n, dim) of non-empty windows."""
        texts = [self.render(window) for window in windows]
        return self.encoder.encode(texts, batch_size=self.batch_size)

    def decide(self, embeddings: np.ndarray) -> list[Prediction]:
        """Predictions from embeddings (n, dim)."""
        if len(embeddings) == 0:
            return []
        probs = self.head.predict_proba(embeddings)
        best = probs.argmax(axis=1)
        out = []
        for row, k in enumerate(best):
            confidence = float(probs[row, k])
            label = self.head.labels[k] if confidence >= self.min_confidence else UNKNOWN
            out.append(Prediction(label, confidence))
        return out

    def predict(self, windows: Sequence[Window]) -> list[Prediction]:
        """One prediction per window; an empty window is ``unknown`` with confidence 0."""
        filled = [k for k, window in enumerate(windows) if window]
        out = [Prediction(UNKNOWN, 0.0)] * len(windows)
        for k, prediction in zip(
            filled, self.decide(self.embed([windows[k] for k in filled])), strict=True
        ):
            out[k] = prediction
        return out

    def predict_texts(self, texts: Sequence[str]) -> list[Prediction]:
        """Each text classified as a lone first-turn request."""
        return self.predict([single(text) if text.strip() else [] for text in texts])


def shipped_head(backbone: str) -> Path | None:
    """The head file shipped for ``backbone``, when there is one."""
    name = SHIPPED_HEADS.get(backbone)
    path = HEADS_DIR / name if name else None
    return path if path is not None and path.is_file() else None


def load_classifier(
    backbone: str | Path | None = None,
    head: str | Path | None = None,
    taxonomy: int = 30,
    device: str | None = None,
    zero_shot: bool = False,
    min_confidence: float = 0.0,
) -> IntentClassifier:
    """Backbone, then head: ``head`` if given, else the shipped one, else zero-shot.

    ``zero_shot`` forces the zero-shot head. Raises ``HeadMismatch`` for a head made for
    another backbone, ``BackboneUnavailable`` when no backbone can be loaded.
    """
    from kvcast.classifier.zeroshot import zero_shot_head

    encoder = load_backbone(backbone, device)
    chosen: Head
    if zero_shot:
        chosen = zero_shot_head(encoder)
        log.info("classifier head: zero-shot (requested)")
    else:
        path = Path(head) if head is not None else shipped_head(encoder.info.name)
        if path is not None:
            chosen = load_head(path, encoder.info, encoder.device)
            log.info("classifier head: %s (%s, %d classes)", path, chosen.kind, len(chosen.labels))
        else:
            chosen = zero_shot_head(encoder)
            log.info("classifier head: zero-shot (no trained head for %s)", encoder.info.name)
    return IntentClassifier(encoder, chosen, taxonomy, min_confidence)
