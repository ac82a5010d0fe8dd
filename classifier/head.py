"""Classifier heads over frozen embeddings, and their file format.

A head maps l2-normalised embeddings (n, d) to class probabilities (n, K). Two kinds:

- ``mlp``: the trained head of SPEC section 7, LayerNorm -> Linear(d, 2048) -> GELU -> Dropout
  -> Linear(2048, 1024) -> GELU -> Dropout -> Linear(1024, K);
- ``prototype``: the zero-shot head (:mod:`kvcast.classifier.zeroshot`), cosine similarity to one
  prototype embedding per class, softmax with a fixed scale.

Files are safetensors (fp16 weights) whose metadata names the backbone and its dimension, the
labels and the taxonomy size; :func:`load_head` refuses a head made for another backbone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from kvcast.classifier.backbone import BackboneInfo
from kvcast.stats.taxonomy import TAXONOMIES, merge_map

HIDDEN = (2048, 1024)
DROPOUT = 0.25
FORMAT_VERSION = "1"


class HeadMismatch(ValueError):
    """A head file made for another backbone (name or embedding dimension) or malformed."""


class Head(Protocol):
    """Embeddings (n, dim) -> probabilities (n, len(labels)), rows summing to 1."""

    kind: str
    labels: tuple[str, ...]
    backbone: str
    dim: int

    def predict_proba(self, embeddings: np.ndarray) -> np.ndarray: ...


def build_mlp(dim: int, classes: int, dropout: float = DROPOUT) -> Any:
    """The SPEC section 7 MLP as a ``torch.nn.Sequential`` (imports torch)."""
    from torch import nn

    return nn.Sequential(
        nn.LayerNorm(dim),
        nn.Linear(dim, HIDDEN[0]),
        nn.GELU(),
        nn.Dropout(dropout),
        nn.Linear(HIDDEN[0], HIDDEN[1]),
        nn.GELU(),
        nn.Dropout(dropout),
        nn.Linear(HIDDEN[1], classes),
    )


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


@dataclass
class MLPHead:
    """The trained head: a torch MLP in eval mode (fp16 on a GPU)."""

    module: Any
    labels: tuple[str, ...]
    backbone: str
    dim: int
    metrics: dict[str, Any] = field(default_factory=dict)
    kind: str = "mlp"

    def to(self, device: str) -> MLPHead:
        """Move to ``device`` (half precision on CUDA); returns self."""
        self.module.to(device)
        if str(device).startswith("cuda"):
            self.module.half()
        self.module.eval()
        return self

    def predict_proba(self, embeddings: np.ndarray) -> np.ndarray:
        import torch

        param = next(self.module.parameters())
        with torch.inference_mode():
            x = torch.as_tensor(embeddings, device=param.device, dtype=param.dtype)
            logits = self.module(x).float().cpu().numpy()
        return _softmax(logits)

    def tensors(self) -> dict[str, np.ndarray]:
        return {
            name: value.detach().float().cpu().numpy().astype(np.float16)
            for name, value in self.module.state_dict().items()
        }


@dataclass
class PrototypeHead:
    """Zero-shot head: softmax(scale * cosine(embedding, class prototype)). numpy only."""

    prototypes: np.ndarray
    labels: tuple[str, ...]
    backbone: str
    dim: int
    scale: float = 30.0
    metrics: dict[str, Any] = field(default_factory=dict)
    kind: str = "prototype"

    def predict_proba(self, embeddings: np.ndarray) -> np.ndarray:
        return _softmax(self.scale * (np.asarray(embeddings, np.float32) @ self.prototypes.T))

    def tensors(self) -> dict[str, np.ndarray]:
        return {"prototypes": self.prototypes.astype(np.float16)}


@dataclass
class MergedHead:
    """A head read at a coarser taxonomy: probabilities of merged classes add up."""

    inner: Head
    size: int
    kind: str = "merged"
    labels: tuple[str, ...] = ()
    backbone: str = ""
    dim: int = 0
    _matrix: np.ndarray | None = None

    def __post_init__(self) -> None:
        mapping = merge_map(self.size)
        unknown = [label for label in self.inner.labels if label not in mapping]
        if unknown:
            raise HeadMismatch(f"head labels {unknown[:3]} are not 30-category labels")
        self.labels = TAXONOMIES[self.size]
        self.backbone, self.dim = self.inner.backbone, self.inner.dim
        column = {label: k for k, label in enumerate(self.labels)}
        matrix = np.zeros((len(self.inner.labels), len(self.labels)), dtype=np.float32)
        for row, label in enumerate(self.inner.labels):
            matrix[row, column[mapping[label]]] = 1.0
        self._matrix = matrix

    def predict_proba(self, embeddings: np.ndarray) -> np.ndarray:
        assert self._matrix is not None
        return self.inner.predict_proba(embeddings) @ self._matrix


def at_taxonomy(head: Head, size: int) -> Head:
    """``head`` answering in the ``size``-category taxonomy (merging a 30-class head)."""
    if len(head.labels) == size:
        return head
    if len(head.labels) == 30:
        return MergedHead(head, size)
    raise HeadMismatch(f"a {len(head.labels)}-class head cannot answer in {size} classes")


def check_backbone(backbone: str, dim: int, info: BackboneInfo) -> None:
    """Raise :class:`HeadMismatch` unless a head made for (``backbone``, ``dim``) fits ``info``."""
    if dim != info.dim:
        raise HeadMismatch(
            f"head expects {dim}-dim embeddings from {backbone}; "
            f"backbone {info.name} gives {info.dim}"
        )
    if backbone != info.name:
        raise HeadMismatch(f"head was made for backbone {backbone}, not {info.name}")


def save_head(head: MLPHead | PrototypeHead, path: str | Path) -> Path:
    """Write ``head`` as safetensors (fp16) with its backbone, dimension and labels."""
    from safetensors.numpy import save_file

    meta = {
        "format": f"kvcast-head/{FORMAT_VERSION}",
        "kind": head.kind,
        "backbone": head.backbone,
        "dim": str(head.dim),
        "labels": json.dumps(list(head.labels)),
        "taxonomy": str(len(head.labels)),
        "metrics": json.dumps(head.metrics),
    }
    if isinstance(head, PrototypeHead):
        meta["scale"] = repr(head.scale)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    save_file(head.tensors(), str(target), metadata=meta)
    return target


def read_metadata(path: str | Path) -> dict[str, str]:
    """The metadata of a head file (no tensors loaded)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="np") as handle:
        meta = handle.metadata() or {}
    if not meta.get("format", "").startswith("kvcast-head/"):
        raise HeadMismatch(f"{path} is not a kvcast head file")
    return meta


def load_head(
    path: str | Path, backbone: BackboneInfo | None = None, device: str = "cpu"
) -> MLPHead | PrototypeHead:
    """Read a head; with ``backbone`` given, refuse one made for another backbone."""
    from safetensors.numpy import load_file

    meta = read_metadata(path)
    labels = tuple(json.loads(meta["labels"]))
    dim = int(meta["dim"])
    if backbone is not None:
        check_backbone(meta["backbone"], dim, backbone)
    metrics = json.loads(meta.get("metrics", "{}"))
    tensors = load_file(str(path))
    head: MLPHead | PrototypeHead
    if meta["kind"] == "prototype":
        protos = tensors["prototypes"].astype(np.float32)
        head = PrototypeHead(protos, labels, meta["backbone"], dim, float(meta["scale"]), metrics)
    elif meta["kind"] == "mlp":
        import torch

        module = build_mlp(dim, len(labels))
        state = {name: torch.from_numpy(v.astype(np.float32)) for name, v in tensors.items()}
        module.load_state_dict(state)
        head = MLPHead(module, labels, meta["backbone"], dim, metrics).to(device)
    else:
        raise HeadMismatch(f"unknown head kind {meta['kind']!r} in {path}")
    return head
