"""Shared-prefix statistics: the index's runs, the window's sums, checkpoints and the forecast.

The reference for the index is a brute force over the whole history (no capacity, no
shortcuts): a block is in a request's shared run when every block before it is, and it was
referenced before by another conversation or was already found shared; its gap is the time
since the latest earlier request that contained it.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcast.lab.sim.registry import simulate
from kvcast.lab.sim.trace import SimTrace
from kvcast.stats.config import StatsConfig
from kvcast.stats.engine import StatsEngine
from kvcast.stats.events import parse_event
from kvcast.stats.forecast import forecast_from_sample
from kvcast.stats.partition import decode_conversation, encode_conversation
from kvcast.stats.shared_prefix import NO_SHARING, SharedPrefixIndex, SharedRun
from tests.support import shared_prefix_events

WHOLE_INPUT = StatsConfig(
    shared_index_dense_tokens=10**6,  # every block indexed: runs are exact
    completion_timeout_s=1e6,
    rate_window_s=10**9,
    window_conversations=10**9,
    window_max_age_s=1e12,
)


def brute_force_runs(events: list[dict]) -> list[SharedRun]:
    first_session: dict[object, str] = {}
    last_seen: dict[object, float] = {}
    found_shared: set[object] = set()
    runs = []
    for e in events:
        session, t, ids = e["session_id"], e["timestamp"], e["block_hashes"]
        gaps: dict[float, int] = defaultdict(int)
        count = born = 0
        for block in ids:
            seen = block in first_session
            if not seen or (first_session[block] == session and block not in found_shared):
                break
            if block not in found_shared:
                born += 1
            gaps[max(t - last_seen[block], 0.0)] += 1
            count += 1
        found_shared.update(ids[:count])
        for block in ids:
            first_session.setdefault(block, session)
            last_seen[block] = max(last_seen.get(block, t), t)
        runs.append(
            SharedRun(count, tuple(itertools.chain.from_iterable(sorted(gaps.items()))), born)
        )
    return runs


def index_runs(events: list[dict], capacity: int = 10**9) -> list[SharedRun]:
    """The index driven as the tracker drives it, with nothing completing or expiring."""
    index = SharedPrefixIndex(capacity, timeout_s=1e12)
    held: dict[str, tuple] = {}
    newest: dict[str, float] = {}
    runs = []
    for e in events:
        session = e["session_id"]
        run, held[session] = index.observe(
            session, e["timestamp"], e["block_hashes"], held.get(session, ()), newest.__getitem__
        )
        newest[session] = max(newest.get(session, e["timestamp"]), e["timestamp"])
        runs.append(run)
    return runs


@st.composite
def shared_streams(draw: st.DrawFn) -> list[dict]:
    return shared_prefix_events(
        draw(st.integers(1, 40)),
        seed=draw(st.integers(0, 10**6)),
        rate_per_s=draw(st.sampled_from((0.05, 0.5, 5.0))),
        prompts=draw(st.integers(1, 4)),
        prompt_blocks=draw(st.integers(1, 5)),
        fork_share=draw(st.sampled_from((0.0, 0.3, 0.9))),
    )


@settings(max_examples=150, deadline=None)
@given(shared_streams())
def test_the_index_finds_the_brute_force_shared_runs(events: list[dict]) -> None:
    assert index_runs(events) == brute_force_runs(events)


def test_a_prompt_used_by_two_conversations_is_shared_from_the_second_on() -> None:
    index = SharedPrefixIndex(100, timeout_s=1e9)
    seen = {"a": 0.0}
    run, held_a = index.observe("a", 0.0, [1, 2, 3], (), seen.__getitem__)
    assert run == NO_SHARING and held_a == (1, 2, 3)
    # b repeats a's first two blocks: shared, 5 s after a's request, born now.
    run, held_b = index.observe("b", 5.0, [1, 2, 9], (), seen.__getitem__)
    assert run == SharedRun(2, (5.0, 2), 2) and held_b == (9,)
    # a's next turn: its first two blocks are shared now (last referenced by b, 2 s ago).
    run, held_a = index.observe("a", 7.0, [1, 2, 3, 4], held_a, seen.__getitem__)
    assert run == SharedRun(2, (2.0, 2), 0) and held_a == (3, 4)
    # A shared block after a private one does not count: the prefix stops at the first miss.
    run, _ = index.observe("c", 8.0, [5, 1, 2], (), seen.__getitem__)
    assert run == NO_SHARING


def test_a_completed_conversations_blocks_leave_and_shared_blocks_expire() -> None:
    index = SharedPrefixIndex(100, timeout_s=60.0)
    seen = {"a": 0.0, "b": 10.0}
    _, held_a = index.observe("a", 0.0, [1, 2, 3], (), seen.__getitem__)
    index.observe("b", 10.0, [1, 7], (), seen.__getitem__)
    index.release("a", held_a)  # a completed: its private blocks 2, 3 leave
    run, _ = index.observe("c", 20.0, [1, 2, 3], (), seen.__getitem__)
    assert run.blocks == 1  # block 1 is shared (last used at 10 s); 2 is gone with a
    assert index.shared_table == {1: 20.0}
    index.expire(80.0)  # 20 + 60 s has not passed in whole seconds
    assert index.shared_table == {1: 20.0}
    index.expire(81.0)
    assert index.shared_table == {} and index.changes.removals == {1}


def test_beyond_the_dense_part_ids_thin_out_and_a_run_counts_to_the_middle() -> None:
    index = SharedPrefixIndex(100, timeout_s=1e9, dense_blocks=2)
    # Dense below 4 blocks, then every 2nd block up to 8, every 4th up to 16...
    assert index.positions(20) == [0, 1, 2, 3, 4, 6, 8, 12, 16]
    assert index.positions(3) == [0, 1, 2]
    seen = {"a": 0.0}
    _, held = index.observe("a", 0.0, list(range(10)), (), seen.__getitem__)
    assert held == (0, 1, 2, 3, 4, 6, 8)
    # Ids 0..4 and 6 are shared, 97 (at 8) is not: the run ends after block 6 and at or before
    # block 8, and counts to the middle, 6 + ceil(2 / 2) = 7 blocks (here exactly the truth).
    run, _ = index.observe("b", 1.0, [*range(7), 99, 97, 98], (), seen.__getitem__)
    assert run == SharedRun(7, (1.0, 7), 6)
    # A run that reaches the last id counts to the middle of what is left of the request.
    run, _ = index.observe("c", 2.0, list(range(10)), (), seen.__getitem__)
    assert run == SharedRun(9, (1.0, 8, 2.0, 1), 1)  # 8 + ceil(2 / 2)
    with pytest.raises(ValueError, match="dense_blocks must be >= 1"):
        SharedPrefixIndex(1, 1.0, dense_blocks=0)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 64), st.integers(1, 5000))
def test_indexed_positions_are_dense_then_logarithmic(dense: int, blocks: int) -> None:
    positions = SharedPrefixIndex(1, 1.0, dense_blocks=dense).positions(blocks)
    assert positions[: 2 * dense] == list(range(min(blocks, 2 * dense)))
    assert positions == sorted(set(positions)) and positions[-1] < blocks
    # A span between two ids is at most 1 / dense of the position it starts at.
    for p, q in itertools.pairwise(positions):
        assert q - p <= max(1, p // dense)
    assert len(positions) <= 2 * dense + dense * max(0, blocks // dense).bit_length()


def test_capacity_bounds_the_index_and_zero_turns_it_off() -> None:
    events = shared_prefix_events(200, seed=3)
    index = SharedPrefixIndex(50, timeout_s=1e12)
    held: dict[str, tuple] = {}
    for e in events:
        session = e["session_id"]
        _, held[session] = index.observe(
            session, e["timestamp"], e["block_hashes"], held.get(session, ()), lambda s: 0.0
        )
        assert len(index) <= 50
    assert all(run == NO_SHARING for run in index_runs(events, capacity=0))
    with pytest.raises(ValueError, match="capacity must be >= 0"):
        SharedPrefixIndex(-1, 1.0)


def engine_of(events: list[dict], config: StatsConfig = WHOLE_INPUT) -> StatsEngine:
    engine = StatsEngine(config)
    for raw in events:
        event = parse_event(raw)
        engine.apply(event, "unknown")
    engine.finish()
    return engine


def test_the_window_sums_are_the_runs_sums() -> None:
    events = shared_prefix_events(400, seed=5)
    runs = brute_force_runs(events)
    sample = engine_of(events).snapshot().sample
    total = sample.total()
    assert total.sum_S == sum(r.blocks for r in runs) > 0
    assert total.shared_born == sum(r.born for r in runs) > 0
    gap_blocks: dict[float, int] = defaultdict(int)
    for run in runs:
        for gap, blocks in zip(run.gaps[0::2], run.gaps[1::2], strict=True):
            gap_blocks[gap] += blocks
    assert sample.shared_gap_s.tolist() == sorted(gap_blocks)
    assert sample.shared_gap_blocks.tolist() == [gap_blocks[g] for g in sorted(gap_blocks)]
    # Every conversation's size stays gross; the shared part is counted beside it.
    assert total.sum_R == sum(len(e["block_hashes"]) for e in events)
    last_turn = {}
    for e, run in zip(events, runs, strict=True):
        last_turn[e["session_id"]] = run.blocks
    assert total.sum_S_B == sum(last_turn.values())
    assert np.all(sample.prev_shared <= sample.prev_blocks)


def test_events_without_block_hashes_have_no_shared_statistics() -> None:
    events = shared_prefix_events(100, seed=1)
    for e in events:
        del e["block_hashes"]
    sample = engine_of(events).snapshot().sample
    assert not sample.has_shared
    assert sample.shared_gap_s.size == 0 and not sample.prev_shared.any()


def test_an_open_conversation_keeps_its_shared_prefix_through_a_checkpoint() -> None:
    events = shared_prefix_events(50, seed=2)
    engine = StatsEngine(WHOLE_INPUT)
    for raw in events:
        event = parse_event(raw)
        engine.apply(event, "unknown")
    open_ = list(engine.tracker.open_items().values())
    assert any(r.shared_blocks for c in open_ for r in c.turns.values())
    for conversation in open_:
        restored = decode_conversation(conversation.session_id, encode_conversation(conversation))
        assert restored == conversation


def test_a_checkpoint_with_gaps_as_pairs_still_reads_as_flat_gaps() -> None:
    """Before flat gaps, a turn's were stored as ``[[gap_s, blocks], ...]``."""
    restored = decode_conversation(
        "s", b'[9.0,[[1,5.0,3,40,"unknown"],[2,9.0,6,90,"unknown",4,[[2,3],[4.5,1]],1]]]'
    )
    record = restored.turns[2]
    assert record.shared_gaps == (2.0, 3, 4.5, 1)
    assert [type(v) for v in record.shared_gaps] == [float, int, float, int]
    assert decode_conversation("s", encode_conversation(restored)) == restored


def test_a_checkpoint_from_before_shared_prefixes_still_reads() -> None:
    restored = decode_conversation("s", b'[5.0,[[1,5.0,3,40,"unknown"]]]')
    record = restored.turns[1]
    assert (record.blocks, record.shared_blocks, record.shared_gaps, record.shared_born) == (
        3,
        0,
        (),
        0,
    )


def block_lru(events: list[dict], capacity: int, block_size: int = 16) -> float:
    trace = SimTrace.from_event_dicts(events, block_size)
    return simulate(trace, capacity, "lru", "block", 0.0, 0.0).hit_ratio


def test_the_shared_forecast_tracks_block_level_lru_where_the_conversations_alone_do_not() -> None:
    events = shared_prefix_events(3000, seed=7, rate_per_s=0.5, prompts=3, prompt_blocks=12)
    sample = engine_of(events).snapshot().sample
    for capacity in (200, 800, 3200):
        measured = block_lru(events, capacity)
        shared = forecast_from_sample(sample, capacity)
        alone = forecast_from_sample(sample, capacity, sharing="none")
        assert shared.shared is not None and alone.shared is None
        assert shared.estimators is not None
        assert shared.estimators["state/whole/partial"] == alone.hit_ratio
        assert abs(shared.hit_ratio - measured) < abs(alone.hit_ratio - measured)
        assert abs(shared.hit_ratio - measured) < 0.03, (capacity, shared.hit_ratio, measured)


def test_the_shared_part_reports_its_blocks_hits_and_rate() -> None:
    events = shared_prefix_events(1000, seed=4, rate_per_s=0.5)
    sample = engine_of(events).snapshot().sample
    forecast = forecast_from_sample(sample, 400, instances=1).to_dict()
    shared = forecast["shared"]
    assert shared["estimator"] == "shared/state/whole/partial"
    assert 0 < shared["hit_ratio"] < forecast["hit_ratio"] <= forecast["upper_bound"]
    assert 0 < shared["blocks"] < 400
    total = sample.total()
    expected_rate = sample.lambda0 * total.sum_S / total.conversations
    assert shared["rate_per_s"] == pytest.approx(expected_rate)
    assert set(forecast["estimators"]) == {
        "shared/state/whole/partial",
        "state/whole/partial",
        "paper/hashable/none",
    }
    with pytest.raises(ValueError, match="sharing must be one of"):
        forecast_from_sample(sample, 400, sharing="sometimes")


def test_the_table_carries_the_shared_blocks_reuse_law() -> None:
    """``shared`` in the table: p = references / (references + lives), the block-weighted
    log-normal fit of the gaps, stretched by the instances; the index's shared curve uses it."""
    from kvcast.exporters.kit.density import DensityCurve
    from kvcast.exporters.kit.index import SHARED_INTENT, PriorityIndex
    from kvcast.exporters.kit.laws import smoothed_p
    from kvcast.stats.table import table_document

    events = shared_prefix_events(400, seed=5)
    runs = brute_force_runs(events)
    gaps = [pair for run in runs for pair in zip(run.gaps[0::2], run.gaps[1::2], strict=True)]
    references, lives = sum(b for _, b in gaps), sum(r.born for r in runs)
    logs = np.repeat(np.log(np.maximum([g for g, _ in gaps], 1e-3)), [b for _, b in gaps])
    snapshot = engine_of(events).snapshot()
    one, three = (table_document(snapshot, WHOLE_INPUT, 1, 60.0, n)["shared"] for n in (1, 3))
    assert (one["references"], one["lives"]) == (references, lives) and lives > 0
    assert one["p_continue"] == pytest.approx(references / (references + lives), rel=1e-12)
    assert one["mu"] == pytest.approx(logs.mean(), rel=1e-9)
    assert one["sigma"] == pytest.approx(logs.std(), rel=1e-9)
    assert one["median_reuse_s"] == pytest.approx(np.exp(logs.mean()), rel=1e-9)
    assert three["mu"] == pytest.approx(one["mu"] + np.log(3.0), rel=1e-12)
    assert three["sigma"] == one["sigma"] and three["p_continue"] == one["p_continue"]

    index = PriorityIndex(table_document(snapshot, WHOLE_INPUT, 1, 600.0))
    assert index.has_shared
    p = smoothed_p(one["p_continue"], references + lives)
    expected = DensityCurve(p, one["mu"], one["sigma"], 600.0).values
    assert index.curve(SHARED_INTENT, 1).values == expected
    assert index.curve(SHARED_INTENT, 9).values == expected  # any turn: one law
    assert index.law(SHARED_INTENT, 1) == pytest.approx((p, one["mu"], one["sigma"]))


def test_without_block_hashes_the_table_has_no_shared_law() -> None:
    from kvcast.exporters.kit.index import SHARED_INTENT, PriorityIndex
    from kvcast.stats.table import table_document

    events = shared_prefix_events(100, seed=1)
    for e in events:
        del e["block_hashes"]
    doc = table_document(engine_of(events).snapshot(), WHOLE_INPUT, 1, 60.0)
    assert doc["shared"] is None
    index = PriorityIndex(doc)
    assert not index.has_shared
    assert index.curve(SHARED_INTENT, 1) is index.default_curve()


def _turn(session: str, turn: int, ts: float, ids: list[int]) -> dict:
    return {"session_id": session, "turn": turn, "timestamp": ts,
            "input_tokens": 16 * len(ids) - 8, "output_tokens": 5, "block_hashes": ids}  # fmt: skip


def test_a_request_that_repeats_none_of_its_conversations_blocks_starts_another() -> None:
    # An agent compacting its context: the system prompt (1-4, shared) and a summary (50-53)
    # start a new chain; the cache can reuse nothing of blocks 10-16, so the statistics must
    # not count turn 3 as revisiting them (it did: a ceiling 0.05 over block-level LRU).
    prompt = [1, 2, 3, 4]
    events = [
        _turn("other", 1, 0.0, [*prompt, 90, 91]),
        _turn("a", 1, 1.0, [*prompt, 10, 11, 12]),
        _turn("a", 2, 2.0, [*prompt, 10, 11, 12, 13, 14]),
        _turn("a", 3, 3.0, [*prompt, 50, 51, 52, 53]),
        _turn("a", 4, 4.0, [*prompt, 50, 51, 52, 53, 54, 55]),
    ]
    sample = engine_of(events).snapshot().sample
    total = sample.total()
    assert total.conversations == 3  # "other", "a" up to turn 2, "a" from turn 3
    # Revisits: turn 2 (of turn 1's 7 blocks) and turn 4 (of turn 3's 8); none into turn 3.
    assert sorted(sample.prev_blocks.tolist()) == [7, 8]
    assert total.sum_R == sum(len(e["block_hashes"]) for e in events)


def test_a_request_that_repeats_part_of_its_context_continues_it() -> None:
    prompt = [1, 2, 3, 4]
    events = [
        _turn("other", 1, 0.0, [*prompt, 90]),
        _turn("a", 1, 1.0, [*prompt, 10, 11, 12]),
        _turn("a", 2, 2.0, [*prompt, 10, 11, 12, 13, 14]),
        _turn("a", 3, 3.0, [*prompt, 10, 60, 61]),  # an edit after block 10: a partial reuse
    ]
    sample = engine_of(events).snapshot().sample
    assert sample.total().conversations == 2
    assert sorted(sample.prev_blocks.tolist()) == [7, 9]


def test_with_the_index_off_a_new_context_stays_in_its_conversation() -> None:
    prompt = [1, 2, 3, 4]
    events = [
        _turn("a", 1, 1.0, [*prompt, 10, 11, 12]),
        _turn("a", 2, 2.0, [*prompt, 50, 51, 52]),
    ]
    off = engine_of(events, replace(WHOLE_INPUT, shared_index_blocks=0))
    assert off.snapshot().sample.total().conversations == 1
