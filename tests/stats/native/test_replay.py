"""The native replay engine gives exactly the Python engine's statistics (stats/native/replay.py).

The Python pipeline (`Pipeline.offer` per line, then `finish`) is the reference. Equality is
exact: every window bucket with its states, moments and delays in order, the arrival counters,
the event counters, the newest event time and the snapshot read from them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import AGENT_PRESETS, PRESETS, SHARING_PRESETS, preset
from kvcast.stats.config import STATE_INTENT_MODES, StatsConfig
from kvcast.stats.engine import StatsEngine
from kvcast.stats.labeller import IntentLabeller
from kvcast.stats.native.replay import NativeReplay, ReplayUnsupported
from kvcast.stats.replay import Pipeline, replay_lines
from kvcast.stats.taxonomy import AGENT_INTENTS, INTENTS_30, intents, label_map
from kvcast.stats.window import DelaySample
from tests.stats.test_events_decoder import EDGE_CASES, payloads
from tests.support import canonical, require_native, shared_prefix_events

TINY = StatsConfig(
    block_size=4,
    completion_timeout_s=3.0,
    allowed_lateness_s=1.0,
    max_turn=3,
    window_conversations=50,
    bucket_s=1.0,
    rate_window_s=2,
    max_open_conversations=5,
)
# Lines the contract rejects, one per kind of problem (parse_event names each).
BAD_LINES = (
    b"{broken",
    b"[1, 2]",
    b'{"session_id": "s", "turn": 0, "timestamp": 1, "input_tokens": 1, "output_tokens": 1}',
    b'{"session_id": "s", "turn": 1, "timestamp": -1, "input_tokens": 1, "output_tokens": 1}',
    b'{"session_id": 7, "turn": 1, "timestamp": 1, "input_tokens": 1, "output_tokens": 1}',
    b'{"turn": 1, "timestamp": 1, "input_tokens": 1, "output_tokens": 1}',
    b'{"schema": 2, "session_id": "s", "turn": 1, "timestamp": 1, "input_tokens": 1,'
    b' "output_tokens": 1}',
    b'{"session_id": "s", "turn": 1, "timestamp": 1, "input_tokens": 1, "output_tokens": 1,'
    b' "cached_tokens": 2}',
    b'{"session_id": "s", "turn": 1, "timestamp": 1, "input_tokens": 1, "output_tokens": 1,'
    b' "messages": [{"role": "user"}]}',
)
# Valid lines that the strict decoder leaves to parse_event's second look (messages to check,
# an unknown field, a block id beyond int64) or refuses outright (text, not bytes).
SECOND_LOOK_LINES = (
    b'{"session_id": "s1", "turn": 2, "timestamp": 3.5, "input_tokens": 40, "output_tokens": 1,'
    b' "messages": [{"role": "user", "content": "hi"}]}',
    b'{"session_id": "s2", "turn": 1, "timestamp": 2, "input_tokens": 9, "output_tokens": 1,'
    b' "from_the_future": true}',
    b'{"session_id": "s3", "turn": 1, "timestamp": 1, "input_tokens": 9, "output_tokens": 1,'
    b' "block_hashes": [18446744073709551615]}',
    b'  {"session_id": "s0", "turn": 3, "timestamp": 4, "input_tokens": 9, "output_tokens": 1}  ',
)


@pytest.fixture(autouse=True)
def _native_built() -> None:
    require_native()


# Both engines judge `future` against this wall clock (s), so that they see the same bound.
CLOCK_S = 1_800_000_000.0


def python_replay(
    lines: Sequence[bytes],
    config: StatsConfig,
    labels: dict[str, str] | None = None,
    clock_s: float = CLOCK_S,
) -> tuple[StatsEngine, Pipeline]:
    pipeline = Pipeline(config, IntentLabeller(label_map=labels or label_map()), clock_s=clock_s)
    pipeline.offer_all(lines)
    pipeline.engine.finish()
    return pipeline.engine, pipeline


def native_replay(
    lines: Sequence[bytes],
    config: StatsConfig,
    batch: int = 1000,
    labels: dict[str, str] | None = None,
    clock_s: float = CLOCK_S,
) -> tuple[StatsEngine, NativeReplay]:
    replay = NativeReplay(config, label_map=labels, clock_s=clock_s)
    for start in range(0, len(lines), batch):
        assert replay.offer_lines(iter(lines[start : start + batch])) == len(
            lines[start : start + batch]
        )
    replay.finish()
    return replay.to_engine(), replay


def state(engine: StatsEngine) -> tuple:
    """Everything the engine holds after its input ended, in order, compared exactly."""
    buckets = [
        (
            index,
            bucket.conversations,
            [(key, (s.reached, s.continued)) for key, s in bucket.states.items()],
            list(bucket.moments.items()),
            bucket.delays,
            bucket.shared_gaps,
        )
        for index, bucket in engine.window.buckets.items()
    ]
    arrivals = engine.arrivals
    return (
        buckets,
        list(arrivals.seconds.items()),
        arrivals.first_start,
        arrivals.newest_start,
        arrivals.start_count,
        engine.counters.to_dict(),
        engine.tracker.newest_event_time,
        engine.tracker.open_conversations,
    )


def assert_same(
    lines: Sequence[bytes],
    config: StatsConfig,
    batch: int = 1000,
    labels: dict[str, str] | None = None,
    clock_s: float = CLOCK_S,
) -> StatsEngine:
    expected, pipeline = python_replay(lines, config, labels, clock_s)
    got, replay = native_replay(lines, config, batch, labels, clock_s)
    assert state(got) == state(expected)
    assert canonical(got.snapshot()) == canonical(expected.snapshot())
    assert replay.labels() == (pipeline.labeller.labels, pipeline.labeller.folded)
    assert got.rejections == expected.rejections  # where, why and which field
    for bucket in got.window.buckets.values():
        assert all(type(delay) is DelaySample for delay in bucket.delays)
    return got


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_generator_preset_gives_the_python_engines_statistics(name: str) -> None:
    trace = generate(preset(name), lambda0=2.0, conversations=1500, seed=11)
    got = assert_same(list(trace.jsonl_lines()), StatsConfig(), batch=777)
    assert got.counters.processed > 0 and got.window.buckets
    # The presets that send block hashes give shared-prefix statistics, the others none.
    assert got.snapshot().sample.has_shared == (name in SHARING_PRESETS + AGENT_PRESETS)


def test_a_window_that_expires_while_replaying_matches() -> None:
    trace = generate(preset("mixed"), lambda0=2.0, conversations=4000, seed=5)
    config = StatsConfig(window_conversations=300, bucket_s=10.0, window_max_age_s=900.0)
    got = assert_same(list(trace.jsonl_lines()), config)
    assert sum(b.conversations for b in got.window.buckets.values()) < 4000  # expiry ran


def event_line(
    session: int, turn: int, ts: float, tokens: int, *, intent: str | None, cached: int | None,
    request_id: str | None, hashes: list[int | str] | None = None,
) -> bytes:  # fmt: skip
    event: dict[str, object] = {
        "session_id": f"s{session}",
        "turn": turn,
        "timestamp": ts,
        "input_tokens": tokens,
        "output_tokens": 5,
    }
    if intent is not None:
        event["intent"] = intent
    if cached is not None:
        event["cached_tokens"] = min(cached, tokens)
    if request_id is not None:
        event["request_id"] = request_id
    if hashes is not None:
        event["block_hashes"] = hashes
    return orjson.dumps(event)


# Block ids a hostile stream's requests are made of: two system prompts that conversations
# share, ids of every kind the contract allows (64-bit, negative, str), and a context per
# pair of sessions (a branch: the two share it as far as both have got), which a retried or
# reordered turn repeats and a new context drops.
SYSTEM_PROMPTS: tuple[list[int | str], ...] = ([1, 2, 3], [1, 2, "tools", 2**64 - 1])


@st.composite
def block_hashes(draw: st.DrawFn, session: int, turn: int) -> list[int | str] | None:
    """A request's ids: none, a shared prompt then the session's own ids up to this turn
    (a growing context), or a fresh context (its own ids only)."""
    kind = draw(st.sampled_from(("none", "grow", "grow", "grow", "fresh", "empty")))
    if kind == "none":
        return None
    if kind == "empty":
        return []
    own: list[int | str] = [-(session // 2 * 100 + k) for k in range(1, turn + 1)]
    if kind == "fresh":
        return [f"s{session}-new-{draw(st.integers(0, 2))}", *own[: draw(st.integers(0, 2))]]
    return [*draw(st.sampled_from(SYSTEM_PROMPTS)), *own]


@st.composite
def hostile_streams(draw: st.DrawFn) -> tuple[list[bytes], StatsConfig, int]:
    """Few sessions, clustered and jittered times (late events, resumed sessions, shed
    conversations), retried turns, repeated request ids, bad lines, gaps in turns."""
    count = draw(st.integers(1, 120))
    lines: list[bytes] = []
    clock = 0.0
    for _ in range(count):
        if draw(st.integers(0, 15)) == 0:
            lines.append(draw(st.sampled_from(BAD_LINES + SECOND_LOOK_LINES)))
            continue
        if draw(st.booleans()) and lines:
            lines.append(draw(st.sampled_from(lines)))  # an exact duplicate (or a bad line again)
            continue
        clock += draw(st.sampled_from((0.0, 0.25, 0.5, 1.0, 2.5, 4.0)))
        jitter = draw(st.sampled_from((0.0, 0.0, -0.5, -1.5, -3.0)))
        session, turn = draw(st.integers(0, 7)), draw(st.integers(1, 6))
        lines.append(
            event_line(
                session,
                turn,
                max(0.0, clock + jitter),
                draw(st.integers(0, 40)),
                intent=draw(
                    st.sampled_from(
                        (None, "chitchat", "code_generation", "unknown", *AGENT_INTENTS)
                    )
                ),
                cached=draw(st.none() | st.integers(0, 40)),
                request_id=draw(st.none() | st.sampled_from(("r1", "r2", "r3"))),
                hashes=draw(block_hashes(session, turn)),
            )
        )
    config = StatsConfig(
        block_size=draw(st.sampled_from((1, 4, 16))),
        completion_timeout_s=draw(st.sampled_from((1.0, 3.0, 7.5))),
        allowed_lateness_s=draw(st.sampled_from((0.0, 1.0, 2.0))),
        max_turn=draw(st.integers(1, 4)),
        window_conversations=draw(st.sampled_from((1, 3, 50))),
        window_max_age_s=draw(st.sampled_from((2.0, 10.0, 86_400.0))),
        bucket_s=draw(st.sampled_from((0.5, 1.0, 3.0))),
        rate_window_s=draw(st.integers(1, 3)),
        max_open_conversations=draw(st.integers(1, 6)),
        shared_index_blocks=draw(st.sampled_from((0, 1000, 6))),
        state_intent=draw(st.sampled_from(STATE_INTENT_MODES)),
    )
    return lines, config, draw(st.integers(1, 40))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_streams())
def test_hostile_streams_give_the_python_engines_statistics(
    case: tuple[list[bytes], StatsConfig, int],
) -> None:
    lines, config, batch = case
    assert_same(lines, config, batch)


def test_counters_agree_while_the_input_is_still_open() -> None:
    trace = generate(preset("mixed"), lambda0=2.0, conversations=800, seed=2)
    lines = list(trace.jsonl_lines())
    lines[100:100] = [*BAD_LINES, lines[50], lines[40]]
    pipeline = Pipeline(TINY)
    replay = NativeReplay(TINY)
    for start in range(0, len(lines), 250):
        batch = lines[start : start + 250]
        pipeline.offer_all(batch)
        replay.offer_lines(batch)
        counters = pipeline.engine.counters
        assert replay.processed == counters.processed
        assert replay.duplicates == counters.duplicates
        assert replay.rejected_total == sum(counters.rejected.values())
        assert state(replay.to_engine())[:5] == state(_as_finished(pipeline.engine))[:5]
    assert replay.last_rejection is not None and pipeline.last_rejection is not None
    assert replay.last_rejection.reason == pipeline.last_rejection.reason == "wrong_type"
    assert replay.last_rejection.detail == pipeline.last_rejection.detail


def _as_finished(engine: StatsEngine) -> StatsEngine:
    """The window and arrivals of a running engine, as NativeReplay.to_engine reports them."""
    return StatsEngine.finished(
        engine.config,
        buckets=engine.window.buckets,
        arrivals=engine.arrivals,
        counters=engine.counters,
        newest_ts=engine.tracker.newest_event_time,
    )


@pytest.mark.parametrize(("size", "extra"), [(30, ()), (20, ()), (10, ("billing", "triage"))])
def test_labels_outside_the_taxonomy_fold_into_unknown_as_the_labeller_does(
    size: int, extra: tuple[str, ...]
) -> None:
    """Taxonomy labels, the 30 originals under a merge, the agent intents, a deployment's extra
    intents and 80 junk labels sent first (label squatting): both engines give every event the
    same state."""
    junk = [f"label-{i}" for i in range(80)]
    names = [*junk, *INTENTS_30, *AGENT_INTENTS, "billing", "triage", "unknown"]
    lines = [
        event_line(i, 1, float(i), 32, intent=names[i % len(names)], cached=None, request_id=None)
        for i in range(3 * len(names))
    ]
    labels = label_map(size, extra)
    assert_same(lines, StatsConfig(), labels=labels)
    _, replay = native_replay(lines, StatsConfig(), labels=labels)
    kept, folded = replay.labels()
    assert kept == set(intents(size)[:-1]) | set(extra)  # every category, whatever came first
    assert folded == 3 * (len(junk) + 2 - len(extra))


@pytest.mark.parametrize("clock_s", [0.0, 150.0, CLOCK_S])
def test_an_event_too_far_ahead_is_future_in_both_engines_with_the_same_bound(
    clock_s: float,
) -> None:
    config = StatsConfig(max_future_skew_s=100.0, allowed_lateness_s=1e9)
    times = [10.0, 110.0 + 1e-9, 110.0, 210.0, 1e300, 3.0e12, 200.0, 250.0, 351.0, 260.0]
    lines = [
        event_line(i % 3, 1 + i // 3, t, 32, intent=None, cached=None, request_id=None)
        for i, t in enumerate(times)
    ]
    got = assert_same(lines, config, batch=3, clock_s=clock_s)
    bound = clock_s + 100.0  # max(newest, clock) + skew, the newest moving with each event
    future = 0
    for t in times:
        if t > bound:
            future += 1
        else:
            bound = max(bound, t + 100.0)
    assert got.counters.rejected["future"] == future > 0
    assert got.counters.processed == len(times) - future


def test_a_timestamp_beyond_2_52_s_hands_the_replay_to_the_python_engine(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lines = [
        event_line(1, 1, 10.0, 32, intent=None, cached=None, request_id=None),
        event_line(2, 1, 2.0**53, 32, intent=None, cached=None, request_id=None),
        event_line(1, 2, 20.0, 32, intent=None, cached=None, request_id=None),
    ]
    config = StatsConfig(max_future_skew_s=math.inf)  # else 2**53 s is `future`, see below
    replay = NativeReplay(config)
    with pytest.raises(ReplayUnsupported):
        replay.offer_lines(lines)
    assert replay.processed == 1  # the lines before it stay applied
    expected, _ = python_replay(lines, config)

    def batches() -> Iterator[list[bytes]]:
        yield lines

    with caplog.at_level("WARNING", logger="kvcast.stats.replay"):
        got = replay_lines(batches, config, engine="native")
    assert state(got) == state(expected)
    assert "replaying with the Python engine" in caplog.text  # the operator learns why


def test_an_error_other_than_a_rejection_propagates_and_keeps_what_came_before() -> None:
    good = event_line(1, 1, 10.0, 32, intent=None, cached=None, request_id=None)
    replay = NativeReplay(StatsConfig())
    with pytest.raises(TypeError):
        replay.offer_lines([good, 12345])  # type: ignore[list-item]
    assert replay.processed == 1 and replay.rejected_total == 0


def test_events_with_block_hashes_are_replayed_natively_with_their_shared_prefixes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lines = [orjson.dumps(e) for e in shared_prefix_events(600, seed=9)]
    got = assert_same(lines, StatsConfig(), batch=97)
    assert got.snapshot().sample.has_shared
    with caplog.at_level("WARNING", logger="kvcast.stats.replay"):
        replayed = replay_lines(lambda: [lines], StatsConfig(), engine="native", clock_s=CLOCK_S)
    assert state(replayed) == state(got)
    assert "replaying with the Python engine" not in caplog.text


def test_a_small_shared_prefix_index_fills_and_expires_as_the_trackers_does() -> None:
    """Few ids and a short timeout: the index runs full (new blocks left out) and its shared
    blocks expire while the replay goes on."""
    lines = [orjson.dumps(e) for e in shared_prefix_events(800, seed=4, rate_per_s=0.2)]
    config = StatsConfig(shared_index_blocks=40, completion_timeout_s=30.0)
    got = assert_same(lines, config, batch=250)
    assert got.snapshot().sample.has_shared


def test_float_times_keep_every_bit() -> None:
    times = [1e9 + math.ulp(1e9) * k for k in range(0, 40, 3)] + [0.1 + 0.2, 1 / 3]
    lines = [
        event_line(i % 3, 1 + i // 3, ts, 17 + i, intent=None, cached=i, request_id=None)
        for i, ts in enumerate(sorted(times))
    ]
    assert_same(lines, StatsConfig(allowed_lateness_s=1e10))


def test_lines_the_strict_decoder_refuses_are_decided_by_parse_event() -> None:
    lines = [*SECOND_LOOK_LINES, *BAD_LINES, SECOND_LOOK_LINES[0].decode()]
    # One line carries block hashes: with the shared-prefix index on, that alone would hand
    # the replay to the Python engine (tested below); here the decoders are compared.
    got = assert_same(lines, StatsConfig(shared_index_blocks=0))  # type: ignore[arg-type]
    assert got.counters.processed == len(SECOND_LOOK_LINES)
    assert got.counters.duplicates == 1  # the text line repeats the first
    assert sum(got.counters.rejected.values()) == len(BAD_LINES)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(payloads(), min_size=1, max_size=4))
def test_every_payload_is_decided_as_parse_event_decides_it(raws: list[bytes]) -> None:
    """The native loop's own decoding (EventFields, parse_event's two checks, the default
    request id) accepts, rejects and reads exactly what parse_event does."""
    assert_same_or_handed_over(raws, StatsConfig())


@pytest.mark.parametrize("raw", EDGE_CASES.values(), ids=EDGE_CASES.keys())
def test_edge_case_payloads_are_decided_as_parse_event_decides_them(raw: bytes) -> None:
    assert_same_or_handed_over([raw, raw], StatsConfig())


def assert_same_or_handed_over(lines: list[bytes], config: StatsConfig) -> None:
    """assert_same, or where the native engine cannot represent a value (a timestamp of 2**52 s
    or more), the replay it hands to the Python engine equals the Python engine's."""
    try:
        assert_same(lines, config)
    except ReplayUnsupported:
        expected, _ = python_replay(lines, config)
        assert state(replay_lines(lambda: [lines], config, engine="native")) == state(expected)


@pytest.mark.parametrize("session", ["s", "é-1", "日本", "🙂x"])
def test_a_left_out_request_id_is_the_contracts_default_in_every_string_width(
    session: str,
) -> None:
    base = {"session_id": session, "turn": 3, "timestamp": 5.0, "input_tokens": 9}
    lines = [
        orjson.dumps({**base, "output_tokens": 1}),
        orjson.dumps({**base, "output_tokens": 2, "request_id": f"{session}\x1f3"}),
        orjson.dumps({**base, "output_tokens": 3, "turn": 4}),
    ]
    got = assert_same(lines, StatsConfig())
    assert got.counters.duplicates == 1 and got.counters.processed == 2


def test_both_engines_keep_the_same_first_hundred_rejections_with_their_fields() -> None:
    good = [event_line(n, 1, float(n), 32, intent=None, cached=None, request_id=None)
            for n in range(50)]  # fmt: skip
    bad = [b"{", b"[]", orjson.dumps({"session_id": "x", "turn": 0, "timestamp": 1.0,
                                      "input_tokens": 1, "output_tokens": 1})] * 60  # fmt: skip
    lines = [line for pair in zip(good * 4, bad, strict=False) for line in pair]
    got = assert_same(lines, StatsConfig(), batch=7)
    assert len(got.rejections) == 100 and got.counters.rejected.total() == len(bad)
    assert got.rejections[:3] == [(1, "invalid_json", None), (3, "not_an_object", None),
                                  (5, "out_of_range", "turn")]  # fmt: skip
