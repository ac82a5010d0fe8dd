"""One contract for every event source: a JSONL replay file and Kafka (a real broker).

Each implementation is opened the way the daemon opens it, through ``open_source(URL, group)``,
over records the test wrote itself (a file, or records produced to a fresh topic of four
partitions). What differs by design is declared in the fixture's parameters (:class:`Expected`),
never tested by asking which type a source is.

Every poll of every test also checks the protocol's ordering rule: a record is handed over only
once its partition was announced to the listener (``on_assign``, called from inside ``poll``) and
not revoked since.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kvcast.daemon.sources import EventSource, Record, open_source
from kvcast.lab.bench.processes import free_port
from tests.services import FAST_CLIENT_SETTINGS, unique_name

POLL_S = 0.2  # poll timeout
ARRIVAL_S = 20.0  # longest wait for expected records (a Kafka group join takes ~3 s)
QUIET_S = 0.3  # how long "nothing more comes" is watched for
# Consumer settings for a group of one against tansu, whose join waits about half the session
# timeout (3 s with FAST_GROUP_SETTINGS' 6 s): 3 s joins in about 2 s, and a heartbeat every
# 0.5 s still leaves six of them inside the session.
KAFKA_OPTIONS = {**FAST_CLIENT_SETTINGS, "session_timeout_ms": 3000, "heartbeat_interval_ms": 500}

AssignHook = Callable[[EventSource, list[str]], None]


def payloads(count: int) -> list[bytes]:
    """Distinct payloads of the kinds a log holds: JSON events, non-ASCII text, surrounding
    blanks, a broken line and bytes that are not UTF-8 (a source never decodes them)."""
    kinds = [
        b'{"session_id": "s-%d", "intent": "coding", "turn": 1}',
        '  {"n": %d, "text": "café — 漢字 🚀"}  '.encode(),
        b"not json at all %d {",
        b"\xff\xfe\x00 %d \x01\x7f",
        b'\t{"n": %d}\t',
    ]
    return [kinds[i % len(kinds)].replace(b"%d", str(i).encode()) for i in range(count)]


class Announcements:
    """A PartitionListener that keeps the assignment log and runs ``hook`` on each assignment."""

    def __init__(self, hook: AssignHook | None = None) -> None:
        self.source: EventSource | None = None
        self.current: set[str] = set()  # announced and not revoked since
        self.log: list[tuple[str, tuple[str, ...]]] = []
        self._hook = hook

    def on_assign(self, partitions: list[str]) -> None:
        self.log.append(("assign", tuple(partitions)))
        self.current |= set(partitions)
        if self._hook is not None:
            assert self.source is not None
            self._hook(self.source, partitions)

    def on_revoke(self, partitions: list[str]) -> None:
        self.log.append(("revoke", tuple(partitions)))
        self.current -= set(partitions)


@dataclass
class Reading:
    """An opened source over ``written`` (the records as the writer placed them)."""

    source: EventSource
    written: list[Record]
    partitions: list[str]  # every partition the source has, sorted
    listener: Announcements
    received: list[Record] = field(default_factory=list)

    def poll(self, max_records: int = 100) -> list[Record]:
        records = self.source.poll(POLL_S, max_records)
        for record in records:
            assert record.partition in self.listener.current, (
                f"{record.partition} handed over before on_assign announced it: {self.listener.log}"
            )
        self.listener.log += [("records", (r.partition,)) for r in records]
        self.received += records
        return records

    def until(self, done: Callable[[], bool], what: str, max_records: int = 100) -> None:
        deadline = time.monotonic() + ARRIVAL_S
        while not done():
            assert time.monotonic() < deadline, (
                f"waited {ARRIVAL_S} s for {what}; got {len(self.received)} records"
            )
            self.poll(max_records)

    def receive(self, count: int, max_records: int = 100) -> None:
        """Poll until ``count`` records in all have been received."""
        self.until(lambda: len(self.received) >= count, f"{count} records", max_records)

    def quiet(self) -> list[Record]:
        """Keep polling for QUIET_S seconds; what came in that time."""
        before = len(self.received)
        deadline = time.monotonic() + QUIET_S
        while time.monotonic() < deadline:
            self.poll()
        return self.received[before:]

    def of(self, partition: str, records: list[Record] | None = None) -> list[Record]:
        return [
            r for r in (self.received if records is None else records) if r.partition == partition
        ]


@dataclass(frozen=True)
class Expected:
    """What differs between implementations by design."""

    finite: bool  # finished() turns True once everything was handed out


class Implementation:
    expected: Expected
    opened: list[EventSource]

    def open(self, values: list[bytes], on_assign: AssignHook | None = None) -> Reading:
        """Write ``values``, then open a source over them with a fresh listener."""
        raise NotImplementedError

    def _listen(self, source: EventSource, on_assign: AssignHook | None) -> Announcements:
        listener = Announcements(on_assign)
        listener.source = source
        source.set_listener(listener)
        self.opened.append(source)
        return listener


class FileImplementation(Implementation):
    """``file://PATH``: the whole file as one partition, offsets the indices of its lines."""

    def __init__(self, directory: Path, expected: Expected) -> None:
        self.directory, self.expected, self.opened = directory, expected, []

    def open(self, values: list[bytes], on_assign: AssignHook | None = None) -> Reading:
        path = self.directory / f"events-{len(self.opened)}.jsonl"
        path.write_bytes(b"".join(value + b"\n" for value in values))
        source = open_source(f"file://{path}", "kvcast-test")
        partition = f"file:{path.name}:0"
        written = [Record(partition, offset, value) for offset, value in enumerate(values)]
        return Reading(source, written, [partition], self._listen(source, on_assign))


class KafkaImplementation(Implementation):
    """``kafka://HOST:PORT/TOPIC``: a consumer group of one over a fresh topic; the test's
    records are produced round-robin over its partitions before the source is opened."""

    def __init__(self, bootstrap: str, topic: str, expected: Expected) -> None:
        self.bootstrap, self.topic, self.expected, self.opened = bootstrap, topic, expected, []

    def open(self, values: list[bytes], on_assign: AssignHook | None = None) -> Reading:
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5)
        try:
            numbers = sorted(producer.partitions_for(self.topic))
            futures = []
            for i, value in enumerate(values):
                partition = numbers[i % len(numbers)]
                futures.append((producer.send(self.topic, value=value, partition=partition), value))
                # One record per batch: tansu answers a ListOffsets for the log end with the
                # last batch's base offset + 1, so lag() is only exact over batches of one.
                producer.flush()
            placed = [(future.get(timeout=10), value) for future, value in futures]
        finally:
            producer.close()
        written = [Record(f"{self.topic}:{m.partition}", m.offset, v) for m, v in placed]
        source = open_source(
            f"kafka://{self.bootstrap}/{self.topic}",
            unique_name("kvcast-test-group"),
            **KAFKA_OPTIONS,
        )
        partitions = [f"{self.topic}:{n}" for n in numbers]
        return Reading(source, written, partitions, self._listen(source, on_assign))


IMPLEMENTATIONS = [
    pytest.param(("file", Expected(finite=True)), id="file"),
    pytest.param(("kafka", Expected(finite=False)), id="kafka", marks=pytest.mark.integration),
]


@pytest.fixture(params=IMPLEMENTATIONS)
def implementation(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Implementation]:
    kind, expected = request.param
    if kind == "file":
        chosen: Implementation = FileImplementation(tmp_path, expected)
    else:
        bootstrap = request.getfixturevalue("kafka_bootstrap")
        chosen = KafkaImplementation(bootstrap, request.getfixturevalue("kafka_topic"), expected)
    yield chosen
    for source in chosen.opened:  # a test may have closed it already: close() again is safe
        source.close()


def in_offset_order(records: list[Record]) -> bool:
    by_partition: dict[str, list[int]] = {}
    for record in records:
        by_partition.setdefault(record.partition, []).append(record.offset)
    return all(offsets == sorted(set(offsets)) for offsets in by_partition.values())


# -- the contract ------------------------------------------------------------------------------


def test_every_record_comes_back_once_in_offset_order_after_its_partition_was_announced(
    implementation: Implementation,
) -> None:
    """All records written are handed over once each (none lost, none doubled, nothing more
    after them), offsets increase within a partition and payloads are the bytes written.
    on_assign named every partition of the source, from inside poll, before the first record
    of that partition was handed over (Reading.poll checks this on every poll)."""
    reading = implementation.open(payloads(40))
    reading.receive(len(reading.written))
    assert reading.quiet() == []
    assert sorted(reading.received) == sorted(reading.written)
    assert in_offset_order(reading.received)
    for partition in reading.partitions:
        assert reading.of(partition) == reading.of(partition, reading.written)
    log = reading.listener.log
    assert {p for kind, ps in log if kind == "assign" for p in ps} == set(reading.partitions)
    assert [kind for kind, _ in log].index("assign") < [kind for kind, _ in log].index("records")


def test_seek_sets_the_next_record_read_forward_from_on_assign_and_backward_later(
    implementation: Implementation,
) -> None:
    """A seek in on_assign (what the daemon does with its checkpoint) skips the records before
    the offset; a seek back after everything was read hands the records from there out again."""
    skip = 2

    def start_at_checkpoint(source: EventSource, partitions: list[str]) -> None:
        for partition in partitions:
            source.seek(partition, skip)

    reading = implementation.open(payloads(24), on_assign=start_at_checkpoint)
    after_checkpoint = [r for r in reading.written if r.offset >= skip]
    reading.receive(len(after_checkpoint))
    assert reading.quiet() == []
    assert sorted(reading.received) == sorted(after_checkpoint)

    rewound = reading.partitions[0]
    reading.received.clear()
    reading.source.seek(rewound, 1)
    again = [r for r in reading.of(rewound, reading.written) if r.offset >= 1]
    reading.receive(len(again))
    assert reading.quiet() == []
    assert reading.received == again


def test_a_paused_partition_hands_out_nothing_until_resumed(
    implementation: Implementation,
) -> None:
    """Paused in on_assign, a partition's records stay back while the other partitions flow;
    after resume they all come, once each and in offset order."""
    held: list[str] = []

    def hold_the_first(source: EventSource, partitions: list[str]) -> None:
        if not held:
            held.append(min(partitions))
            source.pause(held)

    reading = implementation.open(payloads(24), on_assign=hold_the_first)
    reading.until(lambda: bool(held), "the assignment")
    flowing = [r for r in reading.written if r.partition not in held]
    reading.receive(len(flowing))
    reading.quiet()
    assert sorted(reading.received) == sorted(flowing)  # nothing of the held partition

    reading.received.clear()
    reading.source.resume(held)
    held_back = reading.of(held[0], reading.written)
    reading.receive(len(held_back))
    assert reading.quiet() == []
    assert reading.received == held_back


def test_pause_and_resume_act_only_on_the_partitions_named(
    implementation: Implementation,
) -> None:
    """pause([]) stops no partition and resume([]) releases none: the daemon calls both with
    the list of partitions it owns, which may be empty."""
    held: list[str] = []

    def hold_the_first(source: EventSource, partitions: list[str]) -> None:
        if not held:
            held.append(min(partitions))
            source.pause(held)
            source.resume([])  # names no partition: the held one stays held

    reading = implementation.open(payloads(24), on_assign=hold_the_first)
    reading.until(lambda: bool(held), "the assignment")
    flowing = [r for r in reading.written if r.partition not in held]
    reading.receive(len(flowing))
    released = reading.of(held[0], reading.quiet())
    assert released == [], f"resume([]) released {held[0]}: {len(released)} records came"
    assert sorted(reading.received) == sorted(flowing)

    reading.received.clear()
    reading.source.resume(held)
    reading.source.pause([])  # names no partition: the released one keeps flowing
    held_back = reading.of(held[0], reading.written)
    reading.receive(len(held_back))
    assert reading.received == held_back


def test_lag_and_finished_track_what_is_left_while_health_stays_ok(
    implementation: Implementation,
) -> None:
    """lag() is None (not known) or an int >= 0 at every step; once every partition is
    assigned it equals the records written but not yet handed over, and it reaches 0.
    finished() is False while records remain; after the last one it is True for a finite
    source (a file) and stays False for an endless one (Kafka), as the fixture declares.
    health() is (True, detail) throughout: the source is reachable."""
    reading = implementation.open(payloads(30))

    def check() -> None:
        lag = reading.source.lag()
        assert lag is None or (isinstance(lag, int) and lag >= 0), lag
        if lag is not None and reading.listener.current == set(reading.partitions):
            assert lag == len(reading.written) - len(reading.received)
        if len(reading.received) < len(reading.written):
            assert reading.source.finished() is False
        healthy, detail = reading.source.health()
        assert healthy is True and isinstance(detail, str), (healthy, detail)

    check()
    deadline = time.monotonic() + ARRIVAL_S
    while len(reading.received) < len(reading.written):
        assert time.monotonic() < deadline, f"got {len(reading.received)} records"
        reading.poll(max_records=4)
        check()
    reading.until(lambda: reading.source.lag() == 0, "lag 0 once everything was handed out")
    assert reading.source.finished() is implementation.expected.finite
    assert reading.quiet() == []
    check()
    assert reading.source.finished() is implementation.expected.finite


def test_close_may_be_called_again(implementation: Implementation) -> None:
    """close() twice raises nothing (the fixture closes every source once more after each
    test, after it was read)."""
    reading = implementation.open(payloads(3))
    reading.source.close()
    reading.source.close()


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "kafka://127.0.0.1:9092",  # no topic
        "kafka://127.0.0.1:9092/",
        "kafka:///events",  # no broker
        "kafka://127.0.0.1:notaport/events",
        "kafka://127.0.0.1:{dead_port}/events/extra",  # "/" is not allowed in a topic
        "ftp://127.0.0.1/events.jsonl",
        "redis://127.0.0.1:6379/0",
        "events.jsonl",  # no scheme
    ],
)
def test_a_malformed_url_raises_value_error_naming_it(url: str) -> None:
    """Rejected before any connection is made, with the URL in the message (the operator
    sees which setting is wrong); no other exception type. ``{dead_port}``: nothing listens."""
    url = url.format(dead_port=free_port())
    with pytest.raises(ValueError) as raised:
        open_source(url, "kvcast-test", bootstrap_timeout_ms=300, request_timeout_ms=300)
    assert url in str(raised.value)


def test_a_missing_or_unreadable_file_raises_value_error_naming_the_url(tmp_path: Path) -> None:
    """A path that does not exist, and a directory, are no replay files."""
    for url in (f"file://{tmp_path}/missing.jsonl", f"file://{tmp_path}"):
        with pytest.raises(ValueError) as raised:
            open_source(url, "kvcast-test")
        assert url in str(raised.value)
