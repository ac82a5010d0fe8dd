"""kvcast inside vLLM 0.33.0: its real ``KVCacheManager``, ``BlockPool`` and blocks.

Nothing is stubbed: the managers below are vLLM's, built as vLLM builds them for one
full-attention group; only the queue's clock is the tests' own (so that "past the median"
happens on cue). Untagged traffic must be stock step for step; tagged traffic must evict what
the table ranks lowest; the null block must stay taken either way.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm.v1.core import block_pool as vllm_block_pool
from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock

from kvcast.exporters.kit.adapters.vllm import IACFreeBlockQueue, install, request_state
from kvcast.exporters.kit.index import PriorityIndex
from tests.engines.vllm_parts import (
    BLOCK_TOKENS,
    Clock,
    cached_tokens,
    free_ids,
    kv_cache_manager,
    request,
    serve,
)

TABLE = {
    "version": 1,
    "defaults": {"p_continue": 0.5, "median_reuse_s": 150.0},
    "states": [
        {"intent": "coding", "turn": 1, "p_continue": 0.9, "median_reuse_s": 50.0},
        {"intent": "chitchat", "turn": 1, "p_continue": 0.2, "median_reuse_s": 500.0},
    ],
}


def prompt(seed: int, blocks: int, extra_tokens: int = 0) -> list[int]:
    """``blocks`` full blocks (and a partial one) of tokens no other seed's prompt shares."""
    return [seed * 1000 + i for i in range(blocks * BLOCK_TOKENS + extra_tokens)]


def kvcast_manager(num_blocks: int, table: dict = TABLE, clock: Clock | None = None):
    manager = kv_cache_manager(num_blocks)
    queue = install(manager, PriorityIndex(table))
    if clock is not None:
        queue._clock = clock  # the tests' clock: seconds they set
    return manager, queue


# -- the null block and the counts -----------------------------------------------------------


def test_installing_into_a_built_manager_keeps_the_null_block_taken() -> None:
    stock, (kvcast, _) = kv_cache_manager(10), kvcast_manager(10)
    assert kvcast.block_pool.get_num_free_blocks() == stock.block_pool.get_num_free_blocks() == 9
    handed_out = kvcast.block_pool.get_new_blocks(9)
    assert 0 not in [b.block_id for b in handed_out]
    assert kvcast.block_pool.null_block.is_null and kvcast.block_pool.null_block.block_id == 0
    with pytest.raises(ValueError, match="Cannot get 1 free blocks from the pool"):
        kvcast.block_pool.get_new_blocks(1)


def test_a_pool_built_with_the_bound_class_takes_the_null_block_as_stock_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        vllm_block_pool, "FreeKVCacheBlockQueue", IACFreeBlockQueue.bound(PriorityIndex(TABLE))
    )
    manager = kv_cache_manager(10)
    assert isinstance(manager.block_pool.free_block_queue, IACFreeBlockQueue)
    assert manager.block_pool.get_num_free_blocks() == 9
    assert 0 not in free_ids(manager)


def test_the_queue_speaks_vllms_errors() -> None:
    stock = FreeKVCacheBlockQueue([KVCacheBlock(1)])
    ours = IACFreeBlockQueue([KVCacheBlock(1)])
    for queue in (stock, ours):
        queue.popleft()
    messages = []
    for queue in (stock, ours):
        with pytest.raises(ValueError) as empty:
            queue.popleft()
        with pytest.raises(RuntimeError) as invalid:
            queue.remove(KVCacheBlock(7))
        messages.append((str(empty.value), str(invalid.value)))
    assert (
        messages[0]
        == messages[1]
        == (
            "No free blocks available",
            f"remove() called on an invalid block: {KVCacheBlock(7)}",
        )
    )


# -- untagged traffic: stock, step for step ----------------------------------------------------

requests = st.lists(
    st.tuples(
        st.lists(st.integers(0, 5), min_size=0, max_size=5),  # shared block contents
        st.integers(0, BLOCK_TOKENS - 1),  # a partial last block
        st.sampled_from([None, "coding", "chitchat", "unlisted"]),
    ),
    min_size=1,
    max_size=40,
)


def tokens_of(contents: list[int], partial: int, position: int) -> list[int]:
    tokens = [c * 100 + i for c in contents for i in range(BLOCK_TOKENS)]
    return tokens + [90_000 + position] * partial or [90_000 + position]


@settings(max_examples=60, deadline=None)
@given(requests)
def test_untagged_requests_are_served_exactly_as_by_the_stock_queue(steps) -> None:
    stock, (kvcast, _) = kv_cache_manager(17), kvcast_manager(17)
    for position, (contents, partial, _) in enumerate(steps):
        tokens = tokens_of(contents, partial, position)
        got = serve(kvcast, request(f"r{position}", tokens))
        assert got == serve(stock, request(f"r{position}", tokens))  # blocks and cache hits
        assert free_ids(kvcast) == free_ids(stock)
        assert kvcast.block_pool.get_num_free_blocks() == stock.block_pool.get_num_free_blocks()


@settings(max_examples=60, deadline=None)
@given(requests)
def test_tagged_requests_keep_the_counts_and_never_get_the_null_block(steps) -> None:
    stock, (kvcast, _) = kv_cache_manager(17), kvcast_manager(17)
    for position, (contents, partial, intent) in enumerate(steps):
        tokens = tokens_of(contents, partial, position)
        got = serve(kvcast, request(f"r{position}", tokens, intent))
        expected = serve(stock, request(f"r{position}", tokens))
        assert (got is None) == (expected is None)
        if got is not None:
            assert 0 not in got[0] and len(set(got[0])) == len(got[0])
        assert kvcast.block_pool.get_num_free_blocks() == stock.block_pool.get_num_free_blocks()
        assert sorted(free_ids(kvcast)) == sorted(free_ids(stock))


# -- tagged traffic: the table decides --------------------------------------------------------


def test_eviction_takes_the_state_least_likely_to_continue_first() -> None:
    manager, _ = kvcast_manager(13, clock=Clock())  # 12 usable blocks
    likely, unlikely, unlisted = prompt(1, 4), prompt(2, 4), prompt(3, 4)
    serve(manager, request("a", likely, "coding"))  # p 0.9
    serve(manager, request("b", unlikely, "chitchat"))  # p 0.2
    serve(manager, request("c", unlisted, "unlisted"))  # the defaults: p 0.5
    assert [cached_tokens(manager, p) for p in (likely, unlikely, unlisted)] == [64, 64, 64]
    serve(manager, request("new", prompt(4, 2)))  # 2 blocks: from chitchat's tail
    assert [cached_tokens(manager, p) for p in (likely, unlikely, unlisted)] == [64, 32, 64]
    serve(manager, request("new2", prompt(5, 8)))  # the untagged 2, chitchat's 2, then unlisted
    assert [cached_tokens(manager, p) for p in (likely, unlikely, unlisted)] == [64, 0, 0]


def test_a_block_past_its_states_median_goes_before_younger_ones_of_any_state() -> None:
    clock = Clock()
    manager, _ = kvcast_manager(9, clock=clock)  # 8 usable blocks
    likely, unlikely = prompt(1, 4), prompt(2, 4)
    serve(manager, request("a", likely, "coding"))  # median 50 s
    serve(manager, request("b", unlikely, "chitchat"))  # median 500 s
    clock.now_s += 60.0  # coding's blocks are past their median, chitchat's are not
    serve(manager, request("new", prompt(3, 4)))
    assert [cached_tokens(manager, p) for p in (likely, unlikely)] == [0, 64]


def test_a_cache_hit_takes_the_block_out_and_its_next_free_retags_it() -> None:
    clock = Clock()
    manager, _ = kvcast_manager(10, clock=clock)  # 9 usable: 8 cached below, 1 never used
    first, second = prompt(1, 4), prompt(2, 4)
    serve(manager, request("a", first, "chitchat"))
    serve(manager, request("b", second, "coding"))
    hit = serve(manager, request("a2", [*first, 7], "coding"))  # now a coding turn: p 0.9
    assert hit is not None and hit[1] == 64  # its 4 cached blocks, and 1 new (partial) one
    # 4 blocks: the partial one (no hash: reused first, as stock), then 3 coding blocks, the
    # earliest freed first: second's tail; first's blocks, freed again later, stay.
    serve(manager, request("new", prompt(3, 4)))
    assert [cached_tokens(manager, p) for p in (first, second)] == [64, 16]


def test_untagged_blocks_are_reused_before_any_tagged_one() -> None:
    manager, _ = kvcast_manager(9, clock=Clock())
    tagged, untagged = prompt(1, 4), prompt(2, 4)
    serve(manager, request("a", tagged, "chitchat"))
    serve(manager, request("b", untagged))
    serve(manager, request("new", prompt(3, 4)))
    assert [cached_tokens(manager, p) for p in (tagged, untagged)] == [64, 0]


def test_a_new_table_reorders_the_blocks_already_free() -> None:
    clock = Clock()
    manager = kv_cache_manager(9)

    class Live:
        index = PriorityIndex(TABLE)

    queue = install(manager, Live)
    queue._clock = clock
    first, second = prompt(1, 4), prompt(2, 4)
    serve(manager, request("a", first, "coding"))
    serve(manager, request("b", second, "chitchat"))
    flipped = json.loads(json.dumps(TABLE))
    flipped["version"] = 2
    flipped["states"][0]["p_continue"], flipped["states"][1]["p_continue"] = 0.1, 0.95
    Live.index = PriorityIndex(flipped)
    serve(manager, request("new", prompt(3, 4)))
    assert [cached_tokens(manager, p) for p in (first, second)] == [0, 64]


def test_iter_blocks_after_walks_the_eviction_order_from_a_cursor() -> None:
    manager, queue = kvcast_manager(9, clock=Clock())
    serve(manager, request("a", prompt(1, 4), "coding"))
    serve(manager, request("b", prompt(2, 4), "chitchat"))
    order = queue.get_all_free_blocks()
    assert list(queue.iter_blocks_after(None)) == order
    assert list(queue.iter_blocks_after(order[2])) == order[3:]
    taken = manager.block_pool.get_new_blocks(3)
    assert taken == order[:3]
    assert list(queue.iter_blocks_after(taken[0])) == []  # no longer free: nothing after it


# -- the queue against a brute-force order ----------------------------------------------------

P_OF = {"coding": 0.9, "chitchat": 0.2, None: 0.5}
MEDIAN_OF = {"coding": 50.0, "chitchat": 500.0, None: 150.0}

operations = st.lists(
    st.one_of(
        st.tuples(st.just("free"), st.integers(1, 6),
                  st.sampled_from(["coding", "chitchat", "x", None])),
        st.tuples(st.just("prepend"), st.integers(1, 4), st.none()),
        st.tuples(st.just("take"), st.integers(1, 12), st.none()),
        st.tuples(st.just("hit"), st.integers(0, 1000), st.none()),
        st.tuples(st.just("wait"), st.sampled_from([1.0, 49.0, 120.0, 600.0]), st.none()),
    ),
    max_size=60,
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(operations)
def test_popleft_n_takes_untagged_in_list_order_then_the_iac_order(ops) -> None:
    """Reference: untagged blocks in their list's order, then tagged ones sorted by
    (not yet past the median, P of their state, the order they were freed in)."""
    clock = Clock()
    blocks = [KVCacheBlock(i) for i in range(40)]
    queue = IACFreeBlockQueue(blocks, table=PriorityIndex(TABLE), clock=clock)
    plain = list(blocks)  # the reference: untagged, in order
    tagged: dict[int, tuple[str | None, float, int]] = {}  # id -> (state, freed at, sequence)
    held: list[KVCacheBlock] = []
    sequence = 0

    def expected_order() -> list[int]:
        def key(block_id: int) -> tuple:
            state, freed_at, seq = tagged[block_id]
            return (0 if freed_at + MEDIAN_OF[state] <= clock.now_s else 1, P_OF[state], seq)

        return [b.block_id for b in plain] + sorted(tagged, key=key)

    for kind, amount, intent in ops:
        if kind == "free" and held:
            run, held = held[:amount], held[amount:]
            if intent is None:
                queue.append_n(run)
                plain.extend(run)
            else:
                with queue.tagging(intent, 1):
                    queue.append_n(run)
                state = intent if intent in P_OF else None
                for block in run:
                    sequence += 1
                    tagged[block.block_id] = (state, clock.now_s, sequence)
        elif kind == "prepend" and held:
            run, held = held[:amount], held[amount:]
            queue.prepend_n(run)
            plain[:0] = run
        elif kind == "take":
            wanted = min(amount, queue.num_free_blocks)
            order = expected_order()
            taken = queue.popleft_n(wanted)
            assert [b.block_id for b in taken] == order[:wanted]
            for block in taken:
                tagged.pop(block.block_id, None)
            plain = [b for b in plain if b not in taken]
            held.extend(taken)
        elif kind == "hit" and queue.num_free_blocks:
            order = expected_order()
            victim = blocks[order[amount % len(order)]]
            queue.remove(victim)
            tagged.pop(victim.block_id, None)
            plain = [b for b in plain if b is not victim]
            held.append(victim)
        elif kind == "wait":
            clock.now_s += amount
        assert [b.block_id for b in queue.get_all_free_blocks()] == expected_order()
        assert queue.num_free_blocks == len(plain) + len(tagged)


# -- the request's state ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "state"),
    [
        ({"kvcast_intent": "coding", "kvcast_turn": 3}, ("coding", 3)),
        ({"kvcast_intent": "coding", "kvcast_turn": "3"}, ("coding", 3)),  # vllm_xargs strings
        ({"kvcast_intent": "coding"}, ("coding", 1)),
        ({"kvcast_intent": "coding", "kvcast_turn": 0}, (None, 0)),
        ({"kvcast_intent": "coding", "kvcast_turn": True}, (None, 0)),
        ({"kvcast_intent": 7}, (None, 0)),
        (None, (None, 0)),
    ],
)
def test_the_state_comes_from_the_requests_vllm_xargs(extra, state) -> None:
    req = request("r", [1, 2, 3])
    req.sampling_params.extra_args = extra
    assert request_state(req) == state


# -- no edit of vLLM: its plugin loader installs kvcast ---------------------------------------

PLUGIN_CHECK = textwrap.dedent(
    """
    import json, sys
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from tests.engines.vllm_parts import kv_cache_manager, request, serve, cached_tokens
    manager = kv_cache_manager(9)
    queue = manager.block_pool.free_block_queue
    first = [1000 + i for i in range(64)]
    second = [2000 + i for i in range(64)]
    serve(manager, request("a", first, "coding"))  # freed first: LRU's victim
    serve(manager, request("b", second, "chitchat"))  # p 0.2: IAC's victim
    serve(manager, request("c", [3000 + i for i in range(64)]))
    print(json.dumps({
        "queue": type(queue).__name__,
        "free": manager.block_pool.get_num_free_blocks(),
        "cached": [cached_tokens(manager, first), cached_tokens(manager, second)],
    }))
    """
)


@pytest.mark.parametrize("with_table", [True, False])
def test_vllms_plugin_loader_installs_kvcast_when_a_table_is_configured(
    tmp_path: Path, with_table: bool
) -> None:
    table = tmp_path / "table.json"
    table.write_text(json.dumps(TABLE))
    env = {k: v for k, v in os.environ.items() if k not in ("KVCAST_TABLE", "VLLM_PLUGINS")}
    if with_table:
        env["KVCAST_TABLE"] = str(table)
    result = subprocess.run(
        [sys.executable, "-c", PLUGIN_CHECK],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).parents[2],
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["free"] == 8
    if with_table:  # chitchat (p 0.2) evicted for the untagged request, coding kept
        assert seen == {"queue": "IACFreeBlockQueue", "free": 8, "cached": [64, 0]}
    else:  # stock LRU: the least recently freed, coding's
        assert seen == {"queue": "FreeKVCacheBlockQueue", "free": 8, "cached": [0, 64]}


def test_blocks_freed_before_the_table_loaded_move_once_it_lists_their_state() -> None:
    manager = kv_cache_manager(9)

    class Live:
        index = PriorityIndex(None)  # no table yet: every state on the defaults

    queue = install(manager, Live)
    queue._clock = Clock()
    first, second = prompt(1, 4), prompt(2, 4)
    serve(manager, request("a", first, "coding"))
    serve(manager, request("b", second, "chitchat"))
    Live.index = PriorityIndex(TABLE)  # chitchat: p 0.2, coding: p 0.9
    serve(manager, request("new", prompt(3, 4)))
    assert [cached_tokens(manager, p) for p in (first, second)] == [64, 0]


# -- the density policy --------------------------------------------------------------------------

DENSITY_TABLE = {
    **TABLE,
    "characteristic_time_s": 120.0,
    "states": [
        {**TABLE["states"][0], "mu": 3.912023005428146, "sigma": 0.5, "conversations": 200},
        {**TABLE["states"][1], "mu": 6.214608098422191, "sigma": 1.5, "conversations": 200},
    ],
}


def test_density_evicts_in_the_clients_density_order_in_vllms_own_pool() -> None:
    """Through vLLM's KVCacheManager.free and BlockPool: the blocks that go are those the
    client's ``priority(..., policy="density")`` ranks lowest, a request's tail first; and a
    coding block long past its 50 s median goes before a fresh chit-chat one (IAC would keep
    it first: P = 0.9)."""
    from kvcast.exporters.kit.adapters.request_state import FixedTable

    clock = Clock()
    index = PriorityIndex(DENSITY_TABLE)
    manager = kv_cache_manager(13)  # 12 usable blocks
    install(manager, FixedTable(index, "density"))._clock = clock
    old_coding, chitchat, coding = prompt(1, 4), prompt(2, 4), prompt(3, 4)
    serve(manager, request("a", old_coding, "coding"))
    clock.now_s += 900.0
    serve(manager, request("b", chitchat, "chitchat"))
    clock.now_s += 5.0
    serve(manager, request("c", coding, "coding"))
    clock.now_s += 5.0
    ages = {"a": 910.0, "b": 10.0, "c": 5.0}
    states = {"a": "coding", "b": "chitchat", "c": "coding"}
    keys = {k: index.priority(states[k], 1, ages[k], 1, policy="density") for k in ages}
    order = sorted(ages, key=keys.__getitem__)
    assert order[0] == "a"  # dead: 900 s past a 50 s median
    serve(manager, request("new", prompt(4, 6)))  # 6 blocks: the lowest request, then 2 more
    prompts = {"a": old_coding, "b": chitchat, "c": coding}
    cached = {k: cached_tokens(manager, p) for k, p in prompts.items()}
    assert cached[order[0]] == 0
    assert cached[order[1]] == 32  # its tail's two blocks went, its head stays reachable
    assert cached[order[2]] == 64


@pytest.mark.parametrize(("shared_p", "prompt_kept"), [(0.99, True), (0.01, False)])
def test_a_prompt_a_second_conversation_finds_cached_is_ranked_by_the_shared_law(
    shared_p: float, prompt_kept: bool
) -> None:
    """Through vLLM's own lookup and free: a turn-1 request that finds two blocks of another
    conversation cached marks them shared; freed, they rank by the table's shared law, the
    rest of the request by its state, each as the client's ``priority`` says."""
    import math

    from kvcast.exporters.kit.adapters.request_state import FixedTable
    from kvcast.exporters.kit.index import SHARED_INTENT

    shared = {"p_continue": shared_p, "median_reuse_s": 5.0, "mu": math.log(5.0), "sigma": 0.5,
              "references": 1000, "lives": 10}  # fmt: skip
    index = PriorityIndex({**DENSITY_TABLE, "shared": shared})
    clock = Clock()
    manager = kv_cache_manager(13)  # 12 usable blocks
    install(manager, FixedTable(index, "density"))._clock = clock
    system = prompt(9, 2)
    first, second = system + prompt(1, 2), system + prompt(2, 2)
    serve(manager, request("a", first, "chitchat"))
    clock.now_s += 1.0
    assert serve(manager, request("b", second, "chitchat"))[1] == 32  # the prompt, cached
    clock.now_s += 1.0
    keys = {
        "prompt": index.priority(SHARED_INTENT, 1, 1.0, 1, policy="density"),
        "a": index.priority("chitchat", 1, 2.0, 1, policy="density"),
        "b": index.priority("chitchat", 1, 1.0, 1, policy="density"),
    }
    lowest = min(keys, key=keys.__getitem__)
    assert (lowest != "prompt") == prompt_kept
    serve(manager, request("new", prompt(4, 8)))  # 6 untagged blocks, then the lowest run
    assert cached_tokens(manager, system) == (32 if prompt_kept else 0)
    if prompt_kept:  # the lowest request's own blocks went, the other's stayed
        gone, kept = (second, first) if lowest == "b" else (first, second)
        assert cached_tokens(manager, gone) == 32 and cached_tokens(manager, kept) == 64
