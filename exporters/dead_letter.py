"""Rejected records, as they arrived, to a Kafka dead-letter topic (``--dead-letter-topic``).

Each record keeps its bytes (the value) and gets headers saying where it came from and why
it was rejected: ``kvcast.partition`` (``TOPIC:N``), ``kvcast.offset``, ``kvcast.reason`` and
``kvcast.field`` (empty: the payload as a whole); its key is ``TOPIC:N:OFFSET``.

Delivery is part of the partition's commit. A sender thread of its own sends the records (the
consumer loop never waits on the dead-letter broker); before a partition's delta is stored,
:meth:`DeadLetterSink.confirm` says whether every rejected record of the delta has been
acknowledged. Until then the delta waits; once a record has waited longer than ``timeout_s``,
``confirm`` raises :class:`DeadLetterUnavailable` and the daemon backs off as for a store
outage. A record whose send failed is sent again. It is at-least-once: after a crash between
delivery and commit the records are replayed and sent again (their key says which are the
same record).

A letter the topic cannot take never stalls its partition: a value larger than
``MAX_VALUE_BYTES`` is cut to its first ``TRUNCATED_BYTES`` before it is sent, and a letter the
broker refuses as a record (too large, invalid) is sent again with its first
``TRUNCATED_BYTES``, then with an empty value. Such a letter has the header ``kvcast.truncated``
(the original value's length, in bytes); the original is still at its partition and offset.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["MAX_VALUE_BYTES", "TRUNCATED_BYTES", "DeadLetterSink", "DeadLetterUnavailable"]

log = logging.getLogger(__name__)

# The producer refuses a request over 1,048,576 bytes (kafka-python's max_request_size): a
# value up to 1,000,000 bytes leaves room for the key, the headers and the batch framing.
MAX_VALUE_BYTES = 1_000_000
# What a letter keeps of a value it cannot carry whole (bytes): enough to recognise the
# record, small enough for any broker's default record limit.
TRUNCATED_BYTES = 65_536
# Broker answers that refuse this record, not the connection: the letter is cut, not retried.
_RECORD_REFUSALS = (
    "MessageSizeTooLargeError",
    "RecordListTooLargeError",
    "InvalidRecordError",
    "CorruptRecordError",
    "InvalidTimestampError",
)


class DeadLetterUnavailable(RuntimeError):
    """The dead-letter topic has not acknowledged records a commit needs, for too long."""


class _Letter:
    __slots__ = ("future", "headers", "key", "offset", "queued_at", "size", "value")

    def __init__(
        self, offset: int, key: bytes, value: bytes, headers: list[tuple[str, bytes]], at: float
    ) -> None:
        self.offset, self.key, self.value, self.headers = offset, key, value, headers
        self.size = len(value)  # the original value's length (bytes)
        self.queued_at = at
        self.future: Any = None  # set by the sender thread
        if self.size > MAX_VALUE_BYTES:
            self.shrink()

    def shrink(self) -> bool:
        """Cut the value to ``TRUNCATED_BYTES``, or to nothing when it is already cut; say so
        in ``kvcast.truncated``. False when there is nothing left to cut."""
        if not self.value:
            return False
        limit = TRUNCATED_BYTES if len(self.value) > TRUNCATED_BYTES else 0
        self.value = self.value[:limit]
        self.headers = [h for h in self.headers if h[0] != "kvcast.truncated"]
        self.headers.append(("kvcast.truncated", str(self.size).encode()))
        return True


class DeadLetterSink:
    """A producer of dead letters for one topic. ``kafka_options``: the connection's security
    options, as for the consumer; ``timeout_s``: how long a record may wait for its
    acknowledgement before commits report the topic unavailable (seconds)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        timeout_s: float = 10.0,
        kafka_options: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bootstrap, self.topic, self.timeout_s = bootstrap, topic, timeout_s
        self._options = dict(kafka_options or {})
        self._clock = clock
        self._pending: dict[str, list[_Letter]] = {}
        self._outbox: queue.SimpleQueue[_Letter | None] = queue.SimpleQueue()
        self._error = "no answer yet"
        self.delivered = 0
        self._thread = threading.Thread(
            target=self._send_loop, name="kvcast-dead-letter", daemon=True
        )
        self._thread.start()

    def send(
        self, partition: str, offset: int, value: bytes, reason: str, field: str | None
    ) -> None:
        """Queue the rejected record at ``offset`` of ``partition`` for the sender thread."""
        headers = [
            ("kvcast.partition", partition.encode()),
            ("kvcast.offset", str(offset).encode()),
            ("kvcast.reason", reason.encode()),
            ("kvcast.field", (field or "").encode()),
        ]
        key = f"{partition}:{offset}".encode()
        letter = _Letter(offset, key, value, headers, self._clock())
        self._pending.setdefault(partition, []).append(letter)
        self._outbox.put(letter)

    def confirm(self, partition: str, up_to: int) -> bool:
        """Whether every dead letter of ``partition`` at offsets <= ``up_to`` is acknowledged
        (then they are forgotten); DeadLetterUnavailable when one has waited too long.
        Letters whose send failed are queued again."""
        letters = [x for x in self._pending.get(partition, ()) if x.offset <= up_to]
        waiting = []
        for letter in letters:
            future = letter.future
            if future is not None and future.is_done and future.succeeded():
                continue
            waiting.append(letter)
            if future is not None and future.is_done:  # failed: send it again
                exc = future.exception
                self._error = f"{type(exc).__name__}: {exc}"
                letter.future = None
                if type(exc).__name__ in _RECORD_REFUSALS and letter.shrink():
                    # Refused for what it is: waiting would stall the partition for ever.
                    log.warning(
                        "dead letter %s refused (%s): sending it cut to %d of %d bytes",
                        letter.key.decode(errors="replace"), type(exc).__name__,
                        len(letter.value), letter.size,
                    )  # fmt: skip
                    letter.queued_at = self._clock()
                self._outbox.put(letter)
        if waiting:
            oldest = min(x.queued_at for x in waiting)
            if self._clock() - oldest > self.timeout_s:
                raise DeadLetterUnavailable(
                    f"{self.topic}: {len(waiting)} records unacknowledged for over "
                    f"{self.timeout_s:g} s ({self._error})"
                )
            return False
        if letters:
            self._pending[partition] = [x for x in self._pending[partition] if x.offset > up_to]
            self.delivered += len(letters)
        return True

    def forget(self, partition: str) -> None:
        """Drop what is pending for a partition this process no longer owns (its next owner
        reads those records again from the last commit)."""
        for letter in self._pending.pop(partition, ()):
            letter.offset = -1  # the sender thread skips it if not sent yet

    def pending(self) -> int:
        return sum(len(letters) for letters in self._pending.values())

    # -- the sender thread --------------------------------------------------------------------

    def _send_loop(self) -> None:
        producer = None
        while True:
            letter = self._outbox.get()
            if letter is None:
                break
            if letter.offset < 0:
                continue  # forgotten
            while producer is None:
                producer = self._open()
                if producer is None and self._stopping_wait():
                    return
            try:
                letter.future = producer.send(
                    self.topic, key=letter.key, value=letter.value, headers=letter.headers
                )
            except Exception as exc:  # metadata timed out, buffer full: confirm() re-queues
                self._error = f"{type(exc).__name__}: {exc}"
                letter.future = _Failed(exc)
        if producer is not None:
            try:
                producer.flush(timeout=self.timeout_s)
                producer.close(timeout=self.timeout_s)
            except Exception as exc:  # the broker went away: nothing is lost (replayed)
                log.warning("dead-letter producer: %s on close", type(exc).__name__)

    def _stopping_wait(self) -> bool:
        """Wait a second before the next connection attempt; True when closing."""
        try:
            item = self._outbox.get(timeout=1.0)
        except queue.Empty:
            return False
        if item is None:
            return True
        self._outbox.put(item)
        return False

    def _open(self) -> Any:
        from kafka import KafkaProducer

        try:
            return KafkaProducer(
                bootstrap_servers=self.bootstrap.split(","),
                acks="all",
                max_block_ms=int(self.timeout_s * 1000),
                request_timeout_ms=int(self.timeout_s * 1000),
                **self._options,
            )
        except Exception as exc:  # NoBrokersAvailable
            self._error = f"{type(exc).__name__}: {exc}"
            return None

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the sender thread, waiting at most ``timeout_s`` (seconds). Waiting longer buys
        nothing: a letter not acknowledged by now belongs to a delta that was not stored, so
        it is consumed and sent again at the next start; and a producer still trying to reach
        a dead broker would hold the shutdown for its whole bootstrap timeout."""
        self._outbox.put(None)
        self._thread.join(timeout=timeout_s)


class _Failed:
    """A send that raised before it had a future of its own."""

    is_done = True

    def __init__(self, exc: Exception) -> None:
        self.exception = exc

    @staticmethod
    def succeeded() -> bool:
        return False
