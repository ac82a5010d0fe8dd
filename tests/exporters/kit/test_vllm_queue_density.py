"""kvcast's vLLM free queue under the ``density`` policy, on the block fields vLLM's
``KVCacheBlock`` gives it (vLLM's own classes drive it in tests/engines): it takes blocks in the
order of the client's ``priority(..., policy="density")``, untagged blocks first, blocks marked
shared by the table's shared law, and keeps a request's blocks in the order vLLM freed them."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcast.exporters.kit.adapters.request_state import FixedTable
from kvcast.exporters.kit.adapters.vllm_queue import IACFreeBlockQueue
from kvcast.exporters.kit.index import SHARED_INTENT, PriorityIndex


class Block:
    __slots__ = ("block_id", "next_free_block", "prev_free_block")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.prev_free_block: Block | None = None
        self.next_free_block: Block | None = None


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Table:
    """A client stand-in whose index can be swapped (a refresh)."""

    policy = "density"

    def __init__(self, index: PriorityIndex) -> None:
        self.index = index


def table(seed: int, horizon_s: float = 90.0) -> PriorityIndex:
    rng = random.Random(seed)
    rows = []
    for intent in ("code", "chat", "plan"):
        for turn in (1, 2, 3):
            median = math.exp(rng.uniform(1.0, 6.5))
            rows.append(
                {"intent": intent, "turn": turn, "p_continue": rng.random(),
                 "median_reuse_s": median, "mu": math.log(median),
                 "sigma": rng.uniform(0.3, 2.0), "conversations": rng.randint(1, 500),
                 "delay_samples": 10}
            )  # fmt: skip
    shared = None
    if seed % 3:  # most tables carry the shared blocks' law
        median = math.exp(rng.uniform(0.0, 5.0))
        shared = {"p_continue": rng.uniform(0.3, 1.0), "median_reuse_s": median,
                  "mu": math.log(median), "sigma": rng.uniform(0.5, 2.0),
                  "references": rng.randint(1, 5000), "lives": rng.randint(0, 500)}  # fmt: skip
    return PriorityIndex(
        {"version": seed, "characteristic_time_s": horizon_s, "states": rows, "shared": shared}
    )


STATES = [(i, t) for i in ("code", "chat", "plan", "unlisted") for t in (1, 2, 3, 7)]


@pytest.mark.parametrize("hits", ["one block", "whole requests"])
@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.lists(st.integers(0, 99), min_size=10, max_size=150))
def test_pops_follow_the_clients_density_order(hits: str, seed: int, script: list[int]) -> None:
    """A cache hit takes one block out of the middle, or (as a prefix hit does) every block of
    a freed request, which can move an end of its state's list."""
    rng = random.Random(seed)
    clock = Clock()
    live = Table(table(seed))
    blocks = [Block(i) for i in range(1200)]
    queue = IACFreeBlockQueue([], table=live, clock=clock)
    queue.reserve(len(blocks))
    freed: dict[int, tuple[tuple[str, int], float]] = {}  # tagged block id -> (state, freed at)
    untagged: set[int] = set()
    requests: list[list[Block]] = []  # tagged requests as freed
    fresh = iter(blocks)
    for step in script:
        clock.now += rng.expovariate(1 / 30)
        if step < 45:  # free a request, tail first as vLLM does, mostly tagged
            request = [next(fresh) for _ in range(rng.randint(1, 6))]
            if step < 40:
                state = rng.choice(STATES)
                # a turn-1 request's hit marks its leading blocks shared (as vLLM's lookup does)
                marked = rng.choice((0, 0, 1, len(request)))
                queue.mark_shared([request[:marked]])
                with queue.tagging(*state):
                    queue.append_n(list(reversed(request)))
                shared_state = (SHARED_INTENT, 1) if live.index.has_shared else state
                freed.update(
                    (b.block_id, (shared_state if k < marked else state, clock.now))
                    for k, b in enumerate(request)
                )
                requests.append(request)
            else:
                queue.append_n(list(reversed(request)))
                untagged.update(b.block_id for b in request)
        elif step < 60 and freed:  # a cache hit
            if hits == "one block":
                victims = [blocks[rng.choice(sorted(freed))]]
            else:
                request = rng.choice([r for r in requests if any(b.block_id in freed for b in r)])
                victims = [b for b in request if b.block_id in freed]
            for victim in victims:
                queue.remove(victim)
                del freed[victim.block_id]
        elif step < 63:  # a refreshed table revalues every state
            live.index = table(seed + step, horizon_s=rng.choice((60.0, 600.0)))
        elif queue.num_free_blocks:
            order = queue.get_all_free_blocks()
            n = min(queue.num_free_blocks, rng.randint(1, 8))
            got = queue.popleft_n(n)
            assert got == order[:n]
            index = live.index
            keys = [
                index.priority(*freed[b.block_id][0], clock.now - freed[b.block_id][1], 1,
                               policy="density")
                for b in order if b.block_id in freed
            ]  # fmt: skip
            assert keys == sorted(keys)  # lowest density first, ties oldest first
            ahead = [b.block_id in untagged for b in order]
            assert ahead == sorted(ahead, reverse=True)  # untagged blocks go first
            for b in got:
                freed.pop(b.block_id, None)
                untagged.discard(b.block_id)
        assert queue.num_free_blocks == len(freed) + len(untagged)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 10_000),
    st.sampled_from(STATES),
    st.sampled_from(STATES),
    st.lists(st.floats(0.0, 20_000.0), min_size=3, max_size=3),
)
def test_a_hit_on_a_lists_oldest_run_is_seen_by_the_very_next_pop(
    seed: int, state: tuple[str, int], other: tuple[str, int], gaps: list[float]
) -> None:
    """The queue revalues a list's ends lazily, when an end's age bucket changes value; a
    cache hit that takes the oldest run must revalue them itself, or a pop in the same instant
    takes the next run at the value of the one that left."""
    clock = Clock()
    live = Table(table(seed))
    queue = IACFreeBlockQueue([], table=live, clock=clock)
    queue.reserve(3)
    oldest, newer, elsewhere = Block(0), Block(1), Block(2)
    freed = {}
    for block, tagged, gap in ((oldest, state, 0.0), (elsewhere, other, gaps[0]),
                               (newer, state, gaps[1])):  # fmt: skip
        clock.now += gap
        with queue.tagging(*tagged):
            queue.append_n([block])
        freed[block.block_id] = (tagged, clock.now)
    clock.now += gaps[2]
    queue._order.pop(0, [], clock.now)  # what a pop revalues first: nothing due at this instant
    queue.remove(oldest)
    del freed[oldest.block_id]
    got = queue.popleft_n(2)
    keys = [
        live.index.priority(*freed[b.block_id][0], clock.now - freed[b.block_id][1], 1,
                            policy="density")
        for b in got
    ]  # fmt: skip
    assert keys == sorted(keys)


def test_a_request_leaves_in_the_order_vllm_freed_it() -> None:
    clock = Clock()
    index = table(1)
    queue = IACFreeBlockQueue([], table=FixedTable(index, "density"), clock=clock)
    old = [Block(i) for i in range(4)]
    new = [Block(i) for i in range(4, 8)]
    queue.reserve(8)
    with queue.tagging("chat", 1):
        queue.append_n(list(reversed(old)))  # a chain, freed tail first
    clock.now = 50.0
    with queue.tagging("chat", 1):
        queue.append_n(list(reversed(new)))
    clock.now = 80.0
    first, second = sorted(
        [old, new], key=lambda req: index.priority("chat", 1, clock.now - (0.0 if req is old
                                                   else 50.0), 1, policy="density"))  # fmt: skip
    assert queue.popleft_n(8) == list(reversed(first)) + list(reversed(second))


def test_iac_queue_is_unchanged_by_the_density_code() -> None:
    """A bare index (no policy) ranks by IAC: past the median first."""
    clock = Clock()
    index = PriorityIndex({"version": 1, "states": [
        {"intent": "a", "turn": 1, "p_continue": 0.9, "median_reuse_s": 10.0},
        {"intent": "b", "turn": 1, "p_continue": 0.1, "median_reuse_s": 1000.0}]})  # fmt: skip
    queue = IACFreeBlockQueue([], table=index, clock=clock)
    a, b = Block(0), Block(1)
    queue.reserve(2)
    with queue.tagging("b", 1):
        queue.append_n([b])
    with queue.tagging("a", 1):
        queue.append_n([a])
    clock.now = 20.0
    assert queue.popleft_n(2) == [a, b]  # a is past its median, b is not


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="policy"):
        FixedTable(PriorityIndex(None), "lru")


def test_a_shared_mark_lasts_until_the_block_is_handed_out_for_other_content() -> None:
    """Marked blocks go to the shared law's list; once popped (given to another request's new
    content) the mark is gone, and the block's next free puts it under its request's state."""
    clock = Clock()
    index = table(1)  # carries a shared law
    assert index.has_shared
    queue = IACFreeBlockQueue([], table=FixedTable(index, "density"), clock=clock)
    queue.reserve(4)
    prompt, own = [Block(0), Block(1)], [Block(2), Block(3)]
    queue.mark_shared([prompt])
    with queue.tagging("chat", 1):
        queue.append_n(list(reversed(prompt + own)))  # tail first: own blocks, then the prompt
    lists = queue._states.states()
    assert set(lists) == {("chat", 1), (SHARED_INTENT, 1)}
    assert [queue.state_of(b) for b in prompt + own] == [(SHARED_INTENT, 1)] * 2 + [("chat", 1)] * 2
    assert sorted(b.block_id for b in queue.popleft_n(4)) == [0, 1, 2, 3]
    with queue.tagging("code", 2):
        queue.append_n(list(reversed(prompt)))  # the same blocks, holding new content
    assert [queue.state_of(b) for b in prompt] == [("code", 2)] * 2


def test_without_a_shared_law_marked_blocks_stay_with_their_requests_state() -> None:
    index = table(3)  # no shared law
    assert not index.has_shared
    queue = IACFreeBlockQueue([], table=FixedTable(index, "density"), clock=Clock())
    queue.reserve(2)
    blocks = [Block(0), Block(1)]
    queue.mark_shared([blocks])
    with queue.tagging("chat", 1):
        queue.append_n(list(reversed(blocks)))
    assert [queue.state_of(b) for b in blocks] == [("chat", 1)] * 2


def test_an_iac_queue_keeps_no_marks() -> None:
    queue = IACFreeBlockQueue([], table=table(1), clock=Clock())
    queue.reserve(2)
    blocks = [Block(0), Block(1)]
    queue.mark_shared([blocks])  # Eq. 1 knows no shared state
    with queue.tagging("chat", 1):
        queue.append_n(list(reversed(blocks)))
    assert [queue.state_of(b) for b in blocks] == [("chat", 1)] * 2


def test_state_of_names_the_list_a_free_block_waits_in() -> None:
    queue = IACFreeBlockQueue([Block(0)], table=FixedTable(table(3), "density"), clock=Clock())
    queue.reserve(4)
    tagged = [Block(1), Block(2), Block(3)]
    with queue.tagging("plan", 2):
        queue.append_n(tagged)
    assert [queue.state_of(b) for b in tagged] == [("plan", 2)] * 3
    with pytest.raises(KeyError, match="block 0 waits in no state's list"):
        queue.state_of(queue.fake_free_list_head.next_free_block)  # untagged
    taken = queue.popleft_n(2)  # the untagged block, then the run's first
    with pytest.raises(KeyError, match="block 1 waits in no state's list"):
        queue.state_of(taken[1])  # no longer free
    assert [queue.state_of(b) for b in tagged[1:]] == [("plan", 2)] * 2
