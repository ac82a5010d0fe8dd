"""The SGLang strategy driving SGLang's eviction loop over a small radix tree."""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from typing import Any

from kvcast.exporters.adapters.sglang import IACStrategy, install, tag_path
from kvcast.exporters.client import TableClient
from kvcast.stats.priority import PriorityIndex


class Node:
    """The TreeNode attributes SGLang's eviction uses (value: one KV index per token)."""

    def __init__(self, name: str, parent: Node | None, tokens: int, cached_at: float) -> None:
        self.name, self.parent = name, parent
        self.children: dict[str, Node] = {}
        self.value = list(range(tokens))
        self.lock_ref = 0
        self.last_access_time = cached_at
        if parent is not None:
            parent.children[name] = self

    def __lt__(self, other: Node) -> bool:  # SGLang's tie-break between equal priorities
        return self.last_access_time < other.last_access_time


class MiniRadixCache:
    """SGLang's ``RadixCache.evict``: heap of evictable leaves, parents pushed once leaves."""

    def __init__(self, strategy: Any) -> None:
        self.root = Node("root", None, 0, 0.0)
        self.root.lock_ref = 1
        self.eviction_strategy = strategy

    def nodes(self) -> list[Node]:
        found, stack = [], [self.root]
        while stack:
            node = stack.pop()
            found.append(node)
            stack.extend(node.children.values())
        return found

    def evict(self, num_tokens: int, now: float) -> list[str]:
        leaves = [n for n in self.nodes() if not n.children and n.lock_ref == 0]
        heap = [(self.eviction_strategy.get_priority(n, now), n) for n in leaves]
        heapq.heapify(heap)
        evicted, freed = [], 0
        while freed < num_tokens and heap:
            _priority, node = heapq.heappop(heap)
            freed += len(node.value)
            evicted.append(node.name)
            del node.parent.children[node.name]
            parent = node.parent
            if not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (self.eviction_strategy.get_priority(parent, now), parent))
        return evicted


def table(**p_override: float) -> dict[str, Any]:
    rows = {("coding", 1): (0.9, 60.0), ("coding", 2): (0.8, 60.0), ("chat", 1): (0.2, 300.0)}
    states = [
        {"intent": i, "turn": t, "p_continue": p_override.get(i, p), "median_reuse_s": m}
        for (i, t), (p, m) in rows.items()
    ]
    return {"version": 1, "defaults": {"p_continue": 0.5, "median_reuse_s": 150.0},
            "states": states}  # fmt: skip


def build(cache: MiniRadixCache) -> None:
    """A shared system prompt; three conversations; a locked request's leaf (t in seconds)."""
    system = Node("system", cache.root, 100, 0.0)  # untagged: the table defaults
    a = Node("A coding t1", system, 200, 0.0)  # past its 60 s median at t=100
    b = Node("B chat t1", system, 300, 50.0)
    c1 = Node("C coding t1", system, 150, 80.0)
    c2 = Node("C coding t2", c1, 120, 90.0)
    d = Node("D chat t1", system, 40, 95.0)
    locked = Node("L running", system, 500, 99.0)
    locked.lock_ref = 1
    tag_path(a, "coding", 1)
    tag_path(b, "chat", 1)
    assert tag_path(c2, "coding", 2) == 3  # the reused turn-1 prefix takes the turn-2 state
    tag_path(d, "chat", 1)
    del system.iac_intent, system.iac_turn  # shared by everyone: back to untagged


def test_iac_eviction_sequence_differs_from_lru() -> None:
    cache = MiniRadixCache(IACStrategy(PriorityIndex(table())))
    build(cache)
    # A is past its median (recency 0) -> first; then the unlikely chat leaves, small first.
    assert cache.evict(250, now=100.0) == ["A coding t1", "D chat t1", "B chat t1"]
    # C2 goes, then its parent C1 becomes a leaf and goes with its turn-2 state.
    assert cache.evict(200, now=100.0) == ["C coding t2", "C coding t1"]
    # The system prompt still has the running request below it: nothing evictable is left.
    assert cache.evict(10_000, now=100.0) == []

    lru = MiniRadixCache(type("LRU", (), {"get_priority": lambda s, n, now: n.last_access_time})())
    build(lru)
    assert lru.evict(250, now=100.0) == ["A coding t1", "B chat t1"]


def test_a_refreshed_table_changes_the_next_eviction() -> None:
    class Source:
        def __init__(self) -> None:
            self.doc: Mapping[str, Any] | None = table()

        def fetch(self) -> Mapping[str, Any] | None:
            doc, self.doc = self.doc, None
            return doc

        def close(self) -> None:
            pass

    source = Source()
    client = TableClient(source, refresh_s=60)
    client.refresh()
    cache = MiniRadixCache(None)
    strategy = install(cache, client)
    assert cache.eviction_strategy is strategy
    build(cache)
    source.doc = {**table(chat=0.95), "version": 2}
    client.refresh()
    # Chat now continues with P = 0.95: the coding leaves (recency 1, P 0.8) go before it.
    assert cache.evict(1, now=100.0) == ["A coding t1"]
    assert cache.evict(1, now=100.0) == ["C coding t2"]


def test_priority_reads_age_size_and_tags() -> None:
    strategy = IACStrategy(PriorityIndex(table()), clock=lambda: 130.0)
    node = Node("n", Node("root", None, 0, 0.0), 64, 100.0)
    assert strategy.get_priority(node) == (1, 0.5, 64)  # untagged: defaults, age 30 < 150
    tag_path(node, "coding", 1)
    assert strategy.get_priority(node) == (1, 0.9, 64)
    assert strategy.get_priority(node, now_time=161.0) == (0, 0.9, 64)
    fifo = IACStrategy(PriorityIndex(table()), clock=lambda: 130.0, time_attr="created")
    node.created = 0.0
    assert fifo.get_priority(node) == (0, 0.9, 64)
