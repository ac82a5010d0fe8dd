"""A classifier that hangs or throws, inside the daemon loop (in-process, memory store).

The consumer must never wait longer than the budget per poll, every event still counts (as
``unknown``), the fallbacks are counted by reason, and shutdown must not hang on the worker.
The statistics then equal the reference with every unlabelled event ``unknown``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import orjson
import pytest

from kvcast.classifier.inputs import Window
from kvcast.classifier.model import Prediction
from kvcast.classifier.worker import Worker
from kvcast.daemon.classification import ClassifierStage, LatencyHistogram
from kvcast.daemon.publisher import Publisher
from kvcast.daemon.runner import Daemon
from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.sources import ReplaySource
from kvcast.daemon.stores.memory import MemoryStore
from kvcast.exporters.metrics import build_registry
from kvcast.stats.config import StatsConfig
from kvcast.stats.engine import StatsEngine
from kvcast.stats.labeller import IntentLabeller
from kvcast.stats.replay import Pipeline
from kvcast.stats.snapshot import take_snapshot
from tests.reliability.tally import TALLY

STATS = StatsConfig(completion_timeout_s=600, allowed_lateness_s=30)
BUDGET_S = 0.05


class FaultyClassifier:
    """Answers the warm-up, then hangs (until released) or raises on every batch."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.calls = 0
        self.release = threading.Event()

    def predict(self, windows: Sequence[Window]) -> list[Prediction]:
        self.calls += 1
        if self.calls > 1:
            if self.mode == "hang":
                self.release.wait()
            else:
                raise RuntimeError("injected classifier failure")
        return [Prediction("chitchat", 1.0) for _ in windows]


def lines(count: int = 3000) -> list[bytes]:
    out = []
    for n in range(count // 3):
        for turn in (1, 2, 3):
            out.append(orjson.dumps({
                "session_id": f"s{n}", "turn": turn, "timestamp": n * 2.0 + turn * 40.0,
                "input_tokens": 100 * turn, "output_tokens": 20, "prompt": f"question {n}",
            }))  # fmt: skip
    return sorted(out, key=lambda line: orjson.loads(line)["timestamp"])


def reference(payloads: list[bytes]) -> StatsEngine:
    pipeline = Pipeline(STATS)
    pipeline.offer_all(payloads)
    pipeline.engine.finish()
    return pipeline.engine


@pytest.mark.parametrize("mode", ["hang", "throw"])
def test_a_hanging_or_throwing_classifier_costs_the_budget_and_loses_nothing(mode: str) -> None:
    payloads = lines()
    classifier = FaultyClassifier(mode)
    histogram = LatencyHistogram()
    worker = Worker(classifier, budget_s=BUDGET_S, queue_size=256, on_latency=histogram.observe)
    stage = ClassifierStage(worker.start(), histogram)
    settings = DaemonSettings(
        stats=STATS, commit_interval_s=0.01, refresh_interval_s=0.05, table_interval_s=0.01,
        status_interval_s=60, classifier_budget_s=BUDGET_S,
    )  # fmt: skip
    store = MemoryStore()
    source = ReplaySource(payloads, partition="p:0")
    publisher = Publisher(settings, store, source.health, extra_metrics=[stage.metrics])
    daemon = Daemon(settings, store, source, publisher,
                    labeller=IntentLabeller(classify_batch=stage.classify_batch))  # fmt: skip
    started = time.monotonic()
    thread = threading.Thread(target=daemon.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not (daemon._flushed and not daemon._uncommitted()):
            assert time.monotonic() < deadline, "the daemon stalled behind the classifier"
            time.sleep(0.02)
        elapsed = time.monotonic() - started
        # One budget per poll (at most 2000 records each), plus the loop's own work.
        assert elapsed < 10, elapsed
        daemon.request_stop()
        thread.join(timeout=10)
        assert not thread.is_alive()
        closing = time.monotonic()
        closer = threading.Thread(target=stage.close, daemon=True)
        closer.start()
        closer.join(timeout=8)
        assert not closer.is_alive(), "closing the classifier stage hung on the stuck worker"
        assert time.monotonic() - closing < 8
    finally:
        classifier.release.set()
    state = store.load_window(STATS)
    snap = take_snapshot(state.window, state.arrivals, STATS, state.newest_event_time)
    expected = reference(payloads)
    differences = int(snap.states != expected.snapshot().states)
    differences += int(state.counters.processed != expected.counters.processed)
    TALLY.add(faults=1, events_compared=len(payloads), differences=differences)
    assert snap.states == expected.snapshot().states
    assert state.counters.processed == len(payloads)
    assert {s.intent for s in snap.states} == {"unknown"}
    registry = build_registry(publisher.published.metrics_view)
    reasons = ("timed_out", "rejected", "expired") if mode == "hang" else ("failed",)
    fallbacks = sum(
        registry.get_sample_value("kvcast_classifier_fallbacks_total", {"reason": r}) or 0
        for r in reasons
    )
    assert fallbacks > 0
