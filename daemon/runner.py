"""The daemon's main loop: consume, apply per partition, commit atomically, publish.

Threads: the consumer loop (this module's :meth:`Daemon.run`, which owns the source and the
partition engines), a refresher (reads the store, recomputes the forecast and the table on a
timer) and the HTTP server (reads what the refresher published). Shared values sit behind one
lock. Commits are ordered per partition: a delta that could not be stored stays queued and is
retried first, so a store outage delays statistics but never loses or doubles them; while the
store is away the loop keeps consuming only up to ``max_uncommitted_events``, then pauses.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TextIO

import orjson

from kvcast.daemon.published import format_status
from kvcast.daemon.publisher import Publisher
from kvcast.daemon.refresh import capacity_grid
from kvcast.daemon.rejection_log import RejectionLog
from kvcast.daemon.settings import DaemonSettings
from kvcast.daemon.shadow_feed import ShadowFeed
from kvcast.daemon.sources.base import EventSource, Record
from kvcast.daemon.stores import StaleOwner, StateStore, StoreUnavailable
from kvcast.exporters.dead_letter import DeadLetterSink, DeadLetterUnavailable
from kvcast.stats.engine import REJECTIONS_KEPT
from kvcast.stats.ingest import IngestTarget, ingest
from kvcast.stats.labeller import IntentLabeller
from kvcast.stats.partition import PartitionDelta, PartitionEngine

log = logging.getLogger(__name__)

POLL_TIMEOUT_S = 0.2
POLL_MAX_RECORDS = 2000


class Daemon:
    """One kvcast instance. ``run()`` returns the process exit code."""

    def __init__(
        self,
        settings: DaemonSettings,
        store: StateStore,
        source: EventSource,
        publisher: Publisher,
        labeller: IntentLabeller | None = None,
        status_out: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        dead_letter: DeadLetterSink | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.source = source
        self.publisher = publisher
        self.published = publisher.published
        self.labeller = labeller or IntentLabeller()
        self._status_out = status_out
        self.status_json = False
        self._clock = clock
        self._engines: dict[str, PartitionEngine] = {}
        self._queued: dict[str, deque[PartitionDelta]] = {}
        self._awaiting_load: set[str] = set()
        self._paused_for_store = False
        self._stop = threading.Event()
        self._flushed = False
        self._announced_end = False  # a finite source's end said once, after its last commit
        self._last_commit = clock()
        self._backoff_s = 0.0
        self._retry_at = 0.0
        self._jitter = random.Random()
        self._epoch: str | None = None  # the store's data the partitions were loaded from
        self.events_seen = 0
        self._status_mark = (clock(), 0)
        self._rejection_log = RejectionLog(log, clock=clock)
        self._dead_letter = dead_letter
        self._store_down = False
        # Partitions paused because a dead letter of theirs waits too long (see _hold_back).
        self._held_back: set[str] = set()
        if dead_letter is not None:
            self.published.set_component("dead_letter", "ok")
        # The shadow simulation runs where the forecast is published (daemon/shadow_feed.py).
        self.shadow: ShadowFeed | None = None
        if settings.shadow_sampling > 0 and self.published.publishing:
            self.shadow = ShadowFeed(settings, capacity_grid(settings.capacity_blocks))
        self._shadow_due = clock()
        source.set_listener(self)

    # -- lifecycle ---------------------------------------------------------------------------

    def request_stop(self) -> None:
        """Ask the loop to drain, commit and return (safe from a signal handler)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> int:
        self.publisher.start()
        next_status = self._clock() + self.settings.status_interval_s
        try:
            while not self._stop.is_set():
                self.published.heartbeat()
                self._step()
                if self._clock() >= next_status:
                    next_status = self._clock() + self.settings.status_interval_s
                    self._print_status()
        finally:
            code = self._drain()
            self._rejection_log.flush()
            self.publisher.stop()
            self.source.close()
            if self._dead_letter is not None:
                self._dead_letter.close()
        return code

    def _step(self) -> None:
        if self._awaiting_load and self._clock() >= self._retry_at:  # loads back off too
            self._load_partitions(sorted(self._awaiting_load))
        if self._uncommitted() >= self.settings.max_uncommitted_events:
            self._pause_for_store()
        # Never take more than the uncommitted bound leaves room for (paused: nothing comes).
        room = self.settings.max_uncommitted_events - self._uncommitted()
        self._apply_batch(self.source.poll(POLL_TIMEOUT_S, max(1, min(POLL_MAX_RECORDS, room))))
        if self.source.finished() and not self._flushed and not self._awaiting_load:
            for engine in self._engines.values():
                engine.flush()
            self._flushed = True
            self._queue_all()
        if self._flushed and not self._announced_end and not any(self._queued.values()):
            self._announce_end()
        due = self._clock() - self._last_commit >= self.settings.commit_interval_s
        if due and self._engines and self._clock() >= self._retry_at:
            self._check_epoch()
        if due or self._uncommitted() >= self.settings.commit_max_events:
            self._queue_all()
        self._flush_queue()
        if self.shadow is not None and self._clock() >= self._shadow_due:
            self._shadow_due = self._clock() + self.settings.refresh_interval_s
            self.published.set_shadow(self.shadow.document())

    def _drain(self) -> int:
        """Queue and store everything applied; give up after ``shutdown_timeout_s``."""
        deadline = self._clock() + self.settings.shutdown_timeout_s
        self._queue_all()
        while any(self._queued.values()):
            self._retry_at = 0.0
            self._flush_queue()
            if not any(self._queued.values()):
                break
            if self._clock() >= deadline:
                # Not lost: their offsets were not stored either, so the next start consumes
                # them again (and resends their dead letters).
                waiting = {
                    p: sum(d.offset - d.base_offset for d in q)
                    for p, q in self._queued.items()
                    if q
                }
                log.error(
                    "shutdown: %d applied events not stored (%s), consumed again at the next "
                    "start: %s unreachable",
                    sum(waiting.values()),
                    ", ".join(f"{p}: {n}" for p, n in sorted(waiting.items())),
                    "dead-letter topic"
                    if set(waiting) <= self._held_back
                    else "store or dead-letter topic",
                )
                return 1
            time.sleep(min(0.5, self.settings.max_backoff_s))
        return 0

    # -- partitions --------------------------------------------------------------------------

    def on_assign(self, partitions: list[str]) -> None:
        log.info("assigned %s", ", ".join(partitions))
        self._load_partitions(partitions)

    def on_revoke(self, partitions: list[str]) -> None:
        log.info("revoked %s", ", ".join(partitions))
        for partition in partitions:
            self._queue(partition)
        self._flush_queue(force=True)
        for partition in partitions:
            self._engines.pop(partition, None)
            self._queued.pop(partition, None)
            self._awaiting_load.discard(partition)
            if self._dead_letter is not None:
                self._dead_letter.forget(partition)
                if partition in self._held_back:  # its next owner sends its letters again
                    self._held_back.discard(partition)
                    if not self._held_back:
                        self.published.set_component("dead_letter", "ok")

    def _check_epoch(self) -> None:
        """Reload every owned partition when the store lost its data (its epoch changed):
        a quiet partition would otherwise never commit again and never notice."""
        try:
            epoch = self.store.epoch()
        except StoreUnavailable as exc:
            self._store_failed(exc)
            return
        if self._epoch is None:
            self._epoch = epoch
        elif epoch != self._epoch:
            log.warning(
                "the state store lost its data (epoch %s, was %s): reloading %d partitions",
                epoch, self._epoch, len(self._engines),
            )  # fmt: skip
            self._epoch = epoch
            for partition in sorted(self._engines):
                self._reload(partition)

    def _load_partitions(self, partitions: list[str]) -> None:
        if self._epoch is None and partitions:  # before the first load: what it loads from
            try:
                self._epoch = self.store.epoch()
            except StoreUnavailable as exc:
                self._store_failed(exc)
                self._awaiting_load.update(partitions)
                self.source.pause(partitions)
                return
        for position, partition in enumerate(partitions):
            try:
                checkpoint = self.store.load_partition(partition)
            except StoreUnavailable as exc:
                # One failure backs off the whole round: the rest wait for the next try.
                self._store_failed(exc)
                waiting = partitions[position:]
                self._awaiting_load.update(waiting)
                self.source.pause(waiting)
                return
            # With dead letters every rejection of a poll is needed, not the log's first few.
            kept = POLL_MAX_RECORDS if self._dead_letter is not None else REJECTIONS_KEPT
            engine = PartitionEngine(self.settings.stats, partition, checkpoint, kept)
            self._engines[partition] = engine
            self._queued[partition] = deque()
            self._awaiting_load.discard(partition)
            self.source.seek(partition, engine.offset + 1)
            self.source.resume([partition])
        if partitions and self._backoff_s:
            self._store_recovered()  # every load answered

    def _apply_batch(self, records: list[Record]) -> None:
        """Ingest a poll's records (valid ones labelled together: one classifier batch)."""
        engines = self._engines
        items: list[tuple[IngestTarget, int, bytes]] = []
        shadowed: dict[str, IngestTarget] = {}
        for record in records:
            engine = engines.get(record.partition)
            if engine is None or record.offset <= engine.offset:
                continue  # not ours (any more), or already applied before a restart
            target: IngestTarget = engine
            if self.shadow is not None:  # the shadow sees what the engine accepts
                target = shadowed.get(record.partition) or shadowed.setdefault(
                    record.partition, self.shadow.target(engine)
                )
            items.append((target, record.offset, record.value))
        self.events_seen += len(items)
        if items:
            now_s = time.time()  # the ``future`` bound counts from the clock of this poll
            for engine in engines.values():
                engine.tracker.advance_clock(now_s)
            ingest(items, self.labeller)
            raw = None
            for partition, engine in engines.items():
                for rejection in engine.take_rejections():
                    self._rejection_log.note(partition, rejection)
                    if self._dead_letter is not None:
                        if raw is None:
                            raw = {(r.partition, r.offset): r.value for r in records}
                        value = raw[(partition, rejection.position)]
                        self._dead_letter.send(
                            partition, rejection.position, value, rejection.reason, rejection.field
                        )

    # -- commits -----------------------------------------------------------------------------

    def _uncommitted(self) -> int:
        """Events applied but not stored, held-back partitions aside: those are paused (they
        grow no more) and must not pause or flood the commits of the others."""
        held = self._held_back
        pending = sum(e.pending_events for p, e in self._engines.items() if p not in held)
        return pending + sum(
            d.offset - d.base_offset for p, q in self._queued.items() if p not in held for d in q
        )

    def _queue(self, partition: str) -> None:
        engine = self._engines.get(partition)
        if engine is None:
            return
        delta = engine.take_delta()
        if not delta.empty or delta.offset != delta.base_offset:
            self._queued[partition].append(delta)

    def _queue_all(self) -> None:
        for partition in list(self._engines):
            self._queue(partition)
        self._last_commit = self._clock()

    def _flush_queue(self, force: bool = False) -> None:
        if not force and self._clock() < self._retry_at:
            return
        answered = False
        for partition, queue in list(self._queued.items()):
            while queue:
                delta = queue[0]
                if self._dead_letter is not None:
                    try:
                        delivered = self._dead_letter.confirm(partition, delta.offset)
                    except DeadLetterUnavailable as exc:
                        self._hold_back(partition, exc)
                        break  # only this partition waits; the others commit on
                    if not delivered:
                        break  # this partition waits for its dead letters; the others go on
                    if partition in self._held_back:
                        self._release(partition)
                try:
                    self.store.commit(delta)
                except StoreUnavailable as exc:
                    self._store_failed(exc)
                    return
                except StaleOwner as exc:
                    answered = True
                    if exc.stored_offset == delta.offset:
                        queue.popleft()  # stored before a lost reply: already applied
                        continue
                    log.warning("%s; reloading the partition from the store", exc)
                    self._reload(partition)
                    break
                answered = True
                queue.popleft()
                self.published.committed(partition, delta)
        if answered or not self._backoff_s:  # after a failure, only the store's answer heals
            self._store_recovered()

    def _reload(self, partition: str) -> None:
        # Consumed again from the store's offset: if its dead letters still wait, the next
        # flush holds it back (and pauses it) again.
        self._held_back.discard(partition)
        self._engines.pop(partition, None)
        self._queued[partition] = deque()
        self._load_partitions([partition])

    def _hold_back(self, partition: str, exc: Exception) -> None:
        """A dead letter of ``partition`` is unacknowledged for too long: pause that partition
        (its queued deltas wait, the others go on) and say so in the component status. The
        sink's sender thread keeps retrying; ``confirm`` is asked again at every flush."""
        if partition not in self._held_back:
            if not self._held_back:
                log.warning("dead-letter topic unavailable (%s); %s commits wait", exc, partition)
            else:
                log.warning("dead-letter topic unavailable: %s commits wait too", partition)
            self._held_back.add(partition)
            self.source.pause([partition])
        waiting = ", ".join(sorted(self._held_back))
        self.published.set_component("dead_letter", f"unavailable: {exc}; waiting: {waiting}")

    def _release(self, partition: str) -> None:
        """``partition``'s dead letters are acknowledged: its commits and consumption go on."""
        self._held_back.discard(partition)
        if not self._paused_for_store:
            self.source.resume([partition])
        if self._held_back:
            waiting = ", ".join(sorted(self._held_back))
            self.published.set_component("dead_letter", f"unavailable; waiting: {waiting}")
        else:
            log.info("dead-letter topic acknowledging again")
            self.published.set_component("dead_letter", "ok")

    def _store_failed(self, exc: Exception) -> None:
        self._back_off("store", exc)

    def _back_off(self, component: str, exc: Exception) -> None:
        """Back off: the delay doubles up to ``max_backoff_s``; the wait is jittered to half
        to all of it, so that the instances of a deployment do not retry in step."""
        self._backoff_s = min(max(self._backoff_s * 2, 0.2), self.settings.max_backoff_s)
        wait_s = self._backoff_s * (0.5 + 0.5 * self._jitter.random())
        self._retry_at = self._clock() + wait_s
        self.published.set_component(component, f"unavailable: {exc}")
        log.warning("state store unavailable (%s); retrying in %.2f s", exc, wait_s)
        self._store_down = True

    def _store_recovered(self) -> None:
        if self._store_down:
            log.info("state store reachable again")
            self._store_down = False
        self._backoff_s = 0.0
        self.published.set_component("store", "ok")
        if self._paused_for_store:
            self._paused_for_store = False
            self.source.resume([p for p in self._engines if p not in self._held_back])

    def _pause_for_store(self) -> None:
        if not self._paused_for_store:
            log.warning("pausing consumption: %d events await the store", self._uncommitted())
            self._paused_for_store = True
            self.source.pause(list(self._engines))

    # -- status ------------------------------------------------------------------------------

    def _announce_end(self) -> None:
        """A finite source (a file, the embedded sample) has been read and everything stored:
        say so once, and refresh now so the forecast and table served are the final ones."""
        self._announced_end = True
        self.publisher.refresh_soon()
        if self.status_json:
            line = orjson.dumps({"source_ended": True, "applied": self.events_seen}).decode()
        else:
            line = (
                f"kvcast: the source has ended: {self.events_seen:,} events applied and stored;"
                " the forecast and table stay served until SIGTERM or Ctrl-C"
            )
        if self._status_out is None:
            log.info(line)
            return
        self._status_out.write(line + "\n")
        self._status_out.flush()

    def _print_status(self) -> None:
        now, seen = self._clock(), self.events_seen
        then, seen_then = self._status_mark
        self._status_mark = (now, seen)
        rate = (seen - seen_then) / (now - then) if now > then else 0.0
        self.published.set_lag(self.source.lag())
        status = self.published.status(rate)
        line = orjson.dumps(status).decode() if self.status_json else format_status(status)
        if self._status_out is None:
            log.info(line)
            return
        self._status_out.write(line + "\n")
        self._status_out.flush()
