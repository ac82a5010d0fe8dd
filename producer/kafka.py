"""Events to kvcast's Kafka topic from inside the serving path: never blocks it, never raises.

:class:`KafkaEventProducer` takes requests on the serving thread (:meth:`record`: build the
event, encode it, put it on a queue bounded by count and by bytes, return) and sends them from
a background thread with kafka-python, keyed by session (kvcast orders events per partition).
Nothing reaches the caller; every event that is not sent is counted by reason
(:data:`DROP_REASONS`): ``queue_full_count``, ``queue_full_bytes``, ``oversized`` (over
Kafka's ``max_request_size``), ``build_error``, ``send_error``, ``closed_unsent`` (still queued
or unacknowledged when :meth:`close` gave up), ``after_close``. :meth:`stats` returns the
counters (``recorded == sent + dropped`` once closed); export them as a gauge from the
serving process, e.g. a Prometheus collector reading ``stats()``. kafka-python is imported
when the sender starts, so the builder alone needs the standard library only.
"""

from __future__ import annotations

import json
import logging
import queue
import re
import threading
import time
from collections import Counter
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from kvcast.producer.builder import EventBuilder

__all__ = ["DROP_REASONS", "KafkaEventProducer", "kafka_topic_of"]

log = logging.getLogger(__name__)
_STOP = object()
DROP_REASONS = ("queue_full_count", "queue_full_bytes", "oversized", "build_error",
                "send_error", "closed_unsent", "after_close")  # fmt: skip


class KafkaEventProducer:
    """``record(request, response, ...)`` from the serving path; events go to ``topic``.

    ``bootstrap``: ``HOST:PORT[,HOST:PORT]``; ``builder``: an :class:`EventBuilder`;
    ``max_queued``: events held while the broker is slow; ``max_buffer_bytes``: their encoded
    size in bytes (default 64 MiB; beyond either bound: dropped, counted);
    ``kafka_options``: passed to ``kafka.KafkaProducer`` (security, ``linger_ms``, ...).
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        builder: EventBuilder,
        *,
        max_queued: int = 10_000,
        max_buffer_bytes: int = 64 * 1024 * 1024,
        **kafka_options: Any,
    ) -> None:
        if max_queued < 1 or max_buffer_bytes < 1:
            raise ValueError(f"max_queued ({max_queued}) and max_buffer_bytes "
                             f"({max_buffer_bytes}) must be >= 1")  # fmt: skip
        self.topic = topic
        self.builder = builder
        self.max_queued = max_queued
        self.max_buffer_bytes = max_buffer_bytes
        self._options = {"bootstrap_servers": bootstrap.split(","), "linger_ms": 20,
                         "acks": 1, **kafka_options}  # fmt: skip
        self._max_record = int(self._options.get("max_request_size", 1_048_576))
        self._lock = threading.Lock()
        self._built = threading.Condition(self._lock)  # a record() call finished building
        self._building = 0  # record() calls past the closed check, not yet queued or dropped
        self._recorded = 0
        self._sent = 0
        self._dropped: Counter[str] = Counter()
        self._queued = 0  # events on the queue (count bound)
        self._queued_bytes = 0  # their encoded bytes (byte bound)
        self._in_flight = 0  # handed to kafka-python, not yet acknowledged or failed
        self._closed = False  # close() began: record() drops
        self._final: dict[str, Any] | None = None  # close() reported: counters frozen
        self._deadline = 0.0  # close()'s deadline (time.monotonic() s) for the last flush
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()  # bounded by the counters
        self._thread = threading.Thread(target=self._send_loop, name="kvcast-producer", daemon=True)
        self._thread.start()

    @property
    def sent(self) -> int:
        """Events the broker acknowledged."""
        return self._sent

    @property
    def dropped(self) -> int:
        """Events not sent, all reasons together."""
        return sum(self._dropped.values())

    def stats(self) -> dict[str, Any]:
        """The counters: ``recorded``, ``sent``, ``dropped`` (total) and ``dropped_by_reason``,
        ``queued`` (events) and ``queued_bytes``, ``in_flight``, the builder's ``retries`` and
        ``branches``. After :meth:`close`, the numbers it reported."""
        with self._lock:
            if self._final is not None:
                return dict(self._final)
            return self._stats_locked()

    def _stats_locked(self) -> dict[str, Any]:
        return {
            "recorded": self._recorded,
            "sent": self._sent,
            "dropped": sum(self._dropped.values()),
            "dropped_by_reason": {r: self._dropped[r] for r in DROP_REASONS},
            "queued": self._queued,
            "queued_bytes": self._queued_bytes,
            "in_flight": self._in_flight,
            "retries": getattr(self.builder, "retries", 0),
            "branches": getattr(self.builder, "branches", 0),
        }

    def record(self, request: Mapping[str, Any], response: Mapping[str, Any] | None = None,
               **context: Any) -> None:  # fmt: skip
        """Queue the event of one served request (``context``: :meth:`EventBuilder.build`'s
        keywords). Never raises nor waits on Kafka; an event it cannot queue is counted."""
        with self._lock:
            self._recorded += 1
            if self._closed:
                self._drop_locked("after_close")
                return
            self._building += 1  # close() waits for it: it was recorded before close began
        try:
            try:
                event = self.builder.build(request, response, **context)
                value = json.dumps(event).encode()
                key = event["session_id"].encode()
            except Exception:  # the serving path must never see kvcast fail
                self._drop("build_error")
                return
            size = len(value) + len(key)
            with self._lock:
                if self._final is not None:  # close gave up waiting: counted closed_unsent
                    return
                if size > self._max_record:
                    self._drop_locked("oversized")
                elif self._queued >= self.max_queued:
                    self._drop_locked("queue_full_count")
                elif self._queued_bytes + size > self.max_buffer_bytes:
                    self._drop_locked("queue_full_bytes")
                else:
                    self._queued += 1
                    self._queued_bytes += size
                    self._queue.put((key, value, size))
        finally:
            with self._lock:
                self._building -= 1
                self._built.notify_all()

    def close(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """Send what is queued for at most ``timeout_s`` seconds, then stop; what is still
        queued or unacknowledged then counts as ``closed_unsent``. Logs and returns
        :meth:`stats` (then frozen: ``recorded == sent + dropped``)."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._lock:
            if self._final is not None:
                return dict(self._final)
            self._closed = True
            self._deadline = deadline
            # Events that record() took before close began go on the queue ahead of the stop.
            self._built.wait_for(lambda: self._building == 0, max(0.0, deadline - time.monotonic()))
        self._queue.put(_STOP)
        self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._lock:
            # the sender gave up or is stuck, or a record() call is still building
            unsent = self._queued + self._in_flight + self._building
            if unsent:
                self._dropped["closed_unsent"] += unsent
            self._queued = self._queued_bytes = self._in_flight = 0
            self._final = self._stats_locked()
            final = dict(self._final)
        reasons = ", ".join(f"{r} {n}" for r, n in final["dropped_by_reason"].items() if n)
        level = logging.WARNING if final["dropped"] else logging.INFO
        log.log(level, "kvcast producer closed: %d recorded, %d sent, %d dropped%s",
                final["recorded"], final["sent"], final["dropped"],
                f" ({reasons})" if reasons else "")  # fmt: skip
        return final

    def _drop(self, reason: str, count: int = 1) -> None:
        with self._lock:
            self._drop_locked(reason, count)

    def _drop_locked(self, reason: str, count: int = 1) -> None:
        if self._final is None:  # after close reported, the numbers stay as reported
            self._dropped[reason] += count

    def _send_loop(self) -> None:
        producer = None
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            key, value, size = item
            with self._lock:
                if self._final is not None:
                    break
                self._queued -= 1
                self._queued_bytes -= size
                self._in_flight += 1
            try:
                if producer is None:
                    from kafka import KafkaProducer

                    producer = KafkaProducer(**self._options)
                producer.send(self.topic, key=key, value=value).add_callback(
                    self._delivered
                ).add_errback(self._failed)
            except Exception as exc:  # broker unreachable: this event is lost, the next retries
                log.warning("kvcast producer: event dropped (%s)", type(exc).__name__)
                self._settle(delivered=False)
        if producer is not None:
            try:  # bounded by close()'s deadline
                left = max(0.0, self._deadline - time.monotonic())
                producer.flush(timeout=left)
                producer.close(timeout=0)
            except Exception as exc:
                log.warning("kvcast producer: close failed (%s)", type(exc).__name__)

    def _settle(self, *, delivered: bool) -> None:
        with self._lock:
            if self._final is not None:
                return  # reported unsent at close; a late outcome changes nothing
            self._in_flight -= 1
            if delivered:
                self._sent += 1
            else:
                self._dropped["send_error"] += 1

    def _delivered(self, _metadata: Any) -> None:
        self._settle(delivered=True)

    def _failed(self, exc: BaseException) -> None:
        log.warning("kvcast producer: event not delivered (%s)", type(exc).__name__)
        self._settle(delivered=False)


# Kafka's own rule for topic names (kafka.common.internals.Topic).
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


def kafka_topic_of(url: str) -> tuple[str, str]:
    """``(bootstrap, topic)`` of ``kafka://HOST:PORT[,HOST:PORT]/TOPIC``; ValueError naming the
    part that is wrong."""
    parts = urlsplit(url)
    topic = parts.path.strip("/")
    if parts.scheme != "kafka" or not parts.netloc or not topic:
        raise ValueError(f"source {url!r}: expected kafka://HOST:PORT/TOPIC")
    for broker in parts.netloc.split(","):
        host, _, port = broker.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"source {url!r}: broker {broker!r} is not HOST:PORT")
    if not _TOPIC.fullmatch(topic):
        raise ValueError(
            f"source {url!r}: topic {topic!r} is not a Kafka topic name "
            "(1-249 of A-Z a-z 0-9 . _ -)"
        )
    return parts.netloc, topic
