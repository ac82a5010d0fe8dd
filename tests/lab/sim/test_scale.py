"""The simulator's compact and fast forms give the results of the forms they replace.

Block ids as one int64 array (:class:`BlockHashes`) instead of a tuple of lists, the trie built
by depth with numpy (:func:`trie_nodes`) instead of a dict one request at a time
(:func:`trie_layout`), flat positions read through memoryviews: the same node numbering, the
same hit blocks of every block policy, on generated traces and on hypothesis-drawn ids. LRU's key
as one int and the hit counters skipped where no strategy reads them: the same hits.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcast.exporters.kit.index import PriorityIndex
from kvcast.lab.sim.block_cache import BlockCache, Strategy, block_layout, trie_layout, trie_nodes
from kvcast.lab.sim.block_policies import IAC, LRU, Density
from kvcast.lab.sim.policy_tables import learn_table
from kvcast.lab.sim.registry import get_policy
from kvcast.lab.sim.trace import BlockHashes, SimTrace
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset

POLICIES = ("lru", "lfu", "gdsf", "iac", "density", "tbs")


def unpacked(trace: SimTrace) -> SimTrace:
    """The same trace with its ids as a tuple of lists (the dict-built trie's input)."""
    assert isinstance(trace.block_hashes, BlockHashes)
    return replace(trace, block_hashes=tuple(list(h) for h in trace.block_hashes))


@pytest.fixture(scope="module", params=["agent", "production", "agentic"])
def generated(request: pytest.FixtureRequest) -> SimTrace:
    size = {"agent": 12}.get(request.param, 400)
    return generate(preset(request.param), lambda0=0.5, conversations=size, seed=3).sim_trace()


def test_generated_traces_carry_packed_ids(generated: SimTrace) -> None:
    assert isinstance(generated.block_hashes, BlockHashes)
    assert len(generated.block_hashes) == len(generated)
    assert np.array_equal(np.diff(generated.block_hashes.offsets), generated.blocks)


def test_the_vectorized_trie_numbers_nodes_as_the_dict(generated: SimTrace) -> None:
    new, old = block_layout(generated), trie_layout(unpacked(generated))
    assert new.num_nodes == old.num_nodes
    assert np.array_equal(new.nodes, old.nodes) and np.array_equal(new.offsets, old.offsets)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_block_policy_hits_the_same_on_both_forms(generated: SimTrace, policy: str) -> None:
    caps = (40, 400) if len(generated) < 2000 else (20, 150)
    run = get_policy(policy, "block")
    for cap in caps:
        got = run(generated, cap)
        assert np.array_equal(got, run(unpacked(generated), cap)), (policy, cap)
        assert 0 < int(got.sum()) < int(generated.blocks.sum())


ids = st.lists(st.lists(st.integers(-3, 3), min_size=0, max_size=7), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(ids)
def test_trie_nodes_equal_the_dict_trie_on_any_ids(hashes: list[list[int]]) -> None:
    # Few distinct values: the same id under different parents, at different depths, repeated.
    lengths = np.array([len(h) for h in hashes], np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    flat = np.array([x for h in hashes for x in h], np.int64)
    nodes, count = trie_nodes(flat, offsets)
    trie: dict[tuple[int, int], int] = {}
    expect = []
    for h in hashes:
        node = -1
        for x in h:
            node = trie.setdefault((node, x), len(trie))
            expect.append(node)
    assert nodes.tolist() == expect and count == len(trie)


def test_pack_keeps_only_plain_int64_ids() -> None:
    assert isinstance(BlockHashes.pack([[1, 2], [3]]), BlockHashes)
    for bad in ([[1, "2"]], [[1, 2.0]], [[True]], [[1], None], [[2**63]]):
        assert BlockHashes.pack(bad) is None, bad  # kept as given: no "2" -> 2, no 2.0 -> 2


def test_from_columns_packs_in_processing_order() -> None:
    hashes = [[5, 6, 7], [5, 6], [9]]
    trace = SimTrace.from_columns(
        ["a", "a", "b"], [2, 1, 1], [2.0, 1.0, 0.5], [48, 32, 16], 16, block_hashes=hashes
    )
    assert isinstance(trace.block_hashes, BlockHashes)
    assert list(trace.block_hashes) == [[9], [5, 6], [5, 6, 7]]
    assert trace.block_hashes[-1] == [5, 6, 7] and trace.block_hashes[0:2] == [[9], [5, 6]]
    with pytest.raises(IndexError):
        trace.block_hashes[3]
    strings = SimTrace.from_columns(["a"], [1], [0.0], [32], 16, block_hashes=[["x", "y"]])
    assert strings.block_hashes == (["x", "y"],)


@pytest.mark.parametrize("name", ["agent", "production"])
def test_packed_ids_are_the_events_ids(name: str) -> None:
    trace = generate(preset(name), lambda0=0.5, conversations=8 if name == "agent" else 200, seed=4)
    packed = trace.sim_trace().block_hashes
    assert isinstance(packed, BlockHashes)
    assert list(packed) == trace.block_hashes()


class TupleLRU(LRU):
    """LRU with the key it had as a tuple, ``(r, -pos)``."""

    def entry(self, node: int, occ: int, now: float) -> tuple[Any, float | None]:
        r = self.req[occ]
        return (r, self.off[r] - occ), None


def counting(cls: type[Strategy]) -> type[Strategy]:
    """The strategy with the cache's hit counters kept up to date, as they all were."""
    return type(f"Counting{cls.__name__}", (cls,), {"wants_counts": True})


@pytest.mark.parametrize("cap", [30, 300])
def test_lru_int_key_and_skipped_counters_change_no_hit(generated: SimTrace, cap: int) -> None:
    layout = block_layout(generated)
    fast = BlockCache(generated, layout).run(cap, LRU())
    assert np.array_equal(fast, BlockCache(generated, layout).run(cap, TupleLRU()))
    assert np.array_equal(fast, BlockCache(generated, layout).run(cap, counting(TupleLRU)()))
    table = PriorityIndex(learn_table(generated, 0.2, capacity_blocks=cap))
    for strategy in (IAC(table), Density(table)):
        plain = BlockCache(generated, layout).run(cap, strategy)
        again = counting(type(strategy))(table)
        assert np.array_equal(plain, BlockCache(generated, layout).run(cap, again))
