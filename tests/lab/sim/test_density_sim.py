"""The ``density`` policy in the simulators evicts exactly what the engine-side client ranks
first. The references below are brute-force caches that, at every eviction, ask
``PriorityIndex.rank(..., policy="density")`` over every candidate: no heap, no flip times."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcast.exporters.kit.index import SHARED_INTENT, PriorityIndex
from kvcast.lab.sim.block_cache import block_layout
from kvcast.lab.sim.block_policies import density_block
from kvcast.lab.sim.conversation_policies import density_conversation, iac_conversation
from kvcast.lab.sim.lru import lru_conversation
from kvcast.lab.sim.policy_tables import equal_table, intent_labels, learn_table
from kvcast.lab.sim.registry import simulate
from kvcast.lab.sim.trace import SimTrace
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset


def reference_block_cache(trace: SimTrace, capacity: int, index: PriorityIndex) -> list[int]:
    """The block cache of ``kvcast.lab.sim.block_cache`` written the slow way: at each
    eviction the resident leaves not used by the running request are ranked by the client.
    Candidates are listed by (last request, deeper first), so that the client's stable sort
    breaks exact ties as the simulator's key does. A block that two conversations used is
    ranked as ``SHARED_INTENT`` where the table has the shared law."""
    layout = block_layout(trace)
    nodes, offs = layout.nodes.tolist(), layout.offsets.tolist()
    times, turns, labels = trace.timestamp.tolist(), trace.turn.tolist(), intent_labels(trace)
    conv = trace.conversation.tolist()
    users: dict[int, set[int]] = {}  # node -> every conversation that used it
    resident: dict[int, int] = {}  # node -> flat position of its latest use
    parent: dict[int, int] = {}
    children: dict[int, int] = {}
    out = []
    for r in range(len(trace)):
        a, b, now = offs[r], offs[r + 1], times[r]
        for nd in nodes[a:b]:
            users.setdefault(nd, set()).add(conv[r])
        k = a
        while k < b and nodes[k] in resident:
            k += 1
        out.append(k - a)
        for q in range(a, k):
            resident[nodes[q]] = q
        up = nodes[k - 1] if k > a else -1
        for q in range(k, min(b, a + capacity)):
            if len(resident) >= capacity:
                leaves = [
                    nd for nd, occ in resident.items() if not children.get(nd) and occ < a
                ]  # fmt: skip
                if not leaves:
                    break
                req = layout.request_of()
                leaves.sort(key=lambda nd: (int(req[resident[nd]]), -(resident[nd] - a)))
                cands = []
                for nd in leaves:
                    rr = int(req[resident[nd]])
                    shared = index.has_shared and len(users[nd]) > 1
                    intent = SHARED_INTENT if shared else labels[rr]
                    cands.append((intent, turns[rr], now - times[rr], 1.0))
                victim = leaves[index.rank(cands, policy="density")[0]]
                del resident[victim]
                p = parent.pop(victim, -1)
                if p >= 0:
                    children[p] -= 1
            nd = nodes[q]
            resident[nd] = q
            children[nd] = 0
            parent[nd] = up
            if up >= 0:
                children[up] = children.get(up, 0) + 1
            up = nd
    return out


def reference_conversation_cache(trace: SimTrace, capacity: int, index: PriorityIndex) -> list[int]:
    """Algorithm 1 evicting, while over capacity, the conversation the client ranks first
    (candidates in order of their latest request)."""
    conv, size = trace.conversation.tolist(), trace.blocks.tolist()
    times, turns, labels = trace.timestamp.tolist(), trace.turn.tolist(), intent_labels(trace)
    content: dict[int, tuple[int, int]] = {}  # conversation -> (blocks, latest request)
    out = []
    for r, (c, blocks) in enumerate(zip(conv, size, strict=True)):
        prev = content.pop(c, None)
        out.append(min(prev[0] - 1, blocks) if prev and prev[0] > 1 else 0)
        while content and sum(v[0] for v in content.values()) + blocks > capacity:
            order = sorted(content, key=lambda d: content[d][1])
            cands = [
                (labels[content[d][1]], turns[content[d][1]], times[r] - times[content[d][1]], 1.0)
                for d in order
            ]  # fmt: skip
            del content[order[index.rank(cands, policy="density")[0]]]
        if blocks <= capacity:
            content[c] = (blocks, r)
    return out


def mixed_trace(conversations: int, seed: int) -> SimTrace:
    return generate(
        preset("mixed"), lambda0=1.0, conversations=conversations, seed=seed
    ).sim_trace()


def learned(trace: SimTrace, horizon_s: float) -> PriorityIndex:
    return PriorityIndex({**learn_table(trace, 0.3), "characteristic_time_s": horizon_s})


@pytest.mark.parametrize(("seed", "capacity", "horizon_s"), [(1, 40, 60.0), (2, 150, 300.0),
                                                             (3, 400, 2000.0)])  # fmt: skip
def test_block_simulator_evicts_what_the_client_ranks_first(
    seed: int, capacity: int, horizon_s: float
) -> None:
    trace = mixed_trace(120, seed)
    index = learned(trace, horizon_s)
    got = density_block(trace, capacity, table=index).tolist()
    assert got == reference_block_cache(trace, capacity, index)
    assert sum(got) > 0  # the cache was used, and full (it evicted) at these capacities
    assert sum(got) < sum(density_block(trace, 10**6, table=index).tolist())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 6), st.floats(0.0, 400.0)),
        min_size=1,
        max_size=40,
    ),
    st.integers(2, 12),
    st.sampled_from([None, 0.99, 0.01]),
)
def test_block_simulator_and_client_agree_on_shared_prefixes(
    reqs: list[tuple[int, int, float]], capacity: int, shared_p: float | None
) -> None:
    """Requests with hashed blocks from a small alphabet: prefixes shared across requests,
    ranked by the table's shared law where it has one (``shared_p``), else by their states."""
    hashes = [[(c * 7 + j) % 5 for j in range(n)] for c, n, _ in reqs]
    times = sorted(t for _, _, t in reqs)
    trace = SimTrace.from_columns(
        list(range(len(reqs))), [1 + c % 3 for c, _, _ in reqs], times,
        [16 * len(h) for h in hashes], 16, intent=[f"i{c % 2}" for c, _, _ in reqs],
        block_hashes=hashes,
    )  # fmt: skip
    table = {
        "version": 1,
        "defaults": {"p_continue": 0.5, "median_reuse_s": 150.0},
        "characteristic_time_s": 90.0,
        "states": [
            {"intent": "i0", "turn": 1, "p_continue": 0.9, "median_reuse_s": 20.0,
             "mu": math.log(20.0), "sigma": 0.6, "conversations": 40, "delay_samples": 30},
            {"intent": "i1", "turn": 2, "p_continue": 0.3, "median_reuse_s": 300.0,
             "mu": math.log(300.0), "sigma": 1.5, "conversations": 40, "delay_samples": 10},
        ],
        "shared": None if shared_p is None else {
            "p_continue": shared_p, "median_reuse_s": 2.0, "mu": math.log(2.0), "sigma": 0.5,
            "references": 90, "lives": 10,
        },
    }  # fmt: skip
    index = PriorityIndex(table)
    assert index.has_shared == (shared_p is not None)
    assert density_block(trace, capacity, table=index).tolist() == reference_block_cache(
        trace, capacity, index
    )


@pytest.mark.parametrize(("seed", "capacity"), [(4, 60), (5, 300)])
def test_conversation_simulator_evicts_what_the_client_ranks_first(
    seed: int, capacity: int
) -> None:
    trace = mixed_trace(150, seed)
    index = learned(trace, 120.0)
    got = density_conversation(trace, capacity, table=index).tolist()
    assert got == reference_conversation_cache(trace, capacity, index)
    assert 0 < sum(got) < sum(lru_conversation(trace, 10**6).tolist())


def test_conversation_iac_with_equal_states_is_algorithm_1() -> None:
    trace = mixed_trace(200, 6)
    for capacity in (30, 200, 2000):
        assert (
            iac_conversation(trace, capacity, table=equal_table()).tolist()
            == lru_conversation(trace, capacity).tolist()
        )


def test_unbounded_density_equals_unbounded_lru() -> None:
    trace = mixed_trace(150, 7)
    for granularity in ("block", "conversation"):
        lru = simulate(trace, 10**7, "lru", granularity, 0.0, 0.0)
        dens = simulate(trace, 10**7, "density", granularity, 0.0, 0.0)
        assert dens.hit_blocks == lru.hit_blocks > 0


def test_learned_table_carries_the_forecasts_characteristic_time() -> None:
    trace = mixed_trace(300, 8)
    small, large = (learn_table(trace, 0.2, capacity_blocks=n) for n in (100, 5000))
    assert 0 < small["characteristic_time_s"] < large["characteristic_time_s"]
    assert learn_table(trace, 0.2)["characteristic_time_s"] is None
    # The horizon option replaces the learned one, as given; a table's own is floored.
    hits = [
        density_block(trace, 300, table=small, horizon_s=h).tolist() for h in (60.0, 3600.0)
    ]  # fmt: skip
    assert hits[0] != hits[1]
    assert not np.array_equal(
        density_block(trace, 300, table=small, horizon_s=1.0),
        density_block(trace, 300, table=small, horizon_s=60.0),
    )
    assert np.array_equal(
        density_block(trace, 300, table={**small, "characteristic_time_s": 1.0}),
        density_block(trace, 300, table=small, horizon_s=60.0),
    )
    assert PriorityIndex(small, horizon_s=1.0).horizon_s == 1.0
    assert PriorityIndex({**small, "characteristic_time_s": 1.0}).horizon_s == 60.0
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="horizon_s must be a finite number of seconds > 0"):
            PriorityIndex(small, horizon_s=bad)


@pytest.mark.parametrize(("shared_p", "prefix_hits"), [(0.99, 2), (0.01, 1)])
def test_a_shared_prefix_is_kept_or_evicted_by_the_tables_shared_law(
    shared_p: float, prefix_hits: int
) -> None:
    """Two conversations share blocks 1-2; two private requests then fill a 3-block cache.
    A shared law that says "reused again soon" keeps the prefix for the fifth conversation;
    one that says "rarely reused" lets it go before the private blocks of an unlikely state."""
    hashes = [[1, 2], [1, 2], [3], [4], [1, 2]]
    trace = SimTrace.from_columns(
        [0, 1, 2, 3, 4], [1] * 5, [0.0, 10.0, 20.0, 30.0, 40.0], [32, 32, 16, 16, 32], 16,
        intent=["i0"] * 5, block_hashes=hashes,
    )  # fmt: skip
    index = PriorityIndex(
        {
            "version": 1,
            "characteristic_time_s": 600.0,
            "states": [{"intent": "i0", "turn": 1, "p_continue": 0.05, "median_reuse_s": 100.0,
                        "mu": math.log(100.0), "sigma": 0.5, "conversations": 200}],
            "shared": {"p_continue": shared_p, "median_reuse_s": 100.0, "mu": math.log(100.0),
                       "sigma": 0.5, "references": 500, "lives": 5},
        }
    )  # fmt: skip
    got = density_block(trace, 3, table=index).tolist()
    assert got == reference_block_cache(trace, 3, index)
    assert got[:2] == [0, 2] and got[4] == prefix_hits


def test_density_holds_lru_on_agent_traffic() -> None:
    """Issue 33 item 6: on a small seeded ``agent`` workload (epoch clock, the history only
    the warm-up's few long conversations, so the table lists turn 32 alone) density keeps at
    least 0.995 of block-level LRU. With the defaults' law (p 0.5, 150 s) for the unlisted
    turns it fell to 0.94 at 500 blocks; the listed states pooled rank them as measured."""
    gen = generate(preset("agent"), lambda0=0.02, conversations=60, seed=1, start_time=1.7e9)
    trace = gen.sim_trace()
    warmup, cooldown = gen.measurement_fractions()
    layout = block_layout(trace)
    for capacity in (250, 500, 1000):
        lru = simulate(trace, capacity, "lru", "block", warmup, cooldown, layout=layout)
        density = simulate(
            trace, capacity, "density", "block", warmup, cooldown, layout=layout,
            learn_fraction=warmup,
        )  # fmt: skip
        assert density.hit_ratio >= 0.995 * lru.hit_ratio, capacity
