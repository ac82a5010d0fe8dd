"""Hostile events: rejected with a counted reason, never a crash, memory bounded.

The parser's property tests live in ``tests/stats/test_events.py``; here: deeply nested JSON,
invalid UTF-8, oversized and huge-field events, seeded byte-level mutations of valid events,
a flood of distinct sessions beyond ``max_open_conversations`` (in-process, memory measured),
and all of these through Kafka into a running daemon, whose statistics and rejection counters
must equal the offline reference.
"""

from __future__ import annotations

import gc
import random
import signal
import tracemalloc

import orjson
import pytest

from kvcast.lab.bench.processes import DaemonProcess
from kvcast.lab.bench.soak import (
    FAST_FLAGS,
    STATS_FLAGS,
    Records,
    compare,
    wait_consumed,
    workload,
)
from kvcast.stats.config import StatsConfig
from kvcast.stats.engine import StatsEngine
from kvcast.stats.events import MAX_EVENT_BYTES, REJECT_REASONS, Event, EventRejected, parse_event
from tests.reliability.tally import TALLY

VALID = {"session_id": "s", "turn": 1, "timestamp": 5.0, "input_tokens": 10, "output_tokens": 2}


def event_with(**fields) -> bytes:
    return orjson.dumps({**VALID, **fields})


def splice(field: str, raw: bytes) -> bytes:
    """A valid event whose ``field`` holds ``raw`` JSON text (or bytes) verbatim."""
    return event_with(**{field: "@@"}).replace(b'"@@"', raw)


HOSTILE: list[tuple[str, bytes | str, str]] = [
    ("100k nested arrays", b"[" * 100_000 + b"]" * 100_000, "invalid_json"),
    ("100k nested objects", b'{"a":' * 100_000 + b"1" + b"}" * 100_000, "invalid_json"),
    ("deep unknown field", splice("extra", b"[" * 5000 + b"]" * 5000), "invalid_json"),
    ("unclosed nesting", b"[" * 500_000, "invalid_json"),
    ("invalid UTF-8 in a prompt", splice("prompt", b'"\xff\xfe bad"'), "invalid_json"),
    ("overlong UTF-8", splice("session_id", b'"\xc0\xaf"'), "invalid_json"),
    ("UTF-8 encoded surrogate", splice("session_id", b'"\xed\xa0\x80"'), "invalid_json"),
    ("lone surrogate escape", splice("session_id", b'"\\ud800"'), "invalid_json"),
    ("lone surrogate in str", '{"session_id": "\ud800", "turn": 1}', "invalid_json"),
    ("NaN literal", splice("timestamp", b"NaN"), "invalid_json"),
    ("Infinity literal", splice("timestamp", b"Infinity"), "invalid_json"),
    ("1e400 timestamp", splice("timestamp", b"1e400"), "invalid_json"),
    ("huge integer", splice("input_tokens", b"9" * 5000), "invalid_json"),
    ("10**30 tokens (a float to orjson)", splice("input_tokens", b"1" + b"0" * 30), "wrong_type"),
    ("oversized by one byte", event_with(prompt="x" * MAX_EVENT_BYTES), "oversized"),
    ("32 MiB of spaces", b" " * (32 << 20), "oversized"),
    ("257-char session_id", event_with(session_id="s" * 257), "out_of_range"),
    ("500k-char session_id", event_with(session_id="s" * 500_000), "out_of_range"),
    ("1.1M-char session_id", event_with(session_id="s" * 1_100_000), "oversized"),
    ("empty session_id", event_with(session_id=""), "out_of_range"),
    ("100k messages of numbers", event_with(messages=list(range(100_000))), "wrong_type"),
    ("prompt as an object", event_with(prompt={"a": 1}), "wrong_type"),
    ("turn 0", event_with(turn=0), "out_of_range"),
    ("bool turn", event_with(turn=True), "wrong_type"),
    ("negative time", event_with(timestamp=-1.0), "out_of_range"),
    ("schema 2", event_with(schema=2), "unsupported_schema"),
    ("empty message", b"", "invalid_json"),
    ("NUL bytes", b"\x00" * 100, "invalid_json"),
    ("a JSON string", b'"hello"', "not_an_object"),
    ("an array of events", b"[" + event_with() + b"]", "not_an_object"),
]


@pytest.mark.parametrize(("name", "payload", "reason"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_payloads_are_rejected_with_their_reason(name, payload, reason) -> None:
    with pytest.raises(EventRejected) as rejected:
        parse_event(payload)
    TALLY.add(hostile_inputs=1)
    assert rejected.value.reason == reason
    assert len(rejected.value.detail) < 200  # the detail never echoes the payload


def test_odd_but_valid_fields_are_accepted() -> None:
    for session_id in ("s" * 256, "\x00\n\t", "💥" * 64, "../../etc/passwd", "a:{b}:c*"):
        assert parse_event(event_with(session_id=session_id)).session_id == session_id
    assert parse_event(splice("extra", b"[" * 500 + b"]" * 500)).session_id == "s"
    TALLY.add(hostile_inputs=6)


def test_seeded_byte_mutations_never_escape_the_contract() -> None:
    """10,000 mutations (flips, insertions, deletions, truncations, splices) of valid events:
    each parses or is rejected with a reason of the bounded set; nothing else escapes."""
    rng = random.Random(2024)
    seeds = [line for line in workload(200, seed=8)] + [
        event_with(prompt="hi", messages=[{"role": "user", "content": "hi"}], intent="coding",
                   cached_tokens=3, type="text", instance="i-1", block_hashes=[1, "b"])
    ]  # fmt: skip
    outcomes = {"accepted": 0, "rejected": 0}
    for _ in range(10_000):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            op = rng.randrange(5)
            at = rng.randrange(len(data) + 1)
            if op == 0 and data:
                data[min(at, len(data) - 1)] = rng.randrange(256)
            elif op == 1:
                data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
            elif op == 2:
                del data[at : at + rng.randint(1, 8)]
            elif op == 3:
                data = data[:at]
            else:
                data[at:at] = rng.choice([b"[", b"{", b'"', b"\\u", b"1e999", b"-", b"null"])
        try:
            parse_event(bytes(data))
            outcomes["accepted"] += 1
        except EventRejected as rejection:
            assert rejection.reason in REJECT_REASONS
            outcomes["rejected"] += 1
    TALLY.add(hostile_inputs=10_000)
    assert outcomes["accepted"] > 0 and outcomes["rejected"] > 0


def test_a_flood_of_distinct_sessions_is_shed_with_bounded_memory() -> None:
    """400,000 distinct sessions against a limit of 2,000 open conversations: the rest are
    shed as open_limit (counted), and memory after 400k equals memory after 40k."""
    config = StatsConfig(max_open_conversations=2000, completion_timeout_s=1800)
    engine = StatsEngine(config)

    def flood(start: int, stop: int) -> None:
        for n in range(start, stop):
            engine.apply(Event(f"flood-{n}", 1, 1000.0 + n * 1e-3, 100, 10, f"r{n}"), "chitchat")

    tracemalloc.start()
    try:
        flood(0, 40_000)
        gc.collect()
        after_40k = tracemalloc.get_traced_memory()[0]
        flood(40_000, 400_000)
        gc.collect()
        after_400k = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    TALLY.add(hostile_inputs=400_000)
    assert engine.tracker.open_conversations == 2000
    assert engine.counters.rejected["open_limit"] == 398_000
    assert engine.counters.processed == 2000
    assert after_400k - after_40k < 1 << 20, (after_40k, after_400k)  # under 1 MiB more


@pytest.mark.integration
@pytest.mark.parametrize("kafka_topic", [2], indirect=True)
def test_hostile_events_through_kafka_leave_the_statistics_exact(
    tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_client, redis_namespace
) -> None:
    """Every hostile payload above (the 32 MiB one cut to 2 MiB, over the broker's request
    size) and a flood of 3,000 distinct sessions, mixed at seeded places into a normal
    workload, go through Kafka into the daemon (--max-open-conversations 150 per partition).
    It keeps running, and its statistics and rejection counters equal the reference's."""
    from kafka import KafkaProducer

    rng = random.Random(77)
    lines = workload(3000, seed=21)
    newest = orjson.loads(lines[-1])["timestamp"]
    hostile = [p.encode("utf-8", "surrogatepass") if isinstance(p, str) else p
               for _, p, _ in HOSTILE if len(p) < 4 << 20] + [b" " * (2 << 20)]  # fmt: skip
    flood = [event_with(session_id=f"flood-{n}", timestamp=newest - 5.0, request_id=f"f{n}")
             for n in range(3000)]  # fmt: skip
    sequence = list(lines)
    for payload in hostile:
        sequence.insert(rng.randrange(len(sequence)), payload)
    sequence[-200:-200] = flood
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=5,
                             max_request_size=8 << 20)  # fmt: skip
    futures = [
        (producer.send(kafka_topic, key=rng.choice([b"a", b"b", b"c"]), value=payload), payload)
        for payload in sequence
    ]
    producer.flush()
    records: Records = []
    for future, payload in futures:
        metadata = future.get(timeout=30)
        records.append((metadata.partition, metadata.offset, payload))
    producer.close()
    stats = StatsConfig(completion_timeout_s=900, allowed_lateness_s=30, max_open_conversations=150)
    daemon = DaemonProcess(
        ["--source", f"kafka://{kafka_bootstrap}/{kafka_topic}", "--store", redis_url,
         "--namespace", redis_namespace, *FAST_FLAGS, *STATS_FLAGS,
         "--max-open-conversations", "150"],
        tmp_path / "daemon.log",
    )  # fmt: skip
    try:
        wait_consumed(redis_client, redis_namespace, kafka_topic, records, 2, timeout=90)
        differences = compare(daemon, records, stats=stats)
        metrics = daemon.raw("/metrics").decode()
        TALLY.add(
            hostile_inputs=len(hostile) + len(flood), events_compared=len(records),
            differences=len(differences),
        )  # fmt: skip
        assert differences == []
        assert 'reason="open_limit"' in metrics and 'reason="oversized"' in metrics
        assert daemon.raw("/healthz")
        assert daemon.stop(signal.SIGTERM) == 0
    finally:
        if daemon.process.poll() is None:
            daemon.stop(signal.SIGKILL)
