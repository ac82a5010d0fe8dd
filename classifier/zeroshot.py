"""The zero-shot head: one prototype embedding per category, from its description and examples.

Used when no trained head is configured. A category's prototype is the normalised mean of the
embedding of its description (``"<label words>: <description>"``) and the embeddings of its
example requests (rendered exactly like classifier inputs, turn marker and query prefix
included), so a request lands nearest to the category whose examples it resembles.
"""

from __future__ import annotations

import numpy as np

from kvcast.classifier.backbone import Encoder
from kvcast.classifier.examples import EXAMPLES
from kvcast.classifier.head import PrototypeHead
from kvcast.classifier.inputs import render, single
from kvcast.stats.taxonomy import INTENTS_30

DESCRIPTION_WEIGHT = 1.0
"""Weight of the description among the (unit-weight) examples in a prototype."""

SCALE = 30.0
"""Softmax scale on cosine similarities (1 / temperature): sets confidence, not the argmax."""


def description_text(label: str) -> str:
    """The text embedded for a category's description."""
    return f"{label.replace('_', ' ')}: {INTENTS_30[label]}"


def prototype_texts(encoder: Encoder) -> dict[str, list[str]]:
    """Per category: its description text, then its examples rendered as inputs."""
    info = encoder.info
    out: dict[str, list[str]] = {}
    for label in INTENTS_30:
        examples = [
            render(
                single(text),
                info.query_prefix,
                info.max_tokens,
                encoder.token_spans,
                info.special_tokens,
            )
            for text in EXAMPLES[label]
        ]
        out[label] = [description_text(label), *examples]
    return out


def zero_shot_head(encoder: Encoder, scale: float = SCALE) -> PrototypeHead:
    """Build the 30-category zero-shot head for ``encoder`` (one batch of ~150 texts)."""
    texts = prototype_texts(encoder)
    flat = [text for group in texts.values() for text in group]
    embeddings = encoder.encode(flat, batch_size=64)
    prototypes = np.zeros((len(texts), encoder.info.dim), dtype=np.float32)
    start = 0
    for row, group in enumerate(texts.values()):
        block = embeddings[start : start + len(group)]
        weights = np.ones(len(group), dtype=np.float32)
        weights[0] = DESCRIPTION_WEIGHT
        mean = (weights[:, None] * block).sum(axis=0)
        prototypes[row] = mean / max(float(np.linalg.norm(mean)), 1e-12)
        start += len(group)
    return PrototypeHead(prototypes, tuple(texts), encoder.info.name, encoder.info.dim, scale)
