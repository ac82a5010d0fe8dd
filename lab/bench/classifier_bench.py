"""Classifier benchmark: the worker against the bare encoder, and latency by batch size.

Throughput baseline: the backbone's forward pass alone (``encoder.encode``, one call per
batch) over the same rendered texts at the same batch size, in the same run; the worker's
figure includes input rendering, queueing, batching, the head and the hand-back, so the ratio
is the worker's overhead. Latency: rounds of ``b`` requests submitted at once (b = 1, 10,
100), each request's time from submit to answer; the IAC paper's table 3 anchor is 19.6 ms p50
at batch 100 on an A100 with e5-large-instruct (0.2 ms per request).
"""

from __future__ import annotations

import statistics
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
    encoder_per_s: float  # encode() batch by batch, as the worker's batches come
    worker_per_s: float
    worker_vs_encoder: float  # median over rounds of each round's worker / encoder
    encoder_one_call_per_s: float = 0.0  # one encode() over all texts (sorted by length)
    latency: list[LatencyRow] = field(default_factory=list)
    fallbacks: int = 0

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(benchmark, figure, baseline, ratio) rows for the benchmark table."""
        where = f"{self.backbone.split('/')[-1]}, {self.device}"
        base = f"{self.encoder_per_s:,.0f} texts/s (encoder forward, batch {self.batch})"
        rows = [
            (
                f"classifier worker ({where}, batch {self.batch})",
                f"{self.worker_per_s:,.0f} texts/s",
                base,
                f"{self.worker_vs_encoder:.2f}",
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
            "worker_vs_encoder": self.worker_vs_encoder,
            "encoder_one_call_per_s": self.encoder_one_call_per_s,
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
    rounds: int = 5,
) -> ClassifierBenchResult:
    """Time the worker and the bare encoder; ``classifier`` defaults to :func:`load_classifier`.

    ``latency_requests`` bounds the requests per latency batch size (at least one round each);
    throughput figures are medians of ``rounds`` rounds (encoder and worker back to back).
    """
    if classifier is None:
        from kvcast.classifier.model import load_classifier

        classifier = load_classifier()
    windows = bench_windows(texts)
    rendered = [classifier.render(window) for window in windows]
    classifier.encoder.encode(rendered[:batch], batch_size=batch)  # warm-up
    classifier.batch_size = batch
    # The baseline encodes batch by batch, as the worker must: one encode() call over all the
    # texts sorts them by length first, so its batches carry less padding than any batch a
    # worker can form from requests as they come (138-160 vs 116-134 texts/s here, MiniLM,
    # CPU); that call is kept as a figure, not as the baseline.
    # Each round times the encoder and then the worker back to back; the figures are medians
    # over the rounds and the ratio the median of each round's own ratio, so that the shared
    # CPU's load (it moves a batch's time by 30 % here) drifting between rounds cancels out.
    batches = [rendered[start : start + batch] for start in range(0, len(rendered), batch)]
    encoder_rates, worker_rates, one_call_rates = [], [], []
    for _ in range(rounds):
        started = time.perf_counter()
        for texts_of_batch in batches:
            classifier.encoder.encode(texts_of_batch, batch_size=batch)
        encoder_rates.append(len(rendered) / (time.perf_counter() - started))
        worker_rates.append(_worker_rate(classifier, windows, batch))
        started = time.perf_counter()
        classifier.encoder.encode(rendered, batch_size=batch)
        one_call_rates.append(len(rendered) / (time.perf_counter() - started))
    ratios = [w / e for w, e in zip(worker_rates, encoder_rates, strict=True)]
    result = ClassifierBenchResult(
        backbone=classifier.encoder.info.name,
        device=classifier.encoder.device,
        batch=batch,
        texts=texts,
        encoder_per_s=statistics.median(encoder_rates),
        worker_per_s=statistics.median(worker_rates),
        worker_vs_encoder=statistics.median(ratios),
        encoder_one_call_per_s=statistics.median(one_call_rates),
    )
    for size in latency_batches:
        classifier.batch_size = size
        row, fallbacks = _latency(classifier, size, max(1, latency_requests // size))
        result.latency.append(row)
        result.fallbacks += fallbacks
    return result
