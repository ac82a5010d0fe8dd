"""The batched classifier worker: never lets the classifier slow the consumer down.

Requests go into a bounded queue; one background thread takes them out in batches (up to
``max_batch`` requests, or whatever arrived within ``max_wait_s`` of the batch's first request)
and runs the classifier once per batch. Every request has a deadline, ``budget_s`` after it was
submitted; a request not answered by then is answered ``unknown``. All fallbacks are counted
in :class:`WorkerStats`:

- ``rejected``: the queue was full (back-pressure) and the caller would not wait;
- ``timed_out``: a synchronous caller's budget ran out before the answer;
- ``expired``: a request still queued at its deadline, dropped without being encoded;
- ``failed``: the classifier raised (the whole batch is answered ``unknown``).

Two ways in: :meth:`Worker.submit` (non-blocking, the answer goes to a callback on the worker
thread) and :meth:`Worker.classify` / :meth:`Worker.classify_many` /
:meth:`Worker.classify_event` (block at most ``budget_s``). Only the worker thread touches the
classifier; the session memory belongs to the caller's thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Protocol

from kvcast.classifier.inputs import Window
from kvcast.classifier.memory import SessionMemory
from kvcast.classifier.model import Prediction
from kvcast.stats.events import Event
from kvcast.stats.taxonomy import UNKNOWN

log = logging.getLogger(__name__)

FALLBACK = Prediction(UNKNOWN, 0.0)
Callback = Callable[[Prediction], None]


class Classifier(Protocol):
    """What the worker runs: a batch of windows -> one prediction each."""

    def predict(self, windows: Sequence[Window]) -> list[Prediction]: ...


@dataclass
class WorkerStats:
    """Counters since start (requests unless said otherwise)."""

    submitted: int = 0
    completed: int = 0
    rejected: int = 0
    timed_out: int = 0
    expired: int = 0
    failed: int = 0
    batches: int = 0
    batched_requests: int = 0

    @property
    def fallbacks(self) -> int:
        """Requests answered ``unknown`` because of the worker (not the classifier's choice)."""
        return self.rejected + self.timed_out + self.expired + self.failed

    def to_dict(self) -> dict[str, int]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["fallbacks"] = self.fallbacks
        return out


class Ticket:
    """One pending request; :meth:`wait` returns its prediction or None at the timeout."""

    __slots__ = ("_done", "callback", "cancelled", "deadline", "prediction", "submitted", "window")

    def __init__(self, window: Window, deadline: float, callback: Callback | None) -> None:
        self.window = window
        self.submitted = time.monotonic()
        self.deadline = deadline
        self.callback = callback
        self.cancelled = False
        self.prediction: Prediction | None = None
        self._done = threading.Event()

    def resolve(self, prediction: Prediction) -> None:
        self.prediction = prediction
        self._done.set()
        if self.callback is not None and not self.cancelled:
            try:
                self.callback(prediction)
            except Exception:  # a caller's bug must not kill the worker
                log.exception("classifier callback failed")

    def wait(self, timeout: float) -> Prediction | None:
        return self.prediction if self._done.wait(max(0.0, timeout)) else None


class Worker:
    """Dynamic batching in front of a :class:`Classifier`. Use as a context manager.

    Times are seconds. ``on_latency(seconds)`` is called on the worker thread for every request
    answered by the classifier (submit to answer), ``on_batch(size, seconds)`` for every batch;
    metrics hook in there.
    """

    def __init__(
        self,
        classifier: Classifier,
        max_batch: int = 64,
        max_wait_s: float = 0.005,
        queue_size: int = 1024,
        budget_s: float = 0.05,
        memory: SessionMemory | None = None,
        on_latency: Callable[[float], None] | None = None,
        on_batch: Callable[[int, float], None] | None = None,
    ) -> None:
        if max_batch < 1 or queue_size < 1 or budget_s <= 0 or max_wait_s < 0:
            raise ValueError("max_batch, queue_size >= 1; budget_s > 0; max_wait_s >= 0")
        self.classifier = classifier
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.budget_s = budget_s
        self.memory = memory if memory is not None else SessionMemory()
        self.on_latency = on_latency
        self.on_batch = on_batch
        self.stats = WorkerStats()
        self._queue: queue.Queue[Ticket | None] = queue.Queue(maxsize=queue_size)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopping = False

    # lifecycle -------------------------------------------------------------------------------

    def start(self, warmup: bool = True) -> Worker:
        """Start the worker thread (after one warm-up batch, so the first request is not slow)."""
        if self._thread is not None:
            return self
        if warmup:
            self.classifier.predict([[(1, "hello")]])
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="kvcast-classifier", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop after the queued requests are answered (or expired); join the thread.

        Returns within about ``timeout`` s even when the classifier hangs: a queue still full
        after ``timeout / 2`` is answered ``unknown`` (counted as expired) to make room for
        the stop marker, and the stuck thread (a daemon thread) is left behind.
        """
        if self._thread is None:
            return
        self._stopping = True
        deadline = time.monotonic() + timeout
        try:  # room comes as soon as the worker takes its next batch
            self._queue.put(None, timeout=timeout / 2)
        except queue.Full:  # it does not: the classifier hangs
            while True:
                self._drop_queued()
                try:
                    self._queue.put_nowait(None)
                    break
                except queue.Full:
                    continue
        self._thread.join(max(0.0, deadline - time.monotonic()))
        self._thread = None

    def _drop_queued(self) -> None:
        """Answer every queued request ``unknown`` (counted as expired)."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                self._count("expired")
                item.resolve(FALLBACK)

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def queued(self) -> int:
        """Requests waiting in the queue now."""
        return self._queue.qsize()

    # submitting ------------------------------------------------------------------------------

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + n)

    def submit(
        self, window: Window, callback: Callback | None = None, block_s: float = 0.0
    ) -> Ticket | None:
        """Queue one window; the prediction goes to ``callback`` on the worker thread.

        Waits at most ``block_s`` for room in the queue; when there is none, the request is
        rejected (counted), ``callback`` gets ``unknown`` at once and None is returned.
        """
        if self._thread is None:
            raise RuntimeError("worker not started")
        ticket = Ticket(window, time.monotonic() + self.budget_s, callback)
        self._count("submitted")
        try:
            if block_s > 0:
                self._queue.put(ticket, timeout=block_s)
            else:
                self._queue.put_nowait(ticket)
        except queue.Full:
            self._count("rejected")
            ticket.resolve(FALLBACK)
            return None
        return ticket

    def classify(self, window: Window) -> Prediction:
        """The prediction for one window within ``budget_s``, else ``unknown`` (counted)."""
        if not window:
            return FALLBACK
        ticket = self.submit(window)
        if ticket is None:
            return FALLBACK
        return self._await(ticket)

    def classify_many(self, windows: Sequence[Window]) -> list[Prediction]:
        """Predictions for a chunk of windows (e.g. one consumer poll), in order, answered within
        ``budget_s`` of the call (waiting for queue room counts against it too)."""
        deadline = time.monotonic() + self.budget_s
        tickets: list[Ticket | None] = []
        for window in windows:
            if not window:
                tickets.append(None)
                continue
            ticket = self.submit(window, block_s=max(0.0, deadline - time.monotonic()))
            if ticket is not None:
                ticket.deadline = min(ticket.deadline, deadline)
            tickets.append(ticket)
        return [FALLBACK if t is None else self._await(t) for t in tickets]

    def classify_event(self, event: Event) -> str:
        """An event's intent label within ``budget_s``: the ``IntentLabeller.classify`` hook.

        The window comes from the event's ``messages`` or from this session's remembered
        prompts; with neither the label is ``unknown``.
        """
        return self.classify(self.memory.window_for(event)).intent

    def forget(self, session_id: str) -> None:
        """Drop a session's remembered messages (its conversation completed)."""
        self.memory.forget(session_id)

    def _await(self, ticket: Ticket) -> Prediction:
        prediction = ticket.wait(ticket.deadline - time.monotonic())
        if prediction is None:
            ticket.cancelled = True
            self._count("timed_out")
            return FALLBACK
        return prediction

    # the worker thread -----------------------------------------------------------------------

    def _collect(self) -> list[Ticket] | None:
        """One batch: block for a first request, then take more until full or ``max_wait_s``."""
        first = self._queue.get()
        if first is None:
            return None
        batch = [first]
        until = time.monotonic() + self.max_wait_s
        while len(batch) < self.max_batch:
            try:
                remaining = until - time.monotonic()
                item = (
                    self._queue.get(timeout=remaining)
                    if remaining > 0
                    else (self._queue.get_nowait())
                )
            except queue.Empty:
                break
            if item is None:
                self._stopping = True
                break
            batch.append(item)
        return batch

    def _run(self) -> None:
        while True:
            batch = self._collect()
            if batch is None:
                break
            self._serve(batch)
            if self._stopping and self._queue.empty():
                break
        while True:  # answer whatever is left after the stop
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                self._count("expired")
                item.resolve(FALLBACK)

    def _serve(self, batch: list[Ticket]) -> None:
        now = time.monotonic()
        live = [t for t in batch if not t.cancelled and t.deadline > now]
        dropped = [t for t in batch if t.deadline <= now and not t.cancelled]
        if dropped:
            self._count("expired", len(dropped))
            for ticket in dropped:
                ticket.resolve(FALLBACK)
        if not live:
            return
        started = time.monotonic()
        try:
            predictions = self.classifier.predict([t.window for t in live])
        except Exception:
            log.exception("classifier failed on a batch of %d; answering unknown", len(live))
            self._count("failed", len(live))
            for ticket in live:
                ticket.resolve(FALLBACK)
            return
        finished = time.monotonic()
        with self._lock:
            self.stats.batches += 1
            self.stats.batched_requests += len(live)
            self.stats.completed += len(live)
        if self.on_batch is not None:
            self.on_batch(len(live), finished - started)
        for ticket, prediction in zip(live, predictions, strict=True):
            if self.on_latency is not None:
                self.on_latency(finished - ticket.submitted)
            ticket.resolve(prediction)
