"""Worker mechanics with a slow fake classifier: batching, back-pressure, latency budget."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import pytest

from kvcast.classifier.inputs import Window
from kvcast.classifier.model import Prediction
from kvcast.classifier.worker import Worker
from kvcast.lab.bench.processes import wait_until
from kvcast.stats.events import Event
from kvcast.stats.taxonomy import UNKNOWN


class SlowFake:
    """Labels a window by its last text; sleeps ``delay_s`` per batch; records batch sizes."""

    def __init__(self, delay_s: float = 0.0, fail: bool = False) -> None:
        self.delay_s = delay_s
        self.fail = fail
        self.batches: list[int] = []
        self.gate = threading.Event()
        self.gate.set()

    def predict(self, windows: Sequence[Window]) -> list[Prediction]:
        self.gate.wait()
        if self.fail:
            raise RuntimeError("boom")
        self.batches.append(len(windows))
        time.sleep(self.delay_s)
        return [Prediction(f"label:{w[-1][1]}", 0.9) for w in windows]


def test_batches_form_under_load_and_answers_match_requests() -> None:
    fake = SlowFake(delay_s=0.01)
    with Worker(fake, max_batch=16, max_wait_s=0.01, budget_s=5.0) as worker:
        fake.batches.clear()
        answers = worker.classify_many([[(1, f"t{k}")] for k in range(64)])
    assert [a.intent for a in answers] == [f"label:t{k}" for k in range(64)]
    assert max(fake.batches) > 1 and max(fake.batches) <= 16
    assert worker.stats.completed == 64 and worker.stats.fallbacks == 0


def test_full_queue_pushes_back_with_unknown() -> None:
    fake = SlowFake()
    got: list[str] = []
    with Worker(fake, max_batch=1, queue_size=2, budget_s=5.0) as worker:
        fake.gate.clear()  # the worker blocks inside its first batch
        worker.submit([(1, "first")], lambda p: got.append(p.intent))
        # The worker has taken it out of the queue (not a fixed pause: a loaded machine may
        # not have run the worker thread yet, and the queue would then hold three).
        wait_until(lambda: worker.queued == 0, 30, "the worker to take the first request")
        tickets = [worker.submit([(1, f"q{k}")], lambda p: got.append(p.intent)) for k in range(4)]
        assert tickets[2] is None and tickets[3] is None  # queue of two is full
        assert got.count(UNKNOWN) == 2 and worker.stats.rejected == 2
        fake.gate.set()
    assert worker.stats.rejected == 2 and len(got) == 5 and got.count(UNKNOWN) == 2


def test_latency_budget_falls_back_to_unknown_and_counts_it() -> None:
    """The classifier hangs until the test releases it: every answer that comes back before
    that came from the budget (0.05 s), whether its request sat in the hung batch or behind it."""
    fake = SlowFake()
    with Worker(fake, max_batch=4, budget_s=0.05) as worker:
        fake.batches.clear()  # the warm-up batch
        fake.gate.clear()
        started = time.monotonic()
        answer = worker.classify([(1, "slow")])
        waited = time.monotonic() - started
        assert answer.intent == UNKNOWN and fake.batches == []  # the classifier never answered
        assert waited < 1.0, waited  # about the budget; without one it waits for the release
        assert worker.stats.timed_out == 1
        answers = worker.classify_many([[(1, "a")], [(1, "b")]])
        assert [a.intent for a in answers] == [UNKNOWN, UNKNOWN] and fake.batches == []
        fake.gate.set()
    assert worker.stats.timed_out == 3


def test_classifier_failure_answers_unknown() -> None:
    with Worker(SlowFake(fail=True), budget_s=1.0).start(warmup=False) as worker:
        assert worker.classify([(1, "x")]).intent == UNKNOWN
    assert worker.stats.failed == 1


def test_classify_event_uses_session_memory_and_unknown_without_text() -> None:
    with Worker(SlowFake(), budget_s=2.0) as worker:
        ev = Event("s", 1, 0.0, 10, 1, "s-1", prompt="hello")
        assert worker.classify_event(ev) == "label:hello"
        ev2 = Event("s", 2, 5.0, 10, 1, "s-2", prompt="second")
        assert worker.classify_event(ev2) == "label:second"
        assert worker.memory.window("s", 2) == [(1, "hello"), (2, "second")]
        assert worker.classify_event(Event("t", 1, 6.0, 10, 1, "t-1")) == UNKNOWN


def test_hooks_see_every_answer_and_batch() -> None:
    latencies: list[float] = []
    sizes: list[int] = []
    worker = Worker(
        SlowFake(),
        budget_s=2.0,
        on_latency=latencies.append,
        on_batch=lambda n, s: sizes.append(n),
    )
    with worker:
        worker.classify_many([[(1, "a")], [(1, "b")], [(1, "c")]])
    assert len(latencies) == 3 and sum(sizes) == 3 and all(x >= 0 for x in latencies)


def test_submit_before_start_is_an_error() -> None:
    with pytest.raises(RuntimeError):
        Worker(SlowFake()).submit([(1, "x")])
