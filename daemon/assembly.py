"""The daemon assembled from its settings: store, source, loop, workers, HTTP, metrics, signals.

``kvcast run`` parses its flags into a :class:`~kvcast.daemon.settings.DaemonSettings` and
calls :func:`run_daemon`; everything from there on (which parts, in which order, how SIGTERM
drains, what the first and last lines say) is here, so that the process is the same whoever
starts it. Bad settings found while assembling raise :class:`AssemblyError` naming the flag.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import sys
from collections.abc import Callable, Collection
from typing import Any

from kvcast.daemon.engine_metrics import engine_capacity
from kvcast.daemon.gc_tuning import tune_for_streaming
from kvcast.daemon.instance import build_instance, open_store_and_source
from kvcast.daemon.logs import LogConfig
from kvcast.daemon.settings import DaemonSettings, redact_url
from kvcast.daemon.sources import EventSource
from kvcast.daemon.workers import WorkerPool
from kvcast.exporters.http_server import HttpServer
from kvcast.exporters.metrics import build_registry

log = logging.getLogger(__name__)

# The settings vLLM's cache_config_info can give when none of the layers did.
ENGINE_CAPACITY = ("capacity_blocks", "block_size", "instances")


class AssemblyError(ValueError):
    """A setting the parts refused while being built (the message names the flag)."""


class StopSignals:
    """SIGTERM and SIGINT from the moment ``kvcast run`` starts: remembered while the process is
    still being built (settings, store, classifier), passed to the loop once it exists, so that
    a signal at any moment drains and exits 0 instead of killing the process (exit 143)."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self._target: Callable[[], None] | None = None

    def install(self) -> StopSignals:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._handle)
        return self

    def _handle(self, signum: int, _frame: object = None) -> None:
        self.received.append(signal.Signals(signum).name)
        if self._target is not None:
            self._target()

    def attach(self, target: Callable[[], None]) -> None:
        """From now on a signal calls ``target``; one that came before calls it at once."""
        self._target = target
        if self.received:
            target()


def capacity_from_engines(settings: DaemonSettings, given: Collection[str]) -> DaemonSettings:
    """Capacity, block size and instances from vLLM's ``cache_config_info`` for those of
    :data:`ENGINE_CAPACITY` not in ``given`` (set by a flag, ``KVCAST_*`` variable or config
    key); ValueError naming the endpoints when they do not say."""
    if not settings.engine_metrics or {"capacity_blocks", "block_size"} <= set(given):
        return settings
    blocks, block_size, engines = engine_capacity(settings.engine_metrics)
    taken = {"capacity_blocks": blocks, "block_size": block_size, "instances": engines}
    taken = {name: value for name, value in taken.items() if name not in given}
    changes: dict[str, Any] = {}
    if "capacity_blocks" in taken:
        changes["capacity_blocks"] = blocks
    if "block_size" in taken:
        changes["stats"] = dataclasses.replace(settings.stats, block_size=block_size)
    if "instances" in taken:
        changes["instances"] = engines
    log.info(
        "from the engines' vllm:cache_config_info: %s",
        ", ".join(f"{name}={value}" for name, value in taken.items()),
    )
    return dataclasses.replace(settings, **changes)


def run_daemon(
    settings: DaemonSettings,
    embedded_source: Callable[[DaemonSettings], EventSource],
    status_json: bool = False,
    logs: LogConfig | None = None,
    signals: StopSignals | None = None,
) -> int:
    """Open the store and the source (``embedded_source`` when ``settings`` names none), then
    :func:`serve`; the exit status. AssemblyError for a store or source that cannot be used."""
    try:
        store, source = open_store_and_source(settings, embedded_source)
    except ValueError as exc:
        raise AssemblyError(str(exc)) from None
    tune_for_streaming()
    return serve(settings, store, source, status_json=status_json, logs=logs, signals=signals)


def _say(line: str) -> None:
    """A line of the daemon's own to stderr (read at the call: a test runner swaps it)."""
    print(line, file=sys.stderr, flush=True)


def serve(
    settings: DaemonSettings,
    store: Any,
    source: Any,
    status_json: bool = False,
    logs: LogConfig | None = None,
    signals: StopSignals | None = None,
) -> int:
    """Wire this process, its workers, HTTP and signals; run until SIGTERM/SIGINT or the end of
    the source; the exit status (0: everything applied was stored)."""
    signals = signals or StopSignals().install()
    try:
        instance = build_instance(settings, store, source, status_out=sys.stdout)
    except RuntimeError as exc:
        raise AssemblyError(f"--classifier on: {exc}") from None
    daemon, published = instance.daemon, instance.publisher.published
    daemon.status_json = status_json
    pool = None
    if settings.workers > 1:

        def worker_failed(reason: str) -> None:
            published.set_component("workers", reason)  # /readyz names it while draining
            daemon.request_stop()

        pool = WorkerPool(settings, logs or LogConfig(), on_failure=worker_failed)
        published.set_component("workers", "ok")
    view = (
        published.metrics_view
        if pool is None
        else lambda: pool.merge_into(published.metrics_view())
    )
    host, port = settings.http_host_port()
    http = HttpServer(host, port, published, build_registry(view))
    try:
        http.start()
    except OSError as exc:
        instance.close()
        raise AssemblyError(f"--metrics-addr {settings.metrics_addr}: {exc}") from None

    stopped_by = signals.received

    def stop() -> None:
        daemon.request_stop()
        if pool is not None:
            pool.request_stop()

    signals.attach(stop)
    mode = "embedded default" if settings.embedded else f"source {settings.source}"
    workers = f", {settings.workers} processes" if pool is not None else ""
    _say(f"kvcast: {mode}, store {redact_url(settings.store)}{workers}, serving {http.url}")
    code = 1
    try:
        if pool is not None:
            pool.start()
        code = daemon.run()
    finally:
        if pool is not None:
            code = max(code, pool.stop(settings.shutdown_timeout_s + 10))
        http.close()
        instance.close()
        why = f"on {stopped_by[0]}" if stopped_by else "at the end of its source"
        _say(
            f"kvcast: stopped {why}: {daemon.events_seen:,} events applied, "
            f"{'everything stored' if code == 0 else 'exit status ' + str(code)}"
        )
    return code
