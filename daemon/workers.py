"""Worker processes of one instance (``kvcast run --workers N``).

kafka-python decodes records in Python, so one process consumes about 20,000 events/s on the
development machine (docs/performance.md). An instance of N processes is N members of the
consumer group: Kafka spreads the partitions over them, and each commits its partitions'
statistics to the shared Redis, exactly as N separate instances would (the checkpoints are per
partition). The process that was started, the primary, consumes too, and alone reads the window,
publishes the forecast and table, and serves HTTP and metrics.

Each worker sends its own figures (commits, lag, store and classifier latency, fallbacks) to the
primary every second; the primary adds them to its own, so that one scrape covers the instance.
A worker that exits unexpectedly stops the instance with exit code 1: the orchestrator restarts
it, and the per-partition checkpoints make the restart lose and double-count nothing.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from kvcast.daemon.gc_tuning import tune_for_streaming
from kvcast.daemon.instance import build_instance, open_store_and_source
from kvcast.daemon.logs import LogConfig
from kvcast.daemon.settings import DaemonSettings
from kvcast.exporters.view import MetricsView

log = logging.getLogger(__name__)

REPORT_INTERVAL_S = 1.0


class WorkerPool:
    """Starts ``settings.workers - 1`` worker processes and watches them from a thread."""

    def __init__(
        self, settings: DaemonSettings, logs: LogConfig, on_failure: Callable[[str], None]
    ) -> None:
        self._on_failure = on_failure
        context = multiprocessing.get_context("spawn")  # no forked threads or sockets
        self._reports: Any = context.Queue()
        # A worker still importing has Python's default SIGTERM action (death, exit code -15):
        # it is told to stop through ``_stop_requested`` until it has set its ``ready`` flag.
        self._stop_requested: Any = context.Event()
        self._ready: list[Any] = [context.Event() for _ in range(1, settings.workers)]
        self._processes = [
            context.Process(
                target=worker_main,
                args=(
                    settings,
                    index,
                    logs,
                    self._reports,
                    os.getpid(),
                    self._stop_requested,
                    self._ready[index - 1],
                ),
                name=f"kvcast-worker-{index}",
                daemon=False,
            )
            for index in range(1, settings.workers)
        ]
        self._views: dict[int, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._signalled = False
        self.failure: str | None = None
        self._watcher = threading.Thread(target=self._watch, name="kvcast-workers", daemon=True)

    def start(self) -> None:
        for process in self._processes:
            process.start()
        self._watcher.start()

    def request_stop(self) -> None:
        """Stop every worker: each drains and commits what it applied (signal-safe).

        A worker that has installed its handlers gets SIGTERM; one still starting sees the
        shared stop event once it is ready (it sets ``ready`` before it looks, and the stop
        event is set here before ``ready`` is read, so one of the two always sees the other).
        """
        self._stopping.set()
        if self._signalled:
            return  # once: a second SIGTERM could hit a worker's interpreter shutdown, where
            # Python has put back the default handler, and kill it (exit code -15); and a
            # handler that interrupted the first call must not wait on the event's lock
        self._signalled = True
        self._stop_requested.set()
        for process, ready in zip(self._processes, self._ready, strict=True):
            if process.pid is not None and process.exitcode is None and ready.is_set():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)

    def stop(self, timeout_s: float) -> int:
        """Stop the workers and wait for them; 1 if any failed or had to be killed, else 0."""
        self.request_stop()
        code = 0
        deadline = time.monotonic() + timeout_s
        for process in self._processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.exitcode is None:
                log.error("%s did not stop within %.0f s: killed", process.name, timeout_s)
                process.kill()
                process.join(5)
                code = 1
            elif process.exitcode != 0:
                log.error("%s exited with code %d", process.name, process.exitcode)
                code = 1
        self._watcher.join(timeout=2)
        return 1 if self.failure is not None else code

    def merge_into(self, view: MetricsView) -> MetricsView:
        """The primary's metrics view with the workers' latest figures added in."""
        with self._lock:
            views = list(self._views.values())
        return merge_views(view, views)

    def _watch(self) -> None:
        while True:
            try:
                index, view = self._reports.get(timeout=0.25)
            except queue.Empty:
                pass
            else:
                with self._lock:
                    self._views[index] = view
            if self._stopping.is_set():
                if all(p.exitcode is not None for p in self._processes):
                    return
                continue
            for process in self._processes:
                if process.exitcode is not None:
                    self.failure = f"{process.name} exited with code {process.exitcode}"
                    log.error("%s: stopping the instance", self.failure)
                    self._stopping.set()
                    self._on_failure(self.failure)
                    break


def merge_views(primary: MetricsView, workers: Iterable[MetricsView]) -> MetricsView:
    """Add the workers' per-process figures to the primary's metrics view (a new view).

    Counters and histograms add up; the lag adds up (each process reads its own partitions);
    a component is "ok" only when it is in every process.
    """
    commits, lag = primary.commits, primary.lag
    components = dict(primary.components)
    latency = dict(primary.store_latency)
    classifier = primary.classifier
    for view in workers:
        commits += view.commits
        if view.lag is not None:
            lag = (lag or 0) + view.lag
        for name, state in view.components.items():
            if components.get(name, "ok") == "ok" and state != "ok":
                components[name] = state
        for operation, histogram in view.store_latency.items():
            latency[operation] = _add_histograms(latency.get(operation), histogram)
        if view.classifier is not None:
            classifier = _add_classifier(classifier, view.classifier)
    return replace(
        primary,
        commits=commits,
        lag=lag,
        components=components,
        store_latency=latency,
        classifier=classifier,
    )


def _add_histograms(left: dict[str, Any] | None, right: dict[str, Any]) -> dict[str, Any]:
    """Two LatencyHistogram snapshots of the same bounds, added."""
    if left is None:
        return right
    return {
        "buckets": [
            (bound, count + other)
            for (bound, count), (_, other) in zip(left["buckets"], right["buckets"], strict=True)
        ],
        "sum": left["sum"] + right["sum"],
        "count": left["count"] + right["count"],
    }


def _add_classifier(left: dict[str, Any] | None, right: dict[str, Any]) -> dict[str, Any]:
    if left is None:
        return right
    worker = dict(left["worker"])
    for name, value in right["worker"].items():
        if isinstance(value, int | float) and isinstance(worker.get(name), int | float):
            worker[name] += value
    return {**left, "latency": _add_histograms(left["latency"], right["latency"]), "worker": worker}


def worker_main(
    settings: DaemonSettings,
    index: int,
    logs: LogConfig,
    reports: Any,
    primary_pid: int,
    stop_requested: Any,
    ready: Any,
) -> None:
    """A worker process: consume, apply and commit its partitions; report to the primary.

    ``stop_requested`` and ``ready`` are ``multiprocessing`` events shared with the primary.
    """
    logs.configure(worker=index)
    reports.cancel_join_thread()  # never block exit on figures the primary no longer reads
    store, source = open_store_and_source(settings)
    tune_for_streaming()
    instance = build_instance(settings, store, source, status_out=None, publishing=False)
    daemon, publisher = instance.daemon, instance.publisher
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: daemon.request_stop())
    ready.set()
    if stop_requested.is_set():  # asked while starting, before SIGTERM was safe to send
        daemon.request_stop()

    def report() -> None:
        while not daemon.stopping:
            if os.getppid() != primary_pid:  # the primary is gone (kill -9): stop cleanly
                log.error("primary process %d is gone: stopping", primary_pid)
                daemon.request_stop()
                return
            view = publisher.published.metrics_view()
            reports.put((index, replace(view, forecast=None, table=None)))
            time.sleep(REPORT_INTERVAL_S)

    threading.Thread(target=report, name="kvcast-report", daemon=True).start()
    try:
        code = daemon.run()
    finally:
        instance.close()
    raise SystemExit(code)
