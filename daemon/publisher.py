"""The refresher: recomputes the forecast and the table from the store on a timer.

The refresher thread reads the shared window from the store (so every instance publishes the
statistics of all partitions, not only its own), computes (``kvcast.daemon.refresh``),
republishes the priority table to the store when its content changed, expires old buckets,
and hands the results to :class:`~kvcast.daemon.published.Published`, which HTTP handlers and
metric scrapes read. Nothing here touches the consumer.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from kvcast.daemon.published import Published
from kvcast.daemon.refresh import compute_refresh, emptied, expiry_bounds, should_publish
from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.stores import StateStore, StoreUnavailable
from kvcast.stats.documents import TableDocument

log = logging.getLogger(__name__)


class Publisher:
    """Owns the refresher thread; its results are in :attr:`published`."""

    def __init__(
        self,
        settings: DaemonSettings,
        store: StateStore,
        source_health: Callable[[], tuple[bool, str]],
        clock: Callable[[], float] = time.monotonic,
        extra_metrics: Sequence[Callable[[], dict[str, Any]]] = (),
        publishing: bool = True,
    ) -> None:
        self.settings = settings
        # False in a worker process (daemon/workers.py): it keeps its figures for the primary
        # process, which alone reads the window, publishes and serves.
        self.publishing = publishing
        self.store = store
        self._clock = clock
        self.published = Published(source_health, clock, extra_metrics, publishing)
        self._table_published_at = -math.inf
        self._keeping_table = False  # an emptied window was reported; the last table stays
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        if not self.publishing:
            return
        self._thread = threading.Thread(target=self._loop, name="kvcast-refresh", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if not self.publishing:
            return
        try:
            self.refresh_once()  # the final state, after the last commit
        except StoreUnavailable as exc:
            log.warning("final refresh skipped: %s", exc)

    def _loop(self) -> None:
        while not self._stopped.is_set():
            try:
                self.refresh_once()
            except StoreUnavailable as exc:
                self.published.set_component("store", f"unavailable: {exc}")
            except Exception:  # keep publishing the last good state; never die silently
                log.exception("refresh failed")
            self._wake.wait(self.settings.refresh_interval_s)
            self._wake.clear()

    def refresh_soon(self) -> None:
        self._wake.set()

    # -- the refresh -------------------------------------------------------------------------

    def refresh_once(self) -> None:
        started = time.perf_counter()
        state = self.store.load_window(self.settings.stats)
        own_at_read = self.published.own_commits()  # after the read: never counted twice
        previous = self.published.table()
        version = previous.version if previous is not None else self._stored_table_version()
        result = compute_refresh(state, self.settings, version)
        table = result.table
        publish = should_publish(
            previous,
            table,
            self._clock() - self._table_published_at,
            self.settings.table_interval_s,
        )
        if publish:
            table = table.with_version(version + 1)
            self.store.publish_table(table.to_dict())  # the store's boundary: JSON from here
            self._table_published_at = self._clock()
        self._report_emptied(previous, table, state.newest_event_time)
        bounds = expiry_bounds(state, result.snapshot, self.settings.stats)
        if bounds is not None:
            self.store.expire(*bounds)
        self.published.refreshed(
            result.forecast,
            table if publish else None,
            state.counters.to_dict(),
            time.perf_counter() - started,
            planner=result.planner,
            own_at_read=own_at_read,
        )

    def _report_emptied(
        self, previous: TableDocument | None, table: TableDocument, newest_s: float
    ) -> None:
        """Say once why the published table stays while the window is empty."""
        if not emptied(previous, table):
            self._keeping_table = False
            return
        if not self._keeping_table and previous is not None:
            self._keeping_table = True
            log.warning(
                "the statistics window is empty at event time %s (no completed conversation "
                "within --window-max-age %g s): keeping table v%d; an event time far ahead of "
                "the others (see kvcast_events_rejected_total{reason=\"future\"}) or a store that "
                "lost its data does this",
                newest_s, self.settings.stats.window_max_age_s, previous.version,
            )  # fmt: skip

    def _stored_table_version(self) -> int:
        stored = self.store.read_table()
        return int(stored["version"]) if stored is not None else 0
