"""The statistics engine (SPEC section 3) against a brute-force recomputation from raw events."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcast.stats.config import StatsConfig
from kvcast.stats.conversations import ConversationTracker
from kvcast.stats.engine import StatsEngine
from kvcast.stats.events import parse_event
from kvcast.stats.snapshot import Snapshot
from tests.support import canonical

INTENTS = ("code_generation", "chitchat", "translation")
CONFIG = StatsConfig(
    block_size=16,
    completion_timeout_s=1800,
    allowed_lateness_s=120,
    max_turn=6,
    window_conversations=10**9,
    rate_window_s=300,
)


def random_events(
    rng: np.random.Generator,
    conversations: int,
    rate: float = 0.5,
    cached: bool = True,
    intents: tuple[str, ...] = INTENTS,
    skip_turns: bool = False,
) -> list[dict]:
    """Sessions with intents changing over turns, delays well below the completion timeout;
    ``skip_turns``: some turns (never the first) are left out, as a lost event would be."""
    events = []
    start = 1_000.0
    for index in range(conversations):
        start += rng.exponential(1 / rate)
        turns = int(rng.integers(1, 10))
        ts, blocks = start, 0
        for turn in range(1, turns + 1):
            blocks += int(rng.integers(1, 5))
            if skip_turns and turn > 1 and rng.random() < 0.2:
                ts += rng.lognormal(3.0, 1.0)
                continue
            input_tokens = (blocks - 1) * 16 + int(rng.integers(1, 17))
            event = {
                "session_id": f"s{index}",
                "turn": turn,
                "timestamp": round(ts, 3),
                "input_tokens": input_tokens,
                "output_tokens": int(rng.integers(0, 50)),
                "intent": intents[int(rng.integers(0, len(intents)))],
            }
            if cached:
                event["cached_tokens"] = int(rng.integers(0, input_tokens + 1))
            events.append(event)
            ts += rng.lognormal(3.0, 1.0)
    events.sort(key=lambda e: e["timestamp"])
    return events


def run(events: list[dict], config: StatsConfig = CONFIG, finish: bool = True) -> StatsEngine:
    engine = StatsEngine(config)
    for raw in events:
        event = parse_event(raw)
        engine.apply(event, event.intent or "unknown")
    if finish:
        engine.finish()
    return engine


def state_intents(turns: dict[int, dict], mode: str) -> dict[int, str]:
    """Turn -> the intent its state is filed under (``StatsConfig.state_intent``, SPEC section
    3), every turn from 1 to the last; a missing turn takes the one before it."""
    conversation = turns[max(turns)]["intent"]
    out, current = {}, conversation
    for t in range(1, max(turns) + 1):
        if t in turns:
            own = turns[t]["intent"]
            keeps_own = mode == "turn" or (mode == "auto" and own.startswith("agent_"))
            current = own if keeps_own else conversation
        out[t] = current
    return out


def brute_force(events: list[dict], config: StatsConfig) -> dict:
    """Everything SPEC section 3 defines, straight from the events, no windows or buckets."""
    sessions: dict[str, dict[int, dict]] = defaultdict(dict)
    for e in events:
        sessions[e["session_id"]].setdefault(e["turn"], e)
    reached: dict = defaultdict(int)
    continued: dict = defaultdict(int)
    logs: dict = defaultdict(list)
    delays = []
    moments: dict = defaultdict(lambda: np.zeros(6))
    for turns in sessions.values():
        last = max(turns)
        intent = turns[last]["intent"]
        blocks = {t: math.ceil(e["input_tokens"] / config.block_size) for t, e in turns.items()}
        keyed = state_intents(turns, config.state_intent)
        for t in range(1, last + 1):
            state = (keyed[t], min(t, config.max_turn))
            reached[state] += 1
            continued[state] += t < last
        observed = sorted(turns)
        for t in observed[:-1]:
            if t + 1 not in turns:
                continue  # a missing turn leaves no measurable delay
            w = turns[t + 1]["timestamp"] - turns[t]["timestamp"]
            logs[(keyed[t], min(t, config.max_turn))].append(math.log(max(w, 1e-3)))
            delays.append(w)
        moments[intent] += [
            1,
            sum(blocks.values()),
            sum(blocks[t] for t in observed[:-1]),
            sum(max(blocks[t] - 1, 0) for t in observed[:-1]),
            blocks[last],
            last,
        ]
    starts = sorted(e["timestamp"] for e in events if e["turn"] == 1)
    newest = starts[-1]
    span = min(config.rate_window_s, newest - starts[0])
    first_second = math.floor(newest) - config.rate_window_s + 1
    in_window = [e for e in events if first_second <= math.floor(e["timestamp"]) <= newest]
    with_cache = [e for e in in_window if "cached_tokens" in e]
    return {
        "reached": dict(reached),
        "continued": dict(continued),
        "logs": dict(logs),
        "delays": sorted(delays),
        "moments": {k: v.tolist() for k, v in moments.items()},
        "lambda0": sum(1 for e in in_window if e["turn"] == 1) / span,
        "observed": sum(e["cached_tokens"] for e in with_cache)
        / sum(e["input_tokens"] for e in with_cache),
    }


def assert_matches_brute_force(snapshot: Snapshot, expected: dict, config: StatsConfig) -> None:
    rows = {(s.intent, s.turn): s for s in snapshot.states}
    assert set(rows) == set(expected["reached"])
    for state, row in rows.items():
        assert row.conversations == expected["reached"][state]
        assert row.continued == expected["continued"][state]
        assert row.p_continue == pytest.approx(
            expected["continued"][state] / expected["reached"][state]
        )
        logs = expected["logs"].get(state, [])
        assert row.delay_samples == len(logs)
        if logs:
            assert row.mu == pytest.approx(np.mean(logs), rel=1e-9, abs=1e-12)
            assert row.sigma == pytest.approx(np.std(logs), rel=1e-9, abs=1e-9)
            median = math.exp(np.mean(logs)) if len(logs) >= config.min_delay_samples else 150.0
            assert row.median_reuse_s == pytest.approx(median)
        else:
            assert row.mu is None and row.sigma is None
            assert row.median_reuse_s == config.default_median_reuse_s
    sample = snapshot.sample
    assert np.allclose(np.sort(sample.delay_s), expected["delays"])
    for name, moments in zip(sample.intents, sample.by_intent, strict=True):
        got = [
            moments.conversations,
            moments.sum_R,
            moments.sum_H,
            moments.sum_H_hash,
            moments.sum_B,
            moments.sum_M,
        ]
        assert got == expected["moments"][name]
    assert sample.lambda0 == pytest.approx(expected["lambda0"])
    assert sample.observed_hit_ratio == pytest.approx(expected["observed"])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_statistic_matches_brute_force(seed: int) -> None:
    events = random_events(np.random.default_rng(seed), 400)
    assert_matches_brute_force(run(events).snapshot(), brute_force(events, CONFIG), CONFIG)


AGENT_MIX = ("agent_tool_call", "agent_stop", "agent_length", "code_generation")


@pytest.mark.parametrize("mode", ["auto", "conversation", "turn"])
@pytest.mark.parametrize("seed", [4, 5])
def test_every_state_intent_mode_matches_brute_force_with_agent_endings(
    mode: str, seed: int
) -> None:
    """A turn's state takes its own intent (turn; auto: the agent endings only) or the
    conversation's; the workload moments always take the conversation's."""
    config = replace(CONFIG, state_intent=mode)
    events = random_events(np.random.default_rng(seed), 400, intents=AGENT_MIX, skip_turns=True)
    assert_matches_brute_force(run(events, config).snapshot(), brute_force(events, config), config)


def test_auto_separates_a_tool_calls_seconds_from_a_persons_minutes() -> None:
    """Agent traffic labelled by its endings: the table tells a tool call's wait from a stop's,
    which filing every turn under the conversation's last ending cannot."""
    rng = np.random.default_rng(8)
    events = []
    for index in range(300):
        ts = 1.7e9 + 60.0 * index
        for turn in range(1, 9):
            ending = "agent_stop" if turn % 4 == 0 else "agent_tool_call"
            events.append(
                {"session_id": f"a{index}", "turn": turn, "timestamp": ts, "input_tokens": 4_000,
                 "output_tokens": 50, "intent": ending}
            )  # fmt: skip
            ts += rng.lognormal(math.log(600.0 if ending == "agent_stop" else 8.0), 0.3)
    events.sort(key=lambda e: e["timestamp"])
    rows = {
        mode: {(s.intent, s.turn): s for s in run(events, replace(CONFIG, state_intent=mode))
               .snapshot().states}
        for mode in ("auto", "conversation")
    }  # fmt: skip
    auto = rows["auto"]
    assert 6.0 < auto[("agent_tool_call", 1)].median_reuse_s < 11.0
    assert 450.0 < auto[("agent_stop", 4)].median_reuse_s < 800.0
    assert auto[("agent_tool_call", 1)].p_continue == 1.0
    # Filed under the last turn's ending (agent_stop, turn 8), every state mixes both.
    assert {intent for intent, _ in rows["conversation"]} == {"agent_stop"}
    assert 6.0 < rows["conversation"][("agent_stop", 1)].median_reuse_s < 11.0
    assert 450.0 < rows["conversation"][("agent_stop", 4)].median_reuse_s < 800.0
    assert rows["conversation"][("agent_stop", 5)].median_reuse_s < 11.0


def test_the_forecast_keeps_the_conversations_intent_in_every_state_intent_mode() -> None:
    events = random_events(np.random.default_rng(6), 300, intents=AGENT_MIX, skip_turns=True)
    samples = [
        run(events, replace(CONFIG, state_intent=mode)).snapshot().sample
        for mode in ("auto", "conversation", "turn")
    ]
    for sample in samples[1:]:
        assert sample.intents == samples[0].intents
        assert sample.by_intent == samples[0].by_intent
        for column in ("delay_s", "prev_blocks", "intent", "turn", "prev_shared"):
            assert np.array_equal(getattr(sample, column), getattr(samples[0], column))


def test_turns_beyond_max_turn_share_the_last_state() -> None:
    events = random_events(np.random.default_rng(9), 300)
    engine = run(events)
    assert max(s.turn for s in engine.snapshot().states) == CONFIG.max_turn
    assert_matches_brute_force(engine.snapshot(), brute_force(events, CONFIG), CONFIG)


def shuffled_within_lateness(events: list[dict], lateness: float, seed: int) -> list[dict]:
    """Arrival order sorted by timestamp + U(0, 0.9 lateness): never later than allowed."""
    rng = np.random.default_rng(seed)
    keys = [e["timestamp"] + rng.uniform(0, 0.9 * lateness) for e in events]
    return [e for _, e in sorted(zip(keys, events, strict=True), key=lambda p: p[0])]


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_order_within_lateness_does_not_change_anything(seed: int) -> None:
    events = random_events(np.random.default_rng(seed), 120)
    shuffled = shuffled_within_lateness(events, CONFIG.allowed_lateness_s, seed)
    in_order, reordered = run(events), run(shuffled)
    assert reordered.counters.rejected == {}
    assert canonical(in_order.snapshot()) == canonical(reordered.snapshot())


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_two_instances_merged_equal_one(seed: int) -> None:
    events = random_events(np.random.default_rng(seed), 150)
    # Partitioned by session, as Kafka keys them.
    halves = ([], [])
    for e in events:
        halves[hash(e["session_id"]) % 2].append(e)
    first, second = run(halves[0]), run(halves[1])
    first.merge(second)
    whole = run(events)
    assert canonical(first.snapshot(whole.tracker.newest_event_time)) == canonical(whole.snapshot())


def test_duplicates_are_counted_once() -> None:
    events = random_events(np.random.default_rng(5), 100)
    doubled = shuffled_within_lateness(events + [dict(e) for e in events[::3]], 120, 5)
    engine, reference = run(doubled), run(events)
    assert engine.counters.duplicates == len(events[::3])
    assert engine.counters.processed == len(events)
    assert canonical(engine.snapshot()) == canonical(reference.snapshot())


def test_events_behind_the_watermark_are_rejected_as_too_late() -> None:
    events = random_events(np.random.default_rng(6), 100)
    late = dict(events[10], session_id="late", turn=1, request_id="late-1")
    engine = run([*events, late])
    assert engine.counters.rejected == {"too_late": 1}
    assert canonical(engine.snapshot()) == canonical(run(events).snapshot())


def test_conversations_complete_by_event_time_timeout() -> None:
    config = replace(CONFIG, completion_timeout_s=600)
    events = random_events(np.random.default_rng(7), 300)
    events = [e for e in events if e["timestamp"] < 4000] + [
        {"session_id": "clock", "turn": 1, "timestamp": t, "input_tokens": 1, "output_tokens": 0}
        for t in (4000.0, 4500.0, 5000.0)
    ]
    events.sort(key=lambda e: e["timestamp"])
    engine = run(events, config, finish=False)
    watermark = engine.tracker.watermark
    last_ts: dict[str, float] = {}
    for e in events:
        last_ts[e["session_id"]] = max(last_ts.get(e["session_id"], 0), e["timestamp"])
    must = sum(1 for t in last_ts.values() if t + 600 + 1 <= watermark)
    may = sum(1 for t in last_ts.values() if t + 600 < watermark)
    done = engine.snapshot().window_conversations
    assert must <= done <= may and must > 0
    assert engine.tracker.open_conversations == len(last_ts) - done


def test_a_session_idle_past_the_timeout_starts_a_new_conversation() -> None:
    base = {"session_id": "s", "input_tokens": 32, "output_tokens": 1, "intent": "chitchat"}
    events = [
        {**base, "turn": 1, "timestamp": 0.0},
        {**base, "turn": 2, "timestamp": 100.0},
        {**base, "turn": 3, "timestamp": 100.0 + 1800 + 5},
    ]
    snapshot = run(events).snapshot()
    assert snapshot.window_conversations == 2
    rows = {(s.intent, s.turn): s for s in snapshot.states}
    assert rows[("chitchat", 2)].conversations == 1 and rows[("chitchat", 2)].continued == 0
    assert rows[("chitchat", 3)].conversations == 1


def test_count_window_keeps_newest_buckets_and_expires_the_rest() -> None:
    config = replace(CONFIG, window_conversations=100, bucket_s=60, completion_timeout_s=300)
    events = random_events(np.random.default_rng(8), 2000, rate=1.0)
    engine = run(events, config)
    snapshot = engine.snapshot()
    # Brute force: conversations by bucket of their last turn, newest buckets until >= 100.
    last_ts: dict[str, float] = {}
    for e in events:
        last_ts[e["session_id"]] = max(last_ts.get(e["session_id"], 0), e["timestamp"])
    per_bucket: dict[int, int] = defaultdict(int)
    for t in last_ts.values():
        per_bucket[math.floor(t / 60)] += 1
    covered = 0
    for index in sorted(per_bucket, reverse=True):
        covered += per_bucket[index]
        if covered >= 100:
            break
    assert snapshot.window_conversations == covered
    assert 100 <= covered < 100 + max(per_bucket.values())
    assert len(engine.window.buckets) < 2000 / 10  # old buckets were dropped on the way


def test_window_max_age_bounds_the_window() -> None:
    config = replace(CONFIG, window_conversations=10**6, window_max_age_s=3600, bucket_s=60)
    events = random_events(np.random.default_rng(10), 3000, rate=0.5)
    engine = run(events, config)
    newest = engine.tracker.newest_event_time
    last_ts: dict[str, float] = {}
    for e in events:
        last_ts[e["session_id"]] = max(last_ts.get(e["session_id"], 0), e["timestamp"])
    expected = sum(1 for t in last_ts.values() if (math.floor(t / 60) + 1) * 60 > newest - 3600)
    assert engine.snapshot().window_conversations == expected


def test_lambda0_window_clipped_to_the_input_gives_the_whole_input_rate() -> None:
    config = replace(CONFIG, rate_window_s=10**7)
    events = random_events(np.random.default_rng(11), 500, rate=2.0, cached=False)
    sample = run(events, config).snapshot().sample
    starts = [e["timestamp"] for e in events if e["turn"] == 1]
    assert sample.lambda0 == pytest.approx(len(starts) / (max(starts) - min(starts)))
    assert sample.lambda0 == pytest.approx(2.0, rel=0.15)
    assert sample.observed_hit_ratio is None


def test_empty_engine_snapshot_is_well_defined() -> None:
    snapshot = StatsEngine(CONFIG).snapshot()
    assert snapshot.states == () and snapshot.window_conversations == 0
    assert snapshot.sample.lambda0 is None and snapshot.sample.delay_s.size == 0


def test_open_conversations_are_bounded_and_shedding_is_counted() -> None:
    config = replace(CONFIG, max_open_conversations=10)
    base = {"turn": 1, "input_tokens": 16, "output_tokens": 1}
    events = [{**base, "session_id": f"s{n}", "timestamp": float(n)} for n in range(15)]
    events.append({**base, "session_id": "s3", "turn": 2, "timestamp": 20.0})
    engine = run(events, config, finish=False)
    assert engine.tracker.open_conversations == 10
    assert engine.counters.rejected == {"open_limit": 5}
    assert engine.counters.processed == 11  # the ten first sessions and s3's second turn


def turn_one(session: str, timestamp: float) -> dict:
    return {"session_id": session, "turn": 1, "timestamp": timestamp, "input_tokens": 40,
            "output_tokens": 4}  # fmt: skip


def test_an_event_beyond_the_skew_is_future_and_changes_nothing() -> None:
    config = replace(CONFIG, max_future_skew_s=600.0)
    engine = StatsEngine(config, clock_s=0.0)
    for n, ts in enumerate([10.0, 500.0]):
        assert engine.apply(parse_event(turn_one(f"s{n}", ts)), "chitchat") == "accepted"
    before = (engine.tracker.newest_event_time, engine.tracker.open_conversations)
    assert engine.tracker.future_bound == 1100.0  # newest 500 + skew 600
    assert engine.apply(parse_event(turn_one("far", 1100.5)), "chitchat") == "future"
    assert engine.apply(parse_event(turn_one("ms", 500.0 * 1000)), "chitchat") == "future"
    assert (engine.tracker.newest_event_time, engine.tracker.open_conversations) == before
    assert engine.counters.rejected == {"future": 2}
    assert engine.apply(parse_event(turn_one("edge", 1100.0)), "chitchat") == "accepted"


def test_a_quiet_spell_longer_than_the_skew_is_not_a_jump_once_the_clock_moved_on() -> None:
    """The literal rule (ahead of the partition's newest only) would reject the first event
    after a quiet hour and, the newest never moving, every event after it."""
    config = replace(CONFIG, max_future_skew_s=600.0)
    engine = StatsEngine(config, clock_s=1_000.0)
    assert engine.apply(parse_event(turn_one("before", 1_000.0)), "chitchat") == "accepted"
    assert engine.apply(parse_event(turn_one("early", 4_600.0)), "chitchat") == "future"
    engine.tracker.advance_clock(4_600.0)  # an hour of wall clock, no events
    engine.tracker.advance_clock(10.0)  # the clock never goes back
    assert engine.tracker.future_bound == 5_200.0
    assert engine.apply(parse_event(turn_one("after", 4_600.0)), "chitchat") == "accepted"
    assert engine.apply(parse_event(turn_one("later", 4_700.0)), "chitchat") == "accepted"


def test_a_restored_tracker_bounds_from_its_checkpoints_newest_time() -> None:
    config = replace(CONFIG, max_future_skew_s=600.0)
    tracker = ConversationTracker.restore(config, 5_000.0, [], {}, clock_s=100.0)
    assert tracker.future_bound == 5_600.0
    assert tracker.observe(parse_event(turn_one("x", 5_601.0)), "chitchat")[0] == "future"


def test_the_skew_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_future_skew_s must be a number > 0, got"):
        StatsConfig(max_future_skew_s=0.0)
