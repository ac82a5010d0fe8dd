"""The block-level prefix cache and its policies on tiny traces worked out by hand."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcast.lab.sim.block_cache import block_layout
from kvcast.lab.sim.lru import lru_conversation_hits
from kvcast.lab.sim.policy_tables import equal_table, learn_table
from kvcast.lab.sim.registry import POLICIES, PolicyUnavailable, get_policy, simulate
from kvcast.lab.sim.trace import SimTrace
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset

BLOCK_POLICIES = ("lru", "lfu", "gdsf", "iac", "iac-rolling", "density", "tbs")


def _synth(convs: list[int], blocks: list[int], times: list[float]) -> SimTrace:
    turns: dict[int, int] = {}
    turn = [turns.__setitem__(c, turns.get(c, 0) + 1) or turns[c] for c in convs]
    return SimTrace.from_columns(convs, turn, times, [b * 16 for b in blocks], 16)


def _hashed(hashes: list[list[int]], times: list[float] | None = None) -> SimTrace:
    n = len(hashes)
    return SimTrace.from_columns(
        list(range(n)),
        [1] * n,
        times or list(range(n)),
        [16 * len(h) for h in hashes],
        16,
        block_hashes=hashes,
    )


def _hits(trace: SimTrace, cap: int, policy: str, **options: object) -> list[int]:
    return get_policy(policy, "block")(trace, cap, **options).tolist()


def test_hand_worked_lru_with_synthesized_chains() -> None:
    # A: R=3 at 0, R=5 at 10; B: R=2 at 5, R=3 at 20; capacity 6 blocks.
    # req2 reuses A's 2 hashable blocks, evicting A's old tail then B's tail; req3 reuses B0.
    trace = _synth([0, 1, 0, 1], [3, 2, 5, 3], [0.0, 5.0, 10.0, 20.0])
    assert _hits(trace, 6, "lru") == [0, 0, 2, 1]
    assert _hits(trace, 100, "lru") == [0, 0, 2, 1]
    assert _hits(trace, 4, "lru") == [0, 0, 2, 0]  # A's turn 2 leaves no room for B0
    res = simulate(trace, 6, "lru", "block", 0.0, 0.0)
    assert (res.hit_blocks, res.input_blocks) == (3, 13)


def test_shared_prefixes_across_conversations_and_tail_first() -> None:
    # Two conversations share a 2-block system prompt [9, 8]; capacity 4.
    trace = _hashed([[9, 8, 1], [9, 8, 2], [9, 8, 1, 3], [9, 8, 2]])
    # req1: hits 2 shared, inserts 2 (4 used). req2: hits [9, 8, 1] (3); inserting 3 evicts the
    # leaf 2 (tail before head; the shared head stays). req3: hits only the shared 2.
    assert _hits(trace, 4, "lru") == [0, 2, 3, 2]
    # Equal ids under different prefixes are different blocks.
    assert _hits(_hashed([[1, 2], [3, 2]]), 10, "lru") == [0, 0]


def test_tbs_keeps_what_comes_back() -> None:
    trace = _hashed([[1], [2], [3], [1]])
    assert _hits(trace, 2, "lru") == [0, 0, 0, 0]
    assert _hits(trace, 2, "tbs") == [0, 0, 0, 1]
    assert _hits(trace, 2, "tbs", size="request", threshold_s=0.5) == [0, 0, 0, 1]


def test_lfu_and_gdsf_keep_the_frequent_block() -> None:
    trace = _hashed([[1], [1], [1], [2], [3], [1]])
    assert _hits(trace, 2, "lru") == [0, 1, 1, 0, 0, 0]
    assert _hits(trace, 2, "lfu") == [0, 1, 1, 0, 0, 1]
    assert _hits(trace, 2, "gdsf") == [0, 1, 1, 0, 0, 1]


def test_request_longer_than_the_cache_keeps_its_head() -> None:
    trace = _hashed([[1, 2, 3, 4], [1, 2, 3, 4]])
    assert _hits(trace, 2, "lru") == [0, 2]
    assert _hits(trace, 0, "lru") == [0, 0]


def test_unbounded_block_lru_matches_algorithm_1_on_growing_conversations() -> None:
    trace = generate(preset("mixed"), lambda0=1.0, conversations=300, seed=5).sim_trace()
    block = _hits(trace, 10**9, "lru")
    conv = lru_conversation_hits(trace.conversation, trace.blocks, 10**9).tolist()
    grows = np.diff(trace.blocks).min() if len(trace) > 1 else 0
    assert block == conv or grows < 0


@pytest.mark.parametrize("cap", [20, 60, 200])
def test_iac_with_equal_priorities_is_lru_exactly(cap: int) -> None:
    trace = generate(preset("mixed"), lambda0=1.0, conversations=300, seed=2).sim_trace()
    lru = _hits(trace, cap, "lru")
    for median in (5.0, 1e9):
        assert _hits(trace, cap, "iac", table=equal_table(0.3, median)) == lru


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 5), st.floats(0.001, 50.0)),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 12),
)
def test_tbs_never_below_lru(reqs: list[tuple[int, int, float]], cap: int) -> None:
    """Random prefix trees: request k's ids are a root chain plus its own suffix, the requests
    at distinct times (gaps of 1 ms to 50 s). The oracle knows a block's next use by its time,
    so requests at the same second are all "now" to it and it is no oracle among them: with
    every request at time 0, hypothesis found a 15-request trace where it lost to LRU."""
    hashes = [
        [root * 100 + j for j in range(length)] + [1000 + k * 10]
        for k, (root, length, _) in enumerate(reqs)
        if k % 2 == 0
    ] + [
        [root * 100 + j for j in range(length)]
        for k, (root, length, _) in enumerate(reqs)
        if k % 2 == 1
    ]
    times = list(itertools.accumulate(gap for _, _, gap in reqs))
    trace = _hashed(hashes, times)
    assert sum(_hits(trace, cap, "tbs")) >= sum(_hits(trace, cap, "lru"))


def test_every_block_policy_runs_and_stays_within_bounds() -> None:
    trace = generate(preset("mixed"), lambda0=1.0, conversations=400, seed=3).sim_trace()
    layout = block_layout(trace)
    ratios = {p: simulate(trace, 300, p, "block", layout=layout).hit_ratio for p in BLOCK_POLICIES}
    assert all(0.0 <= r <= 1.0 for r in ratios.values())
    assert ratios["tbs"] >= ratios["lru"]


def test_learned_table_comes_from_the_history_only() -> None:
    trace = generate(preset("mixed"), lambda0=1.0, conversations=400, seed=3).sim_trace()
    doc = learn_table(trace, 0.25)
    assert doc["window_conversations"] < trace.conversations * 0.35
    assert {s["intent"] for s in doc["states"]} <= set(trace.intent_names)


def test_registry_errors() -> None:
    assert {(p, "block") for p in BLOCK_POLICIES} <= set(POLICIES)
    with pytest.raises(PolicyUnavailable, match="unknown policy 'lfu' with granularity"):
        get_policy("lfu", "conversation")
    with pytest.raises(PolicyUnavailable, match=r"available: .*tbs/block"):
        get_policy("belady", "block")
    trace = _hashed([[1]])
    with pytest.raises(ValueError, match="size must be one of"):
        _hits(trace, 2, "iac", size="huge", table=equal_table())
    with pytest.raises(TypeError):
        _hits(trace, 2, "lru", bogus=1)
