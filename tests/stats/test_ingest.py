"""The one ingest step: payloads parsed, labelled in runs between rejections, applied in order."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from kvcast.stats.config import StatsConfig
from kvcast.stats.engine import REJECTIONS_KEPT, StatsEngine
from kvcast.stats.events import Event, EventRejected, parse_event
from kvcast.stats.ingest import EngineTarget, ingest
from kvcast.stats.labeller import IntentLabeller
from kvcast.stats.partition import PartitionEngine
from kvcast.stats.snapshot import take_snapshot
from kvcast.stats.taxonomy import label_map
from kvcast.stats.window import StatsWindow
from tests.support import canonical

# Short timeouts and buckets, so that conversations complete (and fill several buckets) while
# the stream is still being read, not only at its end.
CONFIG = StatsConfig(
    completion_timeout_s=300,
    allowed_lateness_s=20,
    max_turn=6,
    bucket_s=30,
    rate_window_s=120,
    window_conversations=40,
)

# Payloads that fail validation, each with the reason it is counted under.
MALFORMED: tuple[tuple[bytes, str], ...] = (
    (b"not json", "invalid_json"),
    (b"[1, 2]", "not_an_object"),
    (b'{"session_id": "x", "turn": 1}', "missing_field"),
    (
        b'{"session_id": "x", "turn": 0, "timestamp": 5.0, "input_tokens": 4, "output_tokens": 1}',
        "out_of_range",
    ),
    (
        b'{"session_id": "x", "turn": 1, "timestamp": 5.0, "input_tokens": 4,'
        b' "output_tokens": 1, "cached_tokens": 5}',
        "cached_exceeds_input",
    ),
)

# The intents these tests send: taxonomy labels and a few of the tests' own, added as a
# deployment adds its own (--taxonomy-file), so that every label counts as itself.
LABELS = label_map(
    30, [*(f"i{n}" for n in range(5)), "coding", *(f"turn-{t}" for t in range(1, 30))]
)


def event(**fields: object) -> bytes:
    base = {"session_id": "s", "turn": 1, "timestamp": 10.0, "input_tokens": 40, "output_tokens": 2}
    return orjson.dumps({**base, **fields})


@dataclass
class Recorder:
    """An ingest target that records what reached it, in order."""

    log: list[tuple[str, int]] = field(default_factory=list)
    applied: list[tuple[int, str, str]] = field(default_factory=list)  # position, session, intent
    rejected: list[tuple[str, int]] = field(default_factory=list)  # reason, position

    def apply(self, event: Event, intent: str, position: int) -> object:
        self.log.append(("apply", position))
        self.applied.append((position, event.session_id, intent))
        return "accepted"

    def reject(self, reason: str, position: int, field: str | None) -> None:
        self.log.append(("reject", position))
        self.rejected.append((reason, position))


def batch_recording_labeller() -> tuple[IntentLabeller, list[int]]:
    """A labeller whose classifier labels a batch ``turn-<turn>`` and records each batch size."""
    sizes: list[int] = []

    def classify_batch(events: Sequence[Event]) -> list[str]:
        sizes.append(len(events))
        return [f"turn-{e.turn}" for e in events]

    return IntentLabeller(label_map=LABELS, classify_batch=classify_batch), sizes


def test_valid_payloads_are_applied_in_order_with_their_positions() -> None:
    target = Recorder()
    payloads = [event(session_id=f"s{n}", intent=f"i{n}") for n in range(5)]
    payloads[2] = payloads[2].decode()  # text is a payload too
    items = [(target, 100 + n, payload) for n, payload in enumerate(payloads)]
    assert ingest(items, IntentLabeller(label_map=LABELS)) is None
    assert target.applied == [(100 + n, f"s{n}", f"i{n}") for n in range(5)]
    assert target.rejected == []


def test_nothing_to_ingest_is_no_rejection() -> None:
    labeller, sizes = batch_recording_labeller()
    assert ingest([], labeller) is None
    assert sizes == []


def test_rejections_are_counted_with_their_reason_and_position_and_the_last_is_returned() -> None:
    target = Recorder()
    items = [(target, 0, event())]
    items += [(target, 1 + n, payload) for n, (payload, _) in enumerate(MALFORMED)]
    items += [(target, 9, event(session_id="t"))]
    last = ingest(items, IntentLabeller(label_map=LABELS))
    assert target.rejected == [(reason, 1 + n) for n, (_, reason) in enumerate(MALFORMED)]
    assert [position for position, _, _ in target.applied] == [0, 9]
    assert isinstance(last, EventRejected)
    assert last.reason == MALFORMED[-1][1] == "cached_exceeds_input"
    assert "cached_tokens" in last.detail


def test_the_valid_payloads_between_two_rejections_are_labelled_in_one_batch() -> None:
    labeller, sizes = batch_recording_labeller()
    target = Recorder()
    # v v v R v v R R v, and a leading rejection: no empty batch is ever asked for.
    pattern = "RvvvRvvRRv"
    items = [
        (target, n, b"not json" if kind == "R" else event(session_id=f"s{n}", turn=1 + n % 3))
        for n, kind in enumerate(pattern)
    ]
    ingest(items, labeller)
    assert sizes == [3, 2, 1]
    # Every event got its own label from the batch answer, in order.
    assert target.applied == [
        (n, f"s{n}", f"turn-{1 + n % 3}") for n, kind in enumerate(pattern) if kind == "v"
    ]


def test_a_batch_holds_only_the_events_without_a_producer_label() -> None:
    labeller, sizes = batch_recording_labeller()
    target = Recorder()
    items = [
        (target, 0, event(session_id="a", intent="chitchat")),
        (target, 1, event(session_id="b", turn=2)),
        (target, 2, event(session_id="c", intent="coding")),
        (target, 3, event(session_id="d", turn=3)),
    ]
    ingest(items, labeller)
    assert sizes == [2]
    assert [intent for _, _, intent in target.applied] == ["chitchat", "turn-2", "coding", "turn-3"]


def test_the_run_before_a_rejection_is_applied_before_the_rejection_is_counted() -> None:
    target = Recorder()
    pattern = "vvRvRRvv"
    items = [
        (target, n, b"{" if kind == "R" else event(session_id=f"s{n}"))
        for n, kind in enumerate(pattern)
    ]
    ingest(items, IntentLabeller(label_map=LABELS))
    assert target.log == [
        ("reject" if kind == "R" else "apply", n) for n, kind in enumerate(pattern)
    ]


def test_several_targets_each_receive_only_their_own_items_in_order() -> None:
    labeller, sizes = batch_recording_labeller()
    targets = {name: Recorder() for name in ("p:0", "p:1", "p:2")}
    # One poll across partitions, as the daemon hands it over: (partition, offset, payload).
    poll = [
        ("p:0", 10, event(session_id="a")),
        ("p:1", 70, event(session_id="b")),
        ("p:0", 11, b"not json"),
        ("p:2", 5, event(session_id="c")),
        ("p:1", 71, event(session_id="b", turn=2)),
        ("p:2", 6, b"[]"),
        ("p:0", 12, event(session_id="a", turn=2)),
    ]
    last = ingest(((targets[p], offset, payload) for p, offset, payload in poll), labeller)
    assert last is not None and last.reason == "not_an_object"
    for name, target in targets.items():
        own = [(offset, payload) for p, offset, payload in poll if p == name]
        assert [position for _, position in target.log] == [offset for offset, _ in own]
    assert targets["p:0"].log == [("apply", 10), ("reject", 11), ("apply", 12)]
    assert targets["p:1"].log == [("apply", 70), ("apply", 71)]
    assert targets["p:2"].log == [("apply", 5), ("reject", 6)]
    assert targets["p:0"].rejected == [("invalid_json", 11)]
    assert targets["p:2"].rejected == [("not_an_object", 6)]
    # A rejection in one partition ends the run of all: the classifier batches span targets.
    assert sizes == [2, 2, 1]


def _classify(e: Event) -> str:
    """A deterministic stand-in for the classifier, a function of the event alone."""
    return ("coding", "chitchat", "translation")[sum(e.session_id.encode()) % 3]


@st.composite
def streams(draw: st.DrawFn) -> list[bytes]:
    """A generated workload's lines with malformed ones, duplicates and unlabelled events."""
    trace = generate(
        preset("mixed"),
        lambda0=draw(st.sampled_from([0.2, 1.0, 3.0])),
        conversations=draw(st.integers(1, 60)),
        seed=draw(st.integers(0, 2**32 - 1)),
        cached_capacity_blocks=draw(st.sampled_from([None, 40, 400])),
    )
    lines = [line.rstrip(b"\n") for line in trace.jsonl_lines()]
    for index in draw(st.lists(st.integers(0, len(lines) - 1), max_size=len(lines) // 3)):
        decoded = orjson.loads(lines[index])
        decoded.pop("intent", None)  # left to the classifier
        lines[index] = orjson.dumps(decoded)
    for _ in range(draw(st.integers(0, 3))):  # redelivered events
        lines.insert(draw(st.integers(0, len(lines))), lines[draw(st.integers(0, len(lines) - 1))])
    for payload, _ in draw(st.lists(st.sampled_from(MALFORMED), max_size=8)):
        lines.insert(draw(st.integers(0, len(lines))), payload)
    return lines


def direct(lines: list[bytes]) -> StatsEngine:
    """The reference: each line parsed and handed to the engine on its own, in order."""
    engine = StatsEngine(CONFIG)
    labeller = IntentLabeller(label_map=LABELS, classify=_classify)
    for line in lines:
        try:
            parsed = parse_event(line)
        except EventRejected as rejection:
            engine.reject(rejection.reason)
            continue
        engine.apply(parsed, labeller(parsed))
    return engine


def batch_labeller() -> IntentLabeller:
    return IntentLabeller(
        label_map=LABELS, classify_batch=lambda events: [_classify(e) for e in events]
    )


def assert_same_statistics(engine: StatsEngine, expected: StatsEngine) -> None:
    assert engine.counters.to_dict() == expected.counters.to_dict()
    assert engine.tracker.newest_event_time == expected.tracker.newest_event_time
    for now_s in (None, 1e6):
        snapshot, reference = engine.snapshot(now_s), expected.snapshot(now_s)
        assert canonical(snapshot) == canonical(reference)
        assert snapshot.generated_at == reference.generated_at


@settings(max_examples=25, deadline=None)
@given(streams())
def test_an_engine_target_counts_as_the_engine_applied_directly(lines: list[bytes]) -> None:
    engine = StatsEngine(CONFIG)
    ingest(((EngineTarget(engine), n, line) for n, line in enumerate(lines)), batch_labeller())
    expected = direct(lines)
    assert_same_statistics(engine, expected)  # mid-stream: open conversations pending
    engine.finish()
    expected.finish()
    assert_same_statistics(engine, expected)


def test_an_engine_target_returns_the_engine_outcome() -> None:
    target = EngineTarget(StatsEngine(CONFIG))
    parsed = parse_event(event())
    assert target.apply(parsed, "chitchat", 0) == "accepted"
    assert target.apply(parsed, "chitchat", 1) == "duplicate"
    target.reject("invalid_json", 2, None)
    assert target.engine.counters.to_dict() == {
        "processed": 1,
        "rejected": 1,
        "rejected_by_reason": {"invalid_json": 1},
        "duplicates": 1,
    }
    assert target.engine.rejections == [(2, "invalid_json", None)]  # duplicates are not


def test_rejections_are_kept_with_position_reason_and_field_the_first_hundred() -> None:
    engine = StatsEngine(CONFIG, clock_s=0.0)
    lines = [
        b"{broken",
        event(turn=0),
        event(session_id="a"),
        event(session_id="a", turn=2, timestamp=1e9),
    ]
    lines += [b"[]"] * (REJECTIONS_KEPT + 5)
    ingest(((EngineTarget(engine), n, line) for n, line in enumerate(lines)), batch_labeller())
    assert engine.rejections[:3] == [
        (0, "invalid_json", None),
        (1, "out_of_range", "turn"),
        (3, "future", "timestamp"),
    ]
    assert engine.rejections[3] == (4, "not_an_object", None)
    assert len(engine.rejections) == REJECTIONS_KEPT
    assert sum(engine.counters.rejected.values()) == REJECTIONS_KEPT + 8


@settings(max_examples=15, deadline=None)
@given(streams())
def test_a_partition_engine_ingests_a_partition_as_a_stats_engine_does_the_log(
    lines: list[bytes],
) -> None:
    partition = PartitionEngine(CONFIG, "p:0")
    ingest(((partition, n, line) for n, line in enumerate(lines)), batch_labeller())
    engine = StatsEngine(CONFIG)
    ingest(((EngineTarget(engine), n, line) for n, line in enumerate(lines)), batch_labeller())
    assert partition.offset == len(lines) - 1  # every payload, valid or not, moves the offset
    partition.flush()
    engine.finish()
    delta = partition.take_delta()
    assert delta.offset == len(lines) - 1 and delta.base_offset == -1
    assert delta.counters.to_dict() == engine.counters.to_dict()
    assert delta.newest_ts == engine.tracker.newest_event_time
    assert delta.arrivals == engine.arrivals
    # Fewer than EXPIRE_EVERY_COMPLETIONS conversations: the engine kept every bucket too.
    assert delta.buckets == engine.window.buckets
    window = StatsWindow(CONFIG)
    window.buckets = delta.buckets
    now = delta.newest_ts if math.isfinite(delta.newest_ts) else None
    snapshot = take_snapshot(window, delta.arrivals, CONFIG, now)
    assert canonical(snapshot) == canonical(engine.snapshot())
    assert snapshot.generated_at == engine.snapshot().generated_at


@pytest.mark.parametrize("payload,reason", MALFORMED)
def test_each_malformed_payload_is_rejected_with_its_reason(payload: bytes, reason: str) -> None:
    target = Recorder()
    last = ingest([(target, 3, payload)], IntentLabeller(label_map=LABELS))
    assert last is not None and last.reason == reason
    assert target.rejected == [(reason, 3)] and target.applied == []
