"""Training the MLP head on precomputed embeddings (SPEC section 7, IAC appendix A.1).

Cross-entropy, AdamW (lr 3e-3, weight decay 0.01), dropout 0.25, cosine learning-rate schedule
with linear warm-up over the first 5% of steps, up to 25 epochs; the weights of the epoch with
the best validation macro-F1 are kept (ties: the earlier epoch). Deterministic for a seed on CPU.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvcast.classifier.head import DROPOUT, MLPHead, build_mlp
from kvcast.classifier.metrics import report


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings; defaults are the paper's."""

    lr: float = 3e-3
    weight_decay: float = 0.01
    dropout: float = DROPOUT
    epochs: int = 25
    warmup_fraction: float = 0.05
    batch_size: int = 64
    seed: int = 0


@dataclass
class TrainResult:
    """The kept head, the epoch it came from (1-based) and per-epoch (loss, val macro-F1)."""

    head: MLPHead
    best_epoch: int
    best_val_macro_f1: float
    history: list[tuple[float, float]] = field(default_factory=list)


def lr_factor(step: int, total: int, warmup_fraction: float) -> float:
    """Learning-rate multiplier at ``step`` (0-based): linear warm-up, then cosine to 0."""
    warmup = max(1, math.ceil(total * warmup_fraction))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def train_head(
    train_x: np.ndarray,
    train_y: Sequence[str],
    val_x: np.ndarray,
    val_y: Sequence[str],
    labels: Sequence[str],
    backbone: str,
    config: TrainConfig | None = None,
) -> TrainResult:
    """Train a head on embeddings (n, d) with string labels; keep the best validation epoch.

    With an empty validation set the last epoch is kept.
    """
    import torch

    config = config or TrainConfig()
    labels = tuple(labels)
    index = {label: k for k, label in enumerate(labels)}
    unknown = sorted({y for y in (*train_y, *val_y) if y not in index})
    if unknown:
        raise ValueError(f"labels not in the taxonomy: {unknown[:5]}")
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    dim = int(train_x.shape[1])
    module = build_mlp(dim, len(labels), config.dropout)
    x = torch.as_tensor(np.asarray(train_x, np.float32))
    y = torch.as_tensor([index[v] for v in train_y], dtype=torch.long)
    vx = torch.as_tensor(np.asarray(val_x, np.float32))
    steps_per_epoch = max(1, math.ceil(len(x) / config.batch_size))
    total = steps_per_epoch * config.epochs
    optimiser = torch.optim.AdamW(
        module.parameters(), lr=config.lr, weight_decay=config.weight_decay
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda step: lr_factor(step, total, config.warmup_fraction)
    )
    loss_fn = torch.nn.CrossEntropyLoss()
    best_state, best_f1, best_epoch = None, -1.0, 0
    history: list[tuple[float, float]] = []
    for epoch in range(1, config.epochs + 1):
        module.train()
        order = torch.randperm(len(x), generator=generator)
        total_loss = 0.0
        for start in range(0, len(x), config.batch_size):
            batch = order[start : start + config.batch_size]
            optimiser.zero_grad()
            loss = loss_fn(module(x[batch]), y[batch])
            loss.backward()
            optimiser.step()
            schedule.step()
            total_loss += float(loss.detach()) * len(batch)
        module.eval()
        f1 = 0.0
        if len(vx):
            with torch.inference_mode():
                predicted = module(vx).argmax(dim=1).tolist()
            f1 = report(list(val_y), [labels[k] for k in predicted], labels).macro_f1
        history.append((total_loss / len(x), f1))
        if f1 > best_f1 or not len(vx):
            best_state, best_f1, best_epoch = copy.deepcopy(module.state_dict()), f1, epoch
    assert best_state is not None
    module.load_state_dict(best_state)
    module.eval()
    head = MLPHead(module, labels, backbone, dim)
    return TrainResult(head, best_epoch, best_f1, history)
