"""Events to kvcast's Kafka topic from inside the serving path: never blocks it, never raises.

:class:`KafkaEventProducer` takes requests on the serving thread (:meth:`record`: build the
event, put it on a bounded queue, return) and sends them from a background thread with
kafka-python, keyed by session (kvcast orders events per partition). A full queue, an
unreachable broker or a bug in building an event drops that event and counts it
(``dropped``); nothing reaches the caller. kafka-python is imported when the sender starts,
so the builder alone needs the standard library only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import re
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from kvcast.producer.builder import EventBuilder

__all__ = ["KafkaEventProducer", "kafka_topic_of"]

log = logging.getLogger(__name__)
_STOP = object()


class KafkaEventProducer:
    """``record(request, response, ...)`` from the serving path; events go to ``topic``.

    ``bootstrap``: ``HOST:PORT[,HOST:PORT]``; ``builder``: an :class:`EventBuilder`;
    ``max_queued``: events held while the broker is slow (beyond: dropped, counted);
    ``kafka_options``: passed to ``kafka.KafkaProducer`` (security, ``linger_ms``, ...).
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        builder: EventBuilder,
        *,
        max_queued: int = 10_000,
        **kafka_options: Any,
    ) -> None:
        self.topic = topic
        self.builder = builder
        self.sent = 0
        self.dropped = 0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max_queued)
        self._options = {"bootstrap_servers": bootstrap.split(","), "linger_ms": 20,
                         "acks": 1, **kafka_options}  # fmt: skip
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._send_loop, name="kvcast-producer", daemon=True)
        self._thread.start()

    def record(self, request: Mapping[str, Any], response: Mapping[str, Any] | None = None,
               **context: Any) -> None:  # fmt: skip
        """Queue the event of one served request (``context``: :meth:`EventBuilder.build`'s
        keywords). Never raises; a request it cannot turn into an event is counted dropped."""
        try:
            event = self.builder.build(request, response, **context)
            self._queue.put_nowait(event)
        except Exception:  # the serving path must never see kvcast fail
            self._drop()

    def close(self, timeout_s: float = 10.0) -> None:
        """Send what is queued (waiting at most ``timeout_s``), then stop."""
        with contextlib.suppress(queue.Full):  # the sender is stuck: nothing more to wait for
            self._queue.put(_STOP, timeout=timeout_s)
        self._thread.join(timeout=timeout_s)

    def _drop(self, count: int = 1) -> None:
        with self._lock:
            self.dropped += count

    def _send_loop(self) -> None:
        producer = None
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            try:
                if producer is None:
                    from kafka import KafkaProducer

                    producer = KafkaProducer(**self._options)
                key = item["session_id"].encode()
                producer.send(self.topic, key=key, value=json.dumps(item).encode()).add_callback(
                    self._delivered
                ).add_errback(self._failed)
            except Exception as exc:  # broker unreachable: this event is lost, the next retries
                log.warning("kvcast producer: event dropped (%s)", type(exc).__name__)
                self._drop()
        if producer is not None:
            try:
                producer.flush(timeout=10)
                producer.close(timeout=5)
            except Exception as exc:
                log.warning("kvcast producer: close failed (%s)", type(exc).__name__)

    def _delivered(self, _metadata: Any) -> None:
        with self._lock:
            self.sent += 1

    def _failed(self, exc: BaseException) -> None:
        log.warning("kvcast producer: event not delivered (%s)", type(exc).__name__)
        self._drop()


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
