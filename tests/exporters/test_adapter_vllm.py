"""The vLLM-style free-block queue driving a block pool's allocations, frees and evictions."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcast.exporters.adapters.vllm import BlockTag, IACFreeBlockQueue
from kvcast.stats.priority import PriorityIndex

INDEX = PriorityIndex(
    {"version": 1, "defaults": {"p_continue": 0.5, "median_reuse_s": 150.0}, "states": [
        {"intent": "coding", "turn": 1, "p_continue": 0.9, "median_reuse_s": 60.0},
        {"intent": "coding", "turn": 2, "p_continue": 0.8, "median_reuse_s": 60.0},
        {"intent": "chat", "turn": 1, "p_continue": 0.2, "median_reuse_s": 300.0},
    ]}
)  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Block:
    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.block_hash: str | None = None


class BlockPool:
    """vLLM's BlockPool in miniature: allocation pops the queue and drops cached content."""

    def __init__(self, blocks: int, clock: Clock) -> None:
        self.blocks = [Block(i) for i in range(blocks)]
        self.queue = IACFreeBlockQueue(INDEX, self.blocks, clock=clock)
        self.cached: dict[str, Block] = {}
        self.evicted: list[str] = []

    def allocate(self, n: int) -> list[Block]:
        blocks = self.queue.popleft_n(n)
        for block in blocks:
            if block.block_hash is not None:
                self.evicted.append(block.block_hash)
                del self.cached[block.block_hash]
                block.block_hash = None
        return blocks

    def serve(self, name: str, intent: str, turn: int, n: int) -> list[Block]:
        """A request that reuses its cached blocks, allocates the rest, and frees all."""
        hit = [self.cached[f"{name}-{k}"] for k in range(n) if f"{name}-{k}" in self.cached]
        for block in hit:
            self.queue.remove(block)  # a cache hit takes the block out of the free queue
        new = self.allocate(n - len(hit))
        blocks = hit + new
        for k, block in enumerate(blocks):
            block.block_hash = f"{name}-{k}"
            self.cached[block.block_hash] = block
        tags = [BlockTag(intent, turn, size_tokens=16 * n, position=k) for k in range(n)]
        self.queue.append_n(reversed(blocks), reversed(tags))  # vLLM frees tail first
        return blocks


def test_eviction_sequence_follows_iac_not_lru() -> None:
    clock = Clock()
    pool = BlockPool(12, clock)
    pool.serve("r1", "coding", 1, 4)  # freed at t=0, median 60 s
    clock.now = 10.0
    pool.serve("r2", "chat", 1, 3)  # freed at t=10, median 300 s, P = 0.2
    clock.now = 20.0
    pool.serve("r3", "coding", 2, 3)  # freed at t=20, median 60 s, P = 0.8
    assert pool.queue.num_free_blocks == 12 and pool.evicted == []
    # At t=30 everything is within its median: the least likely to continue goes first,
    # each chain tail first. (LRU would take r1, the least recently freed.)
    clock.now = 30.0
    assert [b.block_hash for b in pool.queue.get_all_free_blocks()][2:6] == [
        "r2-2", "r2-1", "r2-0", "r3-2"
    ]  # fmt: skip
    # At t=100 both coding requests are past their 60 s median: evicted before chat, and
    # r3 (P = 0.8) before r1 (P = 0.9). The two never-used blocks go first.
    clock.now = 100.0
    pool.allocate(5)
    assert pool.evicted == ["r3-2", "r3-1", "r3-0"]
    pool.allocate(2)
    assert pool.evicted[3:] == ["r1-3", "r1-2"]
    # r2 comes back (turn 2 of the chat): its blocks are hits, taken out of the queue.
    clock.now = 110.0
    reused = pool.serve("r2", "chat", 1, 3)
    assert {b.block_hash for b in reused} == {"r2-0", "r2-1", "r2-2"}
    assert len(pool.evicted) == 5  # all hits: nothing else evicted
    order = [b.block_hash for b in pool.queue.get_all_free_blocks()]
    assert order == ["r1-1", "r1-0", "r2-2", "r2-1", "r2-0"]
    pool.allocate(3)
    assert pool.evicted[5:] == ["r1-1", "r1-0", "r2-2"]


def test_queue_errors_and_membership() -> None:
    queue = IACFreeBlockQueue(INDEX, [Block(0)], clock=Clock())
    block = queue.popleft()
    assert block not in queue
    with pytest.raises(ValueError, match="no free blocks"):
        queue.popleft()
    queue.append(block, BlockTag("chat", 1, 16))
    with pytest.raises(ValueError, match="already free"):
        queue.append(block)
    with pytest.raises(ValueError, match="2 blocks requested"):
        queue.popleft_n(2)
    queue.remove(block)
    with pytest.raises(KeyError):
        queue.remove(block)
    block.iac_tag = BlockTag("coding", 1, 16)  # the tag may travel on the block itself
    queue.append(block)
    assert queue.evict(1) == [block] and len(queue) == 0


def test_heaps_stay_bounded_under_churn() -> None:
    clock = Clock()
    blocks = [Block(i) for i in range(50)]
    queue = IACFreeBlockQueue(INDEX, clock=clock)
    for step in range(5_000):
        clock.now = step * 0.5
        block = blocks[step % 50]
        if block in queue:
            queue.remove(block) if step % 3 else queue.popleft()
        else:
            queue.append(block, BlockTag("coding", 1 + step % 2, 16, step % 4))
    stored = len(queue._fresh) + len(queue._stale) + len(queue._deadlines) + len(queue._plain)
    assert stored <= 4 * len(queue) + 2 * 64


def reference_order(entries: dict[int, tuple[Any, ...]], now: float) -> list[int]:
    """Brute force: untagged FIFO first, then (recency bit, p, size, -position, freed_at)."""

    def key(block_id: int) -> tuple[Any, ...]:
        seq, tag, freed_at = entries[block_id]
        if tag is None:
            return (0, seq)
        median_s, p = INDEX.state(tag.intent, tag.turn)
        recent = 0 if freed_at + median_s <= now else 1  # the queue's float arithmetic
        return (1, recent, p, tag.size_tokens, -tag.position, freed_at, seq)

    return sorted(entries, key=key)


tags = st.one_of(
    st.none(),
    st.builds(BlockTag, st.sampled_from(["coding", "chat", "other"]), st.integers(1, 3),
              st.sampled_from([16, 64]), st.integers(0, 3)),
)  # fmt: skip
ops = st.lists(
    st.tuples(st.sampled_from(["append", "remove", "pop"]), st.integers(0, 9), tags,
              st.floats(0, 400)),
    max_size=80,
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(ops)
def test_popleft_matches_a_brute_force_order(steps: list[tuple[str, int, Any, float]]) -> None:
    clock = Clock()
    blocks = [Block(i) for i in range(10)]
    queue = IACFreeBlockQueue(INDEX, clock=clock)
    entries: dict[int, tuple[Any, ...]] = {}
    seq = 0
    for op, block_id, tag, advance in steps:
        clock.now += advance
        if op == "append" and block_id not in entries:
            seq += 1
            queue.append(blocks[block_id], tag)
            entries[block_id] = (seq, tag, clock.now)
        elif op == "remove" and block_id in entries:
            queue.remove(blocks[block_id])
            del entries[block_id]
        elif op == "pop" and entries:
            expected = reference_order(entries, clock.now)
            assert [b.block_id for b in queue.get_all_free_blocks()] == expected
            assert queue.popleft().block_id == expected[0]
            del entries[expected[0]]
    assert sorted(b.block_id for b in queue.get_all_free_blocks()) == sorted(entries)
