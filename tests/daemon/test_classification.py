"""The classifier inside the daemon: a poll's events labelled together, within the budget."""

from __future__ import annotations

import re
import signal
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

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
from kvcast.lab.bench.processes import DaemonProcess, wait_until
from kvcast.stats.config import StatsConfig
from kvcast.stats.events import parse_event
from kvcast.stats.labeller import IntentLabeller


class KeywordClassifier:
    """Labels a window by a keyword of its last message; counts batch sizes."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.batches: list[int] = []

    def predict(self, windows: Sequence[Window]) -> list[Prediction]:
        self.batches.append(len(windows))
        time.sleep(self.delay_s)
        return [
            Prediction("code_debugging" if "bug" in w[-1][1] else "chitchat", 0.9) for w in windows
        ]


def lines(count: int) -> list[bytes]:
    out = []
    for n in range(count):
        text = "fix this bug please" if n % 2 else "hello there, how are you"
        for turn in (1, 2):
            out.append(
                orjson.dumps(
                    {"session_id": f"s{n}", "turn": turn, "timestamp": n * 10.0 + turn * 5,
                     "input_tokens": 100 * turn, "output_tokens": 20, "prompt": text}
                )
            )  # fmt: skip
    given = {**orjson.loads(out[0]), "session_id": "given", "intent": "travel_planning"}
    out.append(orjson.dumps(given))
    return sorted(out, key=lambda line: orjson.loads(line)["timestamp"])


def run_daemon(classifier: KeywordClassifier, budget_s: float, payloads: list[bytes]):
    settings = DaemonSettings(
        stats=StatsConfig(completion_timeout_s=60, allowed_lateness_s=5),
        commit_interval_s=0.01, refresh_interval_s=0.05, table_interval_s=0.01,
        status_interval_s=60, classifier_budget_s=budget_s,
    )  # fmt: skip
    histogram = LatencyHistogram()
    worker = Worker(classifier, budget_s=budget_s, on_latency=histogram.observe).start()
    stage = ClassifierStage(worker, histogram)
    store = MemoryStore()
    source = ReplaySource(payloads, partition="p:0")
    publisher = Publisher(settings, store, source.health, extra_metrics=[stage.metrics])
    daemon = Daemon(
        settings, store, source, publisher,
        labeller=IntentLabeller(classify_batch=stage.classify_batch),
    )  # fmt: skip
    thread = threading.Thread(target=daemon.run)
    thread.start()
    deadline = time.monotonic() + 20
    while not (daemon._flushed and not daemon._uncommitted()) and time.monotonic() < deadline:
        time.sleep(0.02)
    daemon.request_stop()
    thread.join(timeout=10)
    stage.close()
    return store, publisher, classifier


def test_events_without_intent_are_classified_in_poll_batches() -> None:
    store, publisher, classifier = run_daemon(KeywordClassifier(), 5.0, lines(100))
    table = store.read_table()
    intents = {state["intent"] for state in table["states"]}
    assert intents == {"code_debugging", "chitchat", "travel_planning"}
    assert max(classifier.batches) > 50  # one batch per poll, not one call per event
    metrics = build_registry(publisher.published.metrics_view)
    assert metrics.get_sample_value("kvcast_classifier_latency_seconds_count") == 200
    assert (
        metrics.get_sample_value("kvcast_classifier_fallbacks_total", {"reason": "timed_out"}) == 0
    )


def test_a_slow_classifier_costs_at_most_the_budget_and_yields_unknown() -> None:
    started = time.monotonic()
    store, publisher, _ = run_daemon(KeywordClassifier(delay_s=2.0), 0.05, lines(50))
    assert time.monotonic() - started < 10
    table = store.read_table()
    assert "unknown" in {state["intent"] for state in table["states"]}
    metrics = build_registry(publisher.published.metrics_view)
    assert (
        metrics.get_sample_value("kvcast_classifier_fallbacks_total", {"reason": "timed_out"}) > 0
    )


@pytest.mark.slow
def test_run_with_the_packaged_model_labels_prompts(tmp_path: Path) -> None:
    log_file = tmp_path / "events.jsonl"
    texts = [
        "Can you fix this Python error: TypeError in my loop?",
        "Translate 'good morning' to French",
    ]
    events = [
        {"session_id": f"s{n}", "turn": 1, "timestamp": float(n), "input_tokens": 50,
         "output_tokens": 10, "prompt": texts[n % 2]}
        for n in range(40)
    ]  # fmt: skip
    log_file.write_bytes(b"\n".join(orjson.dumps(e) for e in events))
    daemon = DaemonProcess(
        ["--source", f"file://{log_file}", "--classifier", "on", "--classifier-budget", "30",
         "--metrics-addr", "127.0.0.1:0", "--refresh-interval", "0.3"],
        tmp_path / "daemon.log",
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        table = None
        while time.monotonic() < deadline:
            try:
                table = daemon.get("/v1/table")
                if table.get("window_conversations") == 40:
                    break
            except urllib.error.HTTPError:
                pass
            time.sleep(0.3)
        assert table is not None and table["window_conversations"] == 40, daemon.log.read_text()
        intents = {state["intent"] for state in table["states"]}
        assert "unknown" not in intents and len(intents) >= 2
        metrics = urllib.request.urlopen(daemon.url + "/metrics", timeout=5).read().decode()
        assert re.search(r"kvcast_classifier_latency_seconds_count 40\.0", metrics)
        assert "Translate" not in metrics and "TypeError" not in metrics  # no user text
    finally:
        assert daemon.stop(signal.SIGTERM) == 0


def test_given_intents_skip_the_classifier() -> None:
    calls: list[int] = []
    labeller = IntentLabeller(classify_batch=lambda events: calls.append(len(events)) or [])
    event = parse_event({"session_id": "s", "turn": 1, "timestamp": 1.0, "input_tokens": 1,
                         "output_tokens": 1, "intent": "chitchat"})  # fmt: skip
    assert labeller.label_batch([event]) == ["chitchat"] and calls == []


def torch_mapped(pid: int) -> bool:
    """Whether the process has torch's shared library mapped: the classifier was loaded."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.slow
def test_auto_loads_the_classifier_only_when_an_event_needs_it(tmp_path: Path) -> None:
    """``--classifier auto`` (the default) on a stream whose events all carry intents never
    loads the model (before: 12 s before HTTP answered, and torch's memory); the first event
    without one loads it, in the same process, and it labels that event."""
    log_file = tmp_path / "events.jsonl"
    events = [
        {"session_id": f"s{n}", "turn": 1, "timestamp": float(n), "input_tokens": 50,
         "output_tokens": 5, "intent": "translation", "prompt": "Translate: good morning"}
        for n in range(40)
    ]  # fmt: skip
    log_file.write_bytes(b"\n".join(orjson.dumps(e) for e in events) + b"\n")
    daemon = DaemonProcess(
        ["--source", f"file://{log_file}", "--metrics-addr", "127.0.0.1:0",
         "--commit-interval", "0.2", "--refresh-interval", "0.3"],
        tmp_path / "daemon.log",
    )  # fmt: skip
    try:
        wait_until(lambda: daemon.get("/v1/status")["processed"] == 40, 60, "40 events")
        assert not torch_mapped(daemon.process.pid), daemon.text()
        assert "loading the classifier" not in daemon.text()
    finally:
        assert daemon.stop(signal.SIGTERM) == 0
    untagged = {**events[0], "session_id": "x", "timestamp": 100.0}
    del untagged["intent"]
    log_file.write_bytes(log_file.read_bytes() + orjson.dumps(untagged) + b"\n")
    daemon = DaemonProcess(
        ["--source", f"file://{log_file}", "--metrics-addr", "127.0.0.1:0",
         "--commit-interval", "0.2", "--refresh-interval", "0.3", "--classifier-budget", "60"],
        tmp_path / "daemon-2.log",
    )  # fmt: skip
    try:
        wait_until(lambda: daemon.get("/v1/status")["processed"] == 41, 120, "41 events")
        assert "an event without an intent: loading the classifier" in daemon.text()
        assert torch_mapped(daemon.process.pid), daemon.text()
        metrics = urllib.request.urlopen(daemon.url + "/metrics", timeout=5).read().decode()
        assert re.search(r"kvcast_classifier_latency_seconds_count 1\.0", metrics), metrics
    finally:
        assert daemon.stop(signal.SIGTERM) == 0
