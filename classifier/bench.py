"""Classifier benchmark: the worker against the bare encoder, and latency by batch size.

Throughput baseline: the backbone's forward pass alone (``encoder.encode``) over the same
rendered texts at the same batch size, in the same run; the worker's figure includes input
rendering, queueing, batching, the head and the hand-back, so the ratio is the worker's
overhead. Latency: rounds of ``b`` requests submitted at once (b = 1, 10, 100), each request's
time from submit to answer; the IAC paper's table 3 anchor is 19.6 ms p50 at batch 100 on an
A100 with e5-large-instruct (0.2 ms per request).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from kvcast.classifier.examples import EXAMPLES
from kvcast.classifier.inputs import Window, single
from kvcast.classifier.model import IntentClassifier, Prediction
from kvcast.classifier.worker import Worker


def bench_windows(count: int) -> list[Window]:
    """``count`` one-message windows cycling through the taxonomy's example requests."""
    texts = [text for group in EXAMPLES.values() for text in group]
    return [single(texts[k % len(texts)]) for k in range(count)]


@dataclass(frozen=True)
class LatencyRow:
    """Per-request latency (ms) of rounds of ``batch`` simultaneous requests."""

    batch: int
    p50_ms: float
    p99_ms: float
    per_request_ms: float
    requests: int


@dataclass
class ClassifierBenchResult:
    """Figures of one run (rates in texts per second)."""

    backbone: str
    device: str
    batch: int
    texts: int
    encoder_per_s: float
    worker_per_s: float
    latency: list[LatencyRow] = field(default_factory=list)
    fallbacks: int = 0

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(benchmark, figure, baseline, ratio) rows for the README table."""
        where = f"{self.backbone.split('/')[-1]}, {self.device}"
        base = f"{self.encoder_per_s:,.0f} texts/s (encoder forward, batch {self.batch})"
        rows = [
            (
                f"classifier worker ({where}, batch {self.batch})",
                f"{self.worker_per_s:,.0f} texts/s",
                base,
                f"{self.worker_per_s / self.encoder_per_s:.2f}",
            )
        ]
        for row in self.latency:
            rows.append(
                (
                    f"classifier latency, batch {row.batch} ({where})",
                    f"p50 {row.p50_ms:.1f} ms, p99 {row.p99_ms:.1f} ms, "
                    f"{row.per_request_ms:.2f} ms/request",
                    f"{1000.0 / self.encoder_per_s:.2f} ms/text (encoder, batch {self.batch})",
                    f"{row.per_request_ms / (1000.0 / self.encoder_per_s):.2f}",
                )
            )
        return rows

    def to_dict(self) -> dict:
        return {
            "backbone": self.backbone,
            "device": self.device,
            "batch": self.batch,
            "texts": self.texts,
            "encoder_per_s": self.encoder_per_s,
            "worker_per_s": self.worker_per_s,
            "worker_vs_encoder": self.worker_per_s / self.encoder_per_s,
            "fallbacks": self.fallbacks,
            "latency": [row.__dict__ for row in self.latency],
        }


def _worker_rate(classifier: IntentClassifier, windows: list[Window], batch: int) -> float:
    done = threading.Event()
    left = [len(windows)]
    lock = threading.Lock()

    def answered(_: Prediction) -> None:
        with lock:
            left[0] -= 1
            if left[0] == 0:
                done.set()

    worker = Worker(classifier, max_batch=batch, max_wait_s=0.002, queue_size=len(windows) + 1)
    worker.budget_s = 3600.0
    with worker:
        started = time.perf_counter()
        for window in windows:
            worker.submit(window, answered)
        done.wait()
        return len(windows) / (time.perf_counter() - started)


def _latency(classifier: IntentClassifier, batch: int, rounds: int) -> tuple[LatencyRow, int]:
    samples: list[float] = []
    worker = Worker(
        classifier,
        max_batch=batch,
        max_wait_s=0.002,
        queue_size=batch + 1,
        budget_s=3600.0,
        on_latency=samples.append,
    )
    windows = bench_windows(batch)
    with worker:
        for _ in range(rounds):
            worker.classify_many(windows)
    ms = np.asarray(samples) * 1000.0
    p50 = float(np.percentile(ms, 50))
    row = LatencyRow(batch, p50, float(np.percentile(ms, 99)), p50 / batch, len(ms))
    return row, worker.stats.fallbacks


def run_classifier_bench(
    classifier: IntentClassifier | None = None,
    batch: int = 100,
    texts: int = 400,
    latency_batches: tuple[int, ...] = (1, 10, 100),
    latency_requests: int = 200,
    rounds: int = 3,
) -> ClassifierBenchResult:
    """Time the worker and the bare encoder; ``classifier`` defaults to :func:`load_classifier`.

    ``latency_requests`` bounds the requests per latency batch size (at least one round each);
    throughput is the best of ``rounds`` alternating rounds.
    """
    if classifier is None:
        from kvcast.classifier.model import load_classifier

        classifier = load_classifier()
    windows = bench_windows(texts)
    rendered = [classifier.render(window) for window in windows]
    classifier.encoder.encode(rendered[:batch], batch_size=batch)  # warm-up
    classifier.batch_size = batch
    # The two take turns in each round and the best round of each counts, so that load drifting
    # during the run (the CPU is shared) biases neither side of the ratio.
    encoder_rate = worker_rate = 0.0
    for _ in range(rounds):
        started = time.perf_counter()
        classifier.encoder.encode(rendered, batch_size=batch)
        encoder_rate = max(encoder_rate, len(rendered) / (time.perf_counter() - started))
        worker_rate = max(worker_rate, _worker_rate(classifier, windows, batch))
    result = ClassifierBenchResult(
        backbone=classifier.encoder.info.name,
        device=classifier.encoder.device,
        batch=batch,
        texts=texts,
        encoder_per_s=encoder_rate,
        worker_per_s=worker_rate,
    )
    for size in latency_batches:
        classifier.batch_size = size
        row, fallbacks = _latency(classifier, size, max(1, latency_requests // size))
        result.latency.append(row)
        result.fallbacks += fallbacks
    return result
