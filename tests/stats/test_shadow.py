"""The sampled shadow of the block-level LRU cache against the exact simulator.

At sampling rate 1 the shadow must reproduce ``kvcast simulate --granularity block --policy
lru`` (``kvcast.lab.sim.block_policies.lru_block``) request by request, at every capacity: on
generated traces with and without ``block_hashes``, on the Mooncake synthetic trace and on small
random traces (hypothesis). At the default rate its curve stays within 0.01 of the exact one.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.typing import NDArray

from kvcast.lab.sim.block_policies import lru_block
from kvcast.lab.sim.registry import simulate
from kvcast.lab.sim.trace import SimTrace
from kvcast.lab.traces.mooncake import convert_mooncake
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from kvcast.stats.events import Event, parse_event
from kvcast.stats.lru_stack import LruStack
from kvcast.stats.shadow import (
    DEFAULT_SAMPLING,
    ShadowSimulator,
    _id64,
    prefix_keys,
    scramble,
)
from kvcast.stats.shadow_counters import ShadowCounters

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT / "data" / "traces" / "mooncake_synthetic_trace.jsonl"  # as in ../shared/data


def _trace_and_events(events: list[Event], block_size: int = 16) -> tuple[SimTrace, list[Event]]:
    """The exact simulator's trace of ``events`` and the events in its processing order."""
    hashes = [e.block_hashes for e in events]
    trace = SimTrace.from_columns(
        [e.session_id for e in events],
        [e.turn for e in events],
        [e.timestamp for e in events],
        [e.input_tokens for e in events],
        block_size,
        None,
        hashes if any(h is not None for h in hashes) else None,
    )
    order = np.lexsort(
        (np.array([e.turn for e in events]), np.array([e.timestamp for e in events]))
    )
    return trace, [events[k] for k in order.tolist()]


def _shadow_hits(
    events: list[Event], capacities: list[float], **options: object
) -> tuple[list[NDArray[np.int64]], ShadowSimulator]:
    """Hit blocks per request at every capacity, as the shadow counts them."""
    shadow = ShadowSimulator(capacities, 1.0, **options)  # type: ignore[arg-type]
    outcomes = [shadow.observe(e) for e in events]
    hits = [
        np.array([sum(1 for j in out if j <= i) for out in outcomes], dtype=np.int64)
        for i in range(len(capacities))
    ]
    return hits, shadow


def _assert_exact(events: list[Event], capacities: list[int], block_size: int = 16) -> None:
    trace, ordered = _trace_and_events(events, block_size)
    hits, shadow = _shadow_hits(ordered, [float(c) for c in capacities], block_size=block_size)
    curve = shadow.counters.curve()
    assert shadow.counters.accesses() == int(trace.blocks.sum())
    for i, cap in enumerate(capacities):
        exact = lru_block(trace, cap)
        assert np.array_equal(hits[i], exact), f"capacity {cap}: requests differ"
        measured = simulate(trace, cap, "lru", "block", 0.0, 0.0)
        # to every digit; None where nothing was measured (the simulator says 0.0)
        assert curve[i].hit_ratio == (measured.hit_ratio if measured.input_blocks else None)
    assert [p.capacity_blocks for p in curve] == [float(c) for c in capacities]


def _generated_events(conversations: int, seed: int, preset_name: str = "mixed") -> list[Event]:
    trace = generate(preset(preset_name), lambda0=2.0, conversations=conversations, seed=seed)
    sids = trace.session_ids()
    return [
        Event(
            session_id=sids[k],
            turn=int(trace.turn[k]),
            timestamp=float(trace.timestamp[k]),
            input_tokens=int(trace.input_tokens[k]),
            output_tokens=1,
        )
        for k in range(len(trace))
    ]


def _shared_prefix_events(conversations: int, seed: int) -> list[Event]:
    """Conversations behind shared system prompts (integer and string ids), some forking from
    another conversation's history (agentic branching), a tenth of requests without hashes."""
    rng = np.random.default_rng(seed)
    systems = [[f"sys{s}-{p}" for p in range(s + 1)] for s in range(3)] + [[7, 8, 9, 10]]
    histories: list[list[int | str]] = []
    events: list[Event] = []
    for c in range(conversations):
        start = float(rng.uniform(0, conversations * 2.0))
        if histories and rng.random() < 0.2:  # a branch: continues another conversation's ids
            parent = histories[int(rng.integers(len(histories)))]
            ids = list(parent[: int(rng.integers(1, len(parent) + 1))])
        else:
            ids = list(systems[int(rng.integers(len(systems)))])
        turns = int(rng.geometric(0.3))
        t = start
        for turn in range(1, turns + 1):
            ids += [int(v) for v in rng.integers(-(1 << 62), 1 << 62, int(rng.integers(1, 5)))]
            own_tail = int(rng.integers(0, 1 << 62))
            if rng.random() < 0.1:
                hashes, tokens = None, int(rng.integers(0, 200))
            else:
                hashes, tokens = [*ids, own_tail], 16 * (len(ids) + 1)
            events.append(Event(f"s{c}", turn, t, tokens, 1, block_hashes=hashes))
            t += float(rng.exponential(30.0))
        histories.append(ids)
    return events


CAPACITIES = [0, 1, 3, 17, 64, 300, 1500, 100_000]


def test_rate_one_equals_the_exact_simulator_without_block_hashes() -> None:
    _assert_exact(_generated_events(1500, seed=3), CAPACITIES)


def test_rate_one_equals_the_exact_simulator_with_shared_prefixes_and_branches() -> None:
    events = _shared_prefix_events(800, seed=5)
    assert any(e.block_hashes is None for e in events)
    assert any(isinstance(h, str) for e in events for h in e.block_hashes or [])
    _assert_exact(events, CAPACITIES)


@pytest.mark.parametrize("match", ["full", "hashable"])
def test_rate_one_equals_the_exact_simulator_on_the_mooncake_trace(match: str) -> None:
    with MOONCAKE.open("rb") as fh:
        records = [(n, orjson.loads(line)) for n, line in enumerate(fh, 1) if line.strip()]
    converted, _summary = convert_mooncake(records, match=match)
    events = [parse_event(e) for e in converted]
    _assert_exact(events, [0, 250, 1000, 4000, 16000, 64000], block_size=512)


_ids = st.one_of(st.integers(0, 3), st.sampled_from(["a", "b"]))
_request = st.tuples(
    st.integers(0, 4),  # session
    st.one_of(st.none(), st.lists(_ids, max_size=6)),  # block hashes (None: synthesized)
    st.integers(0, 100),  # input tokens (used when there are no hashes)
)


@settings(max_examples=300, deadline=None)
@given(
    requests=st.lists(_request, min_size=1, max_size=40),
    capacities=st.lists(st.integers(0, 14), min_size=1, max_size=4),
)
def test_rate_one_equals_the_exact_simulator_on_random_small_traces(
    requests: list[tuple[int, list[int | str] | None, int]], capacities: list[int]
) -> None:
    turns: dict[int, int] = {}
    events = []
    for k, (session, hashes, tokens) in enumerate(requests):
        turns[session] = turns.get(session, 0) + 1
        events.append(
            Event(f"s{session}", turns[session], float(k), tokens, 0, block_hashes=hashes)
        )
    _assert_exact(events, sorted(capacities), block_size=16)


def test_the_default_rate_stays_within_001_of_the_exact_curve() -> None:
    events = _generated_events(40_000, seed=11, preset_name="single")  # 1.8 * 10^5 requests
    trace, ordered = _trace_and_events(events)
    n = 2275
    capacities = [float(round(c)) for c in (n / 16, n / 4, n, 4 * n, 16 * n)]
    shadow = ShadowSimulator(capacities, DEFAULT_SAMPLING)
    for e in ordered:
        shadow.observe(e)
    assert len(shadow.stack) <= math.floor(16 * n * DEFAULT_SAMPLING) + 1  # bounded memory
    total = int(trace.blocks.sum())
    kept = shadow.counters.accesses()
    assert 0.5 * DEFAULT_SAMPLING * total < kept < 2 * DEFAULT_SAMPLING * total
    for point in shadow.counters.curve():
        exact = simulate(trace, int(point.capacity_blocks), "lru", "block", 0.0, 0.0)
        assert point.hit_ratio is not None
        assert abs(point.hit_ratio - exact.hit_ratio) < 0.01, point


def test_one_of_several_instances_is_the_exact_simulation_of_its_sessions() -> None:
    events = _shared_prefix_events(600, seed=9)
    shadow = ShadowSimulator([0.0], 1.0, instances=4)
    kept = [e for e in events if shadow.keeps_session(e.session_id)]
    sessions = {e.session_id for e in events}
    share = len({e.session_id for e in kept}) / len(sessions)
    assert 0.17 < share < 0.33  # a quarter of the sessions, drawn by hash
    _trace, ordered = _trace_and_events(events)
    sub_trace, _sub_ordered = _trace_and_events(kept)
    for cap in (0, 40, 400):
        sim = ShadowSimulator([float(cap)], 1.0, instances=4)
        outcomes = [sim.observe(e) for e in ordered]
        mine = [sum(1 for j in out if j == 0) for out in outcomes if out]
        exact = lru_block(sub_trace, cap)
        assert mine == [int(h) for h, b in zip(exact, sub_trace.blocks, strict=True) if b]


def test_a_feed_of_part_of_the_stream_shrinks_the_cache_instead() -> None:
    # 2 instances, the feed sees a quarter of the sessions: keep them all, half the capacity.
    sim = ShadowSimulator([100.0, 1000.0], 0.5, instances=2, stream_share=0.25)
    assert sim.session_rate == 1.0
    assert sim.thresholds == [100 * 0.5 * 0.5, 1000 * 0.5 * 0.5]
    assert sim.stack.limit == 251  # distances 0 .. floor(250) count


def test_sampled_memory_is_bounded_by_the_largest_capacity() -> None:
    events = _generated_events(3000, seed=2)
    sim = ShadowSimulator([50.0, 800.0], 0.05)
    for e in events:
        sim.observe(e)
    assert len(sim.stack) == math.floor(800 * 0.05) + 1
    assert sim.memory_entries() < 6 * 41 + 10


def test_sampled_chains_keep_each_block_at_the_rate() -> None:
    sim = ShadowSimulator([10.0], 0.2)
    kept = sum(len(sim.keys(Event(f"s{k}", 1, 0.0, 16 * 50, 0)) or []) for k in range(4000))
    assert abs(kept / (4000 * 50) - 0.2) < 0.01
    hashed = ShadowSimulator([10.0], 0.2)
    ids = list(range(20_000))
    kept = hashed.keys(Event("s", 1, 0.0, 1, 0, block_hashes=ids)) or []
    assert abs(len(kept) / 20_000 - 0.2) < 0.01


def test_every_event_of_a_session_keeps_the_same_chain_positions() -> None:
    sim = ShadowSimulator([10.0], 0.1, seed=4)
    short = sim.keys(Event("conv", 1, 0.0, 16 * 30, 0)) or []
    long = sim.keys(Event("conv", 2, 1.0, 16 * 300, 0)) or []
    assert long[: len(short) - 1] == short[:-1]  # the chain's kept blocks, then a tail
    assert len(long) > len(short)


def test_prefix_keys_follow_the_rolling_hash() -> None:
    def reference(ids: list[int | str]) -> list[int]:
        h, out = 0, []
        base = 0x100000001B3 | 1
        for v in ids:
            h = (h * base + scramble(_id64(v))) % (1 << 64)
            out.append(h)
        return out

    for ids in ([1, 2, 3], [-5, 1 << 40, 7], [(1 << 64) - 1, 3], ["x", 2, "y"], list(range(300))):
        assert prefix_keys(ids).tolist() == reference(ids)  # type: ignore[arg-type]
    assert prefix_keys([]).size == 0
    # Equal ids under different prefixes are different blocks; equal prefixes are equal.
    assert prefix_keys([1, 2])[1] != prefix_keys([3, 2])[1]
    assert prefix_keys([1, 2, 9])[1] == prefix_keys([1, 2, 5])[1]
    assert prefix_keys([1])[0] != prefix_keys(["1"])[0]
    assert len(set(prefix_keys([0] * 50).tolist())) == 50


@settings(max_examples=200, deadline=None)
@given(
    touches=st.lists(st.integers(0, 12), max_size=200),
    limit=st.integers(0, 6),
)
def test_the_stack_gives_lru_distances(touches: list[int], limit: int) -> None:
    stack, naive = LruStack(limit), []  # naive: most recent first, at most `limit` keys
    for key in touches:
        for probe in range(13):
            want = naive.index(probe) if probe in naive else None
            assert stack.distance(probe) == want
        stack.touch(key)
        if limit:
            naive = [key, *(k for k in naive if k != key)][:limit]
        assert len(stack) == len(naive)


def test_counters_of_partitions_add_up_to_those_of_one_feed() -> None:
    events = _generated_events(500, seed=6)
    capacities = [10.0, 100.0, 1000.0]
    whole = ShadowSimulator(capacities, 0.3, slot_s=30.0)
    split = ShadowSimulator(capacities, 0.3, slot_s=30.0)
    parts = [split.counters.empty_like(), split.counters.empty_like()]
    for e in events:
        whole.observe(e)
        split.observe(e, parts[hash(e.session_id) % 2])  # the event's partition's delta
    assert split.counters.accesses() == 0
    merged = parts[0].empty_like()
    for part in parts:
        merged.merge(ShadowCounters.from_dict(orjson.loads(orjson.dumps(part.to_dict()))))
    assert merged.slots == whole.counters.slots
    assert merged.curve() == whole.counters.curve()
    newest = max(e.timestamp for e in events)
    recent = merged.curve(since_s=newest - 600)
    assert merged.accesses(newest - 600) < merged.accesses()
    assert recent != merged.curve()
    dropped = merged.expire(newest - 600)
    assert dropped > 0 and merged.curve() == recent


def test_the_published_window_spans_enough_kept_accesses() -> None:
    counters = ShadowCounters([10.0], slot_s=60.0)
    assert counters.window_start() is None
    for slot, accesses in ((0, 50), (1, 30), (5, 20), (9, 40)):  # slots 2-4, 6-8 empty
        counters.record(slot * 60.0 + 1.0, [0] * accesses, [0] * accesses)
    assert counters.window_start(40) == 9 * 60.0  # the newest slot holds enough
    assert counters.window_start(60) == 5 * 60.0
    assert counters.accesses(counters.window_start(61)) == 40 + 20 + 30
    assert counters.window_start(10_000) == 0.0  # everything there is
    assert counters.window_start(10_000, max_age_s=300.0) == 600.0 - 300.0
    assert counters.window_start(60, max_age_s=300.0, now_s=2000.0) == 1700.0


def test_counters_refuse_a_merge_of_another_shape_and_malformed_documents() -> None:
    a, b = ShadowCounters([1.0, 2.0]), ShadowCounters([1.0, 3.0])
    with pytest.raises(ValueError):
        a.merge(b)
    doc = a.to_dict()
    doc["slots"] = {"3": [1, 2]}  # three counts expected
    with pytest.raises(ValueError):
        ShadowCounters.from_dict(doc)
    assert ShadowCounters([1.0]).curve()[0].hit_ratio is None


def test_warmup_simulates_without_counting() -> None:
    events = _generated_events(300, seed=8)
    start = min(e.timestamp for e in events)
    sim = ShadowSimulator([200.0], 1.0, warmup_s=100.0)
    cold = ShadowSimulator([200.0], 1.0)
    for e in events:
        assert sim.observe(e) == cold.observe(e)  # the same simulation
    assert 0 < sim.counters.accesses() < cold.counters.accesses()
    assert min(sim.counters.slots) * sim.counters.slot_s >= start + 100.0 - sim.counters.slot_s


@pytest.mark.parametrize(
    "kwargs",
    [
        {"capacities": []},
        {"capacities": [2.0, 1.0]},
        {"capacities": [-1.0]},
        {"capacities": [math.inf]},
        {"capacities": [1.0], "sampling": 0.0},
        {"capacities": [1.0], "sampling": 1.5},
        {"capacities": [1.0], "instances": 0},
        {"capacities": [1.0], "stream_share": 0.0},
    ],
)
def test_settings_are_validated(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ShadowSimulator(**kwargs)  # type: ignore[arg-type]
