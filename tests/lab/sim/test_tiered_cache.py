"""The tiered block cache: each tier's served blocks against the plain block simulator (the
stack-inclusion identities of docs/validation.md, "Tiers") and against a brute-force list model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcast.lab.sim.block_cache import block_layout
from kvcast.lab.sim.registry import get_policy
from kvcast.lab.sim.tiered_cache import measure_tiers, tiered_block_hits
from kvcast.lab.sim.trace import SimTrace
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset


def _hashed(hashes: list[list[int]]) -> SimTrace:
    n = len(hashes)
    return SimTrace.from_columns(
        list(range(n)), [1] * n, list(range(n)), [16 * len(h) for h in hashes], 16,
        block_hashes=hashes,
    )  # fmt: skip


def _lru(trace: SimTrace, cap: int) -> np.ndarray:
    return get_policy("lru", "block")(trace, cap)


def _brute(trace: SimTrace, caps: list[int], mode: str) -> np.ndarray:
    """Lists of blocks, most recent first. Exclusive: the tiers are consecutive slices of one
    list (a block pushed off a tier lands at the top of the next); inclusive: one list per tier,
    each touched by every request. A request's blocks go to the top head first."""
    lay = block_layout(trace)
    chains = [lay.nodes[lay.offsets[r] : lay.offsets[r + 1]].tolist() for r in range(len(trace))]
    out = np.zeros((len(trace), len(caps)), dtype=np.int64)
    if mode == "exclusive":
        stack: list[int] = []
        for r, chain in enumerate(chains):
            bounds = np.cumsum([0, *caps])
            tier_of = {
                b: int(np.searchsorted(bounds, i, side="right")) - 1 for i, b in enumerate(stack)
            }
            for b in chain:
                if b not in tier_of:
                    break
                out[r, tier_of[b]] += 1
            stack = (chain + [b for b in stack if b not in set(chain)])[: sum(caps)]
        return out
    lists: list[list[int]] = [[] for _ in caps]
    for r, chain in enumerate(chains):
        for b in chain:
            top = next((t for t, held in enumerate(lists) if b in held), None)
            if top is None:
                break
            out[r, top] += 1
        for t, cap in enumerate(caps):
            lists[t] = (chain + [b for b in lists[t] if b not in set(chain)])[:cap]
    return out


def test_hand_worked_exclusive_demotion_and_promotion() -> None:
    # GPU 2, host 2. [1,2] fills the GPU; [3,4] demotes it to the host; [1,2] is then a hit
    # served by the host (promoted back, demoting [3,4]); [3] is then a host hit.
    trace = _hashed([[1, 2], [3, 4], [1, 2], [3]])
    served = tiered_block_hits(trace, [2, 2], "exclusive")
    assert served.tolist() == [[0, 0], [0, 0], [0, 2], [0, 1]]
    # The plain GPU alone (2 blocks) hits nothing; one LRU of 4 hits what the stack hits.
    assert _lru(trace, 2).tolist() == [0, 0, 0, 0]
    assert _lru(trace, 4).tolist() == [0, 0, 2, 1]


def test_hand_worked_inclusive_write_through() -> None:
    # GPU 1, host 3: every block is written to both; the GPU keeps only the newest head.
    trace = _hashed([[1, 2], [1, 2], [3], [1]])
    served = tiered_block_hits(trace, [1, 3], "inclusive")
    # req1: block 1 on the GPU (its head), 2 only on the host; req3: 1 was pushed off the GPU
    # by 3 but its host copy stays.
    assert served.tolist() == [[0, 0], [1, 1], [0, 0], [0, 1]]


def test_request_longer_than_the_gpu_spills_its_tail_below() -> None:
    trace = _hashed([[1, 2, 3, 4], [1, 2, 3, 4]])
    assert tiered_block_hits(trace, [2, 2], "exclusive").tolist() == [[0, 0], [2, 2]]
    assert tiered_block_hits(trace, [2, 1], "exclusive").tolist() == [[0, 0], [2, 1]]
    assert _lru(trace, 3).tolist() == [0, 3]


traces = st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=7), min_size=1, max_size=40).map(
    _hashed
)


@settings(max_examples=200, deadline=None)
@given(traces, st.lists(st.integers(1, 12), min_size=1, max_size=3))
def test_exclusive_tiers_serve_the_single_lru_differences(trace: SimTrace, caps: list[int]) -> None:
    served = tiered_block_hits(trace, caps, "exclusive")
    reach = np.cumsum(caps)
    below = np.zeros(len(trace), dtype=np.int64)
    for k, n in enumerate(reach):
        total = _lru(trace, int(n))
        np.testing.assert_array_equal(served[:, k], total - below)
        below = total
    np.testing.assert_array_equal(served, _brute(trace, caps, "exclusive"))


@settings(max_examples=200, deadline=None)
@given(traces, st.lists(st.integers(1, 12), min_size=1, max_size=3))
def test_inclusive_tiers_against_brute_force(trace: SimTrace, caps: list[int]) -> None:
    served = tiered_block_hits(trace, caps, "inclusive")
    np.testing.assert_array_equal(served, _brute(trace, caps, "inclusive"))
    if caps == sorted(caps):  # nested tiers: tier k serves LRU(Nk) - LRU(N(k-1))
        below = np.zeros(len(trace), dtype=np.int64)
        for k, n in enumerate(caps):
            total = _lru(trace, n)
            np.testing.assert_array_equal(served[:, k], total - below)
            below = total


@pytest.mark.parametrize("mode", ["exclusive", "inclusive"])
def test_preset_identity(mode: str) -> None:
    trace = generate(preset("agentic"), lambda0=0.5, duration_s=1500.0, seed=3).sim_trace()
    caps = [300, 900] if mode == "exclusive" else [300, 1200]
    served = tiered_block_hits(trace, caps, mode)
    gpu = _lru(trace, caps[0])
    total = _lru(trace, sum(caps) if mode == "exclusive" else caps[1])
    assert served[:, 1].sum() > 0.05 * trace.blocks.sum()  # the host tier matters here
    np.testing.assert_array_equal(served[:, 0], gpu)
    np.testing.assert_array_equal(served[:, 1], total - gpu)
    result = measure_tiers(trace, served, ["gpu", "host"], caps, mode, 0.0, 0.0)
    assert result.hit_blocks == int(total.sum())
    assert [t.hit_blocks for t in result.tiers] == [int(gpu.sum()), int((total - gpu).sum())]


def test_a_request_mask_measures_exactly_those_requests() -> None:
    """A time window of requests (the agent validation's steady part) instead of whole
    conversations: each tier's share is its served blocks over the window's input blocks."""
    trace = generate(preset("agentic"), lambda0=0.5, duration_s=1500.0, seed=3).sim_trace()
    caps = [300, 900]
    served = tiered_block_hits(trace, caps, "exclusive")
    window = (trace.timestamp >= 500.0) & (trace.timestamp < 1000.0)
    result = measure_tiers(trace, served, ["gpu", "host"], caps, "exclusive", requests=window)
    total = int(trace.blocks[window].sum())
    assert [t.hit_ratio for t in result.tiers] == [
        int(served[window, k].sum()) / total for k in range(2)
    ]
    assert result.measured_requests == int(window.sum())
    assert result.measured_conversations == len(set(trace.conversation[window].tolist()))
    whole = measure_tiers(trace, served, ["gpu", "host"], caps, "exclusive", 0.0, 0.0)
    assert whole.measured_requests == len(trace) > result.measured_requests


def test_bad_capacities_and_mode() -> None:
    trace = _hashed([[1]])
    with pytest.raises(ValueError, match="tier mode"):
        tiered_block_hits(trace, [1], "mixed")
    with pytest.raises(ValueError, match="whole number >= 1"):
        tiered_block_hits(trace, [1, 0], "exclusive")
