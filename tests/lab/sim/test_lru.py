"""Whole-content LRU (Algorithm 1) and the warm-up/cool-down measurement."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq

from kvcast.lab.sim.lru import lru_conversation_hits
from kvcast.lab.sim.measurement import measured_conversations, measured_requests
from kvcast.lab.sim.registry import POLICIES, PolicyUnavailable, get_policy, simulate
from kvcast.lab.sim.trace import SimTrace
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.model import ground_truth
from kvcast.lab.workload.presets import preset


def brute_force_hits(convs: list[int], blocks: list[int], capacity: int) -> list[int]:
    """Algorithm 1 written plainly: a list of [conv, size, last_use], re-sorted every step."""
    resident: list[list[int]] = []
    hits = []
    for step, (c, r) in enumerate(zip(convs, blocks, strict=True)):
        mine = [e for e in resident if e[0] == c]
        if mine:
            hits.append(min(max(mine[0][1] - 1, 0), r))
            resident.remove(mine[0])
        else:
            hits.append(0)
        resident.append([c, r, step])
        resident.sort(key=lambda e: e[2], reverse=True)  # MRU first, LRU last
        while sum(e[1] for e in resident) > capacity:
            resident.pop()
    return hits


def _trace(convs: list[int], blocks: list[int], times: list[float] | None = None) -> SimTrace:
    n = len(convs)
    ts = np.arange(n, dtype=float) if times is None else np.asarray(times, dtype=float)
    turns = np.ones(n, np.int64)
    return SimTrace(
        conversation=np.asarray(convs, np.int64),
        turn=turns,
        timestamp=ts,
        blocks=np.asarray(blocks, np.int64),
        conversations=max(convs) + 1 if convs else 0,
    )


@settings(max_examples=300, deadline=None)
@given(
    requests=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 12)), max_size=60),
    capacity=st.integers(0, 40),
)
def test_matches_brute_force_arbitrary_sizes(
    requests: list[tuple[int, int]], capacity: int
) -> None:
    convs = [c for c, _ in requests]
    blocks = [r for _, r in requests]
    got = lru_conversation_hits(convs, blocks, capacity).tolist()
    assert got == brute_force_hits(convs, blocks, capacity)


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(0, 8), st.integers(1, 6)), max_size=80),
    capacity=st.integers(0, 60),
)
def test_matches_brute_force_growing_conversations(
    steps: list[tuple[int, int]], capacity: int
) -> None:
    """Model-like traces: each conversation's content grows by Z >= 1 per turn."""
    size: dict[int, int] = {}
    convs, blocks = [], []
    for c, z in steps:
        size[c] = size.get(c, 0) + z
        convs.append(c)
        blocks.append(size[c])
    got = lru_conversation_hits(np.asarray(convs), np.asarray(blocks), capacity).tolist()
    assert got == brute_force_hits(convs, blocks, capacity)


def test_paper_b3_example_full_reuse() -> None:
    # R = 2, 8, 16 with everything resident: reuse R_1 - 1 and R_2 - 1 (tail block not reused).
    res = simulate(_trace([0, 0, 0], [2, 8, 16]), 100, warmup_fraction=0, cooldown_fraction=0)
    assert (res.hit_blocks, res.input_blocks) == (1 + 7, 26)
    assert res.hit_ratio == pytest.approx(8 / 26)


def test_hand_worked_eviction_sequence() -> None:
    # N = 10. A1(4) B1(5): 9 resident. A2(6): hit 3, total 11 -> evict B. B2(7): miss,
    # total 13 -> evict A. A3(8): miss, total 15 -> evict B.
    hits = lru_conversation_hits([0, 1, 0, 1, 0], [4, 5, 6, 7, 8], 10)
    assert hits.tolist() == [0, 0, 3, 0, 0]


def test_capacity_smaller_than_a_conversation_evicts_itself() -> None:
    # N = 3: turn 2 (5 blocks) hits on 2 - 1 blocks, then does not fit and evicts itself.
    assert lru_conversation_hits([0, 0, 0], [2, 5, 7], 3).tolist() == [0, 1, 0]
    assert lru_conversation_hits([0, 0], [2, 5], 0).tolist() == [0, 0]


def test_shrinking_input_reuses_at_most_its_own_blocks() -> None:
    assert lru_conversation_hits([0, 0], [10, 4], 100).tolist() == [0, 4]


def test_huge_capacity_reaches_the_upper_bound() -> None:
    trace = generate(preset("mixed"), lambda0=1.0, duration_s=600, seed=5)
    res = simulate(trace.sim_trace(), 10**12, warmup_fraction=0, cooldown_fraction=0)
    # Upper bound A_H_hash / A_R from the events: every revisit reuses R_{j-1} - 1 blocks.
    conv, blocks, turn = trace.conversation, trace.blocks, trace.turn
    order = np.lexsort((turn, conv))
    prev = np.where(turn[order][1:] > 1, blocks[order][:-1] - 1, 0)
    assert res.hit_blocks == int(prev.sum())
    assert res.input_blocks == int(blocks.sum())
    assert res.measured_conversations == trace.conversations
    assert res.measured_requests == len(trace)


def test_zero_fractions_measure_everything_and_defaults_measure_the_middle() -> None:
    first = np.arange(11, dtype=float) * 10  # 0, 10, ..., 100
    assert measured_conversations(first, 0, 0).all()
    mask = measured_conversations(first, 0.2, 0.2)
    assert np.flatnonzero(mask).tolist() == [2, 3, 4, 5, 6, 7, 8]  # first-turn time in [20, 80]
    # Every turn of a measured conversation counts, also one long after the window.
    conv = np.array([0, 1, 1, 2])
    ts = np.array([0.0, 50.0, 1000.0, 100.0])
    req, n = measured_requests(conv, ts, 3, 0.2, 0.2)
    assert req.tolist() == [False, True, True, False] and n == 1
    with pytest.raises(ValueError):
        measured_conversations(first, 0.7, 0.5)


def test_from_columns_sorts_and_numbers_sessions() -> None:
    trace = SimTrace.from_columns(
        ["b", "a", "a", "b"], [2, 1, 2, 1], [5.0, 1.0, 3.0, 2.0], [33, 16, 17, 1], block_size=16
    )
    assert trace.timestamp.tolist() == [1.0, 2.0, 3.0, 5.0]
    assert trace.blocks.tolist() == [1, 1, 2, 3]
    assert trace.conversation.tolist() == [0, 1, 0, 1]
    assert trace.conversations == 2


def test_registry_and_clear_errors() -> None:
    assert ("lru", "conversation") in POLICIES
    assert ("lru", "block") in POLICIES  # the block-level policies register on import
    with pytest.raises(PolicyUnavailable, match="unknown policy"):
        get_policy("nope")


def test_single_preset_near_mean_field() -> None:
    """Loose sanity check against h = A_H_hash/A_R * F(T), lam E_B T + lam A_H E[min(W,T)] = N."""
    lam, cap, mean = 1.0, 2275, 135.0
    truth = ground_truth(preset("single"))["general_explanations_definitions"]
    trace = generate(preset("single"), lambda0=lam, duration_s=6000, seed=11)
    res = simulate(trace.sim_trace(), cap)

    def displacement(t: float) -> float:
        return lam * truth.E_B * t + lam * truth.A_H * mean * -math.expm1(-t / mean)

    t_c = brentq(lambda t: displacement(t) - cap, 0.0, 1e6)
    h = truth.A_H_hash / truth.A_R * -math.expm1(-t_c / mean)
    assert res.measured_conversations > 3000
    assert abs(res.hit_ratio - h) < 0.03, (res.hit_ratio, h)
