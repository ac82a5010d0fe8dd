"""The SGLang strategy's ranking and tags, on the node fields it reads (SGLang not installed).

What a node must offer is ``parent`` (None at the root), ``key`` (sized: its tokens) and
``last_access_time``; against SGLang's real caches and release path the adapter is tested in
``tests/engines/test_sglang_adapter.py``.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvcast.exporters.kit.adapters.sglang import TAG_ATTR, IACStrategy, request_state
from kvcast.exporters.kit.index import PriorityIndex

TABLE = {
    "version": 1,
    "defaults": {"p_continue": 0.5, "median_reuse_s": 150.0},
    "states": [
        {"intent": "coding", "turn": 1, "p_continue": 0.9, "median_reuse_s": 60.0},
        {"intent": "chat", "turn": 1, "p_continue": 0.2, "median_reuse_s": 300.0},
    ],
    "max_turn": 4,
}


class Node:
    def __init__(self, parent: Node | None, tokens: int, last_access_time: float) -> None:
        self.parent, self.key, self.last_access_time = parent, list(range(tokens)), last_access_time


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Table:
    def __init__(self, document: dict[str, Any]) -> None:
        self.index = PriorityIndex(document)


def path(depth: int) -> list[Node]:
    """root, then ``depth`` nodes below it; the deepest last."""
    nodes = [Node(None, 0, 0.0)]
    for level in range(depth):
        nodes.append(Node(nodes[-1], 10 * (level + 1), float(level)))
    return nodes


def test_untagged_nodes_keep_sglangs_lru_order_ahead_of_every_tagged_one() -> None:
    strategy = IACStrategy(PriorityIndex(TABLE), clock=Clock(100.0))
    _root, old, new = path(2)
    tagged = Node(_root, 5, -10.0)
    strategy.tag(tagged, "chat", 1, released_at=0.0)  # long past its median, least likely
    keys = sorted([new, old, tagged], key=strategy.get_priority)
    assert keys == [old, new, tagged]
    assert strategy.get_priority(old) == (-1, 0.0)


def test_tagged_nodes_rank_by_the_iac_tuple_with_age_from_their_release() -> None:
    clock = Clock(100.0)
    strategy = IACStrategy(PriorityIndex(TABLE), clock=clock)
    _root, node = path(1)
    strategy.tag(node, "coding", 1)  # released at 100 s
    clock.now = 159.0
    assert strategy.get_priority(node) == (1, 0.9, 10)  # 59 s < the 60 s median
    clock.now = 160.5
    assert strategy.get_priority(node) == (0, 0.9, 10)
    strategy.tag(node, "travel", 2)  # unlisted: the table's defaults
    assert strategy.get_priority(node) == (1, 0.5, 10)
    assert PriorityIndex(TABLE).priority("coding", 1, 60.5, 10) == (0, 0.9, 10)


def test_a_tag_covers_the_path_to_the_root_and_none_clears_it() -> None:
    strategy = IACStrategy(PriorityIndex(TABLE), clock=Clock(0.0))
    nodes = path(3)
    assert strategy.tag(nodes[-1], "coding", 1) == 3
    assert not hasattr(nodes[0], TAG_ATTR)  # the root is never a candidate
    assert all(getattr(n, TAG_ATTR) is not None for n in nodes[1:])
    assert strategy.tag(nodes[-1], None, 0) == 3
    assert [strategy.get_priority(n)[0] for n in nodes[1:]] == [-1, -1, -1]


def test_turns_past_the_tables_max_turn_share_its_state() -> None:
    doc = {**TABLE, "states": [*TABLE["states"],
           {"intent": "coding", "turn": 4, "p_continue": 0.7, "median_reuse_s": 60.0}]}  # fmt: skip
    strategy = IACStrategy(PriorityIndex(doc), clock=Clock(0.0))
    _root, node = path(1)
    strategy.tag(node, "coding", 9)
    assert strategy.get_priority(node) == (1, 0.7, 10)


def test_a_refreshed_table_revalues_nodes_tagged_before_it() -> None:
    table = Table(TABLE)
    strategy = IACStrategy(table, clock=Clock(0.0))
    _root, node = path(1)
    strategy.tag(node, "chat", 1)
    assert strategy.get_priority(node)[1] == 0.2
    refreshed = {**TABLE, "version": 2, "states": [
        {"intent": "chat", "turn": 1, "p_continue": 0.95, "median_reuse_s": 300.0}]}  # fmt: skip
    table.index = PriorityIndex(refreshed)
    assert strategy.get_priority(node)[1] == 0.95


def test_states_are_bounded_whatever_intents_requests_send(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvcast.exporters.kit.adapters.state_values as state_values

    monkeypatch.setattr(state_values, "MAX_STATES", 8)
    strategy = IACStrategy(PriorityIndex(TABLE), clock=Clock(0.0))
    _root, node = path(1)
    for k in range(50):
        strategy.tag(node, f"junk-{k}", 1)
    strategy.tag(node, "coding", 1)  # a state the table lists still gets its own values
    # 8 states of their own, the defaults' one the rest share, and the listed state
    assert len(strategy._states) == 8 + 1 + 1
    assert strategy._states.get("junk-49", 1).state is None
    assert strategy.get_priority(node) == (1, 0.9, 10)


@pytest.mark.parametrize(
    ("custom_params", "state"),
    [
        ({"kvcast_intent": "coding", "kvcast_turn": 3}, ("coding", 3)),
        ({"kvcast_intent": "coding", "kvcast_turn": "2"}, ("coding", 2)),
        ({"kvcast_intent": "coding"}, ("coding", 1)),
        ({"kvcast_intent": "coding", "kvcast_turn": 0}, (None, 0)),
        ({"kvcast_intent": "coding", "kvcast_turn": True}, (None, 0)),
        ({"kvcast_turn": 2}, (None, 0)),
        (None, (None, 0)),
    ],
)
def test_request_state_reads_sglangs_custom_params(custom_params: Any, state: Any) -> None:
    class Params:
        def __init__(self) -> None:
            self.custom_params = custom_params

    class Req:
        sampling_params = Params()

    assert request_state(Req()) == state


DENSITY_TABLE = {
    **TABLE,
    "characteristic_time_s": 120.0,
    "states": [
        {**TABLE["states"][0], "mu": 4.0943445622221, "sigma": 0.8, "conversations": 30},
        {**TABLE["states"][1], "mu": 5.703782474656201, "sigma": 1.4, "conversations": 30},
    ],
}


def test_density_strategy_ranks_by_the_clients_density_key() -> None:
    """With a client ranking by density, a tagged node's key is the client's
    ``priority(..., policy="density")`` (after the untagged nodes, which keep SGLang's LRU)."""
    clock = Clock(1000.0)
    live = Table(DENSITY_TABLE)
    live.policy = "density"  # type: ignore[attr-defined]
    strategy = IACStrategy(live, clock=clock)
    root = Node(None, 0, 0.0)
    nodes = {
        ("coding", 1, 990.0): Node(root, 40, 0.0),
        ("coding", 1, 100.0): Node(root, 40, 0.0),
        ("chat", 1, 900.0): Node(root, 16, 0.0),
        ("chat", 3, 400.0): Node(root, 8, 0.0),  # unlisted: the defaults' law
    }
    for (intent, turn, released), node in nodes.items():
        strategy.tag(node, intent, turn, released_at=released)
    plain = Node(root, 5, 999.0)
    index = live.index
    for (intent, turn, released), node in nodes.items():
        want = index.priority(intent, turn, 1000.0 - released, len(node.key), policy="density")
        assert strategy.get_priority(node) == (0, *want)
    ranked = sorted([*nodes.values(), plain], key=strategy.get_priority)
    assert ranked[0] is plain
    want_order = sorted(
        nodes, key=lambda k: index.priority(k[0], k[1], 1000.0 - k[2], len(nodes[k].key),
                                            policy="density"))  # fmt: skip
    assert ranked[1:] == [nodes[k] for k in want_order]
    # A refreshed table revalues the tagged states at the next eviction.
    live.index = PriorityIndex({**DENSITY_TABLE, "characteristic_time_s": 3000.0})
    node = nodes[("coding", 1, 990.0)]
    assert strategy.get_priority(node) == (
        0, *live.index.priority("coding", 1, 10.0, 40, policy="density"))  # fmt: skip


SHARED_LAW = {"p_continue": 0.95, "median_reuse_s": 5.0, "mu": 1.6094379124341003,
              "sigma": 0.5, "references": 900, "lives": 40}  # fmt: skip


@pytest.mark.parametrize("policy", ["density", "iac"])
@pytest.mark.parametrize("with_law", [True, False])
def test_nodes_wholly_inside_a_turn_1_hit_rank_by_the_shared_law(
    policy: str, with_law: bool
) -> None:
    """Under density with a table carrying the shared law: the nodes within a turn-1 request's
    cache hit (``shared_tokens``) are marked and take the client's ``SHARED_INTENT`` key,
    also when a later request of another state passes through them; the node the hit ends
    inside of, and the rest, keep the request's state. Otherwise nothing changes."""
    from kvcast.exporters.kit.adapters.sglang import SHARED_ATTR
    from kvcast.exporters.kit.index import SHARED_INTENT

    clock = Clock(1000.0)
    live = Table({**DENSITY_TABLE, "shared": SHARED_LAW if with_law else None})
    live.policy = policy  # type: ignore[attr-defined]
    strategy = IACStrategy(live, clock=clock)
    _, first, second, third = path(3)  # 10, 20 and 30 tokens
    strategy.tag(third, "chat", 1, released_at=990.0, shared_tokens=40)  # ends inside third
    marked = policy == "density"
    assert [n.__dict__.get(SHARED_ATTR, False) for n in (first, second, third)] == [
        marked, marked, False
    ]  # fmt: skip
    strategy.tag(third, "coding", 2, released_at=995.0)  # turn 2: marks stay, retagged
    index = live.index
    for node in (first, second, third):
        shared = marked and with_law and node is not third
        intent, turn = (SHARED_INTENT, 1) if shared else ("coding", 2)
        key = index.priority(intent, turn, 5.0, len(node.key), policy=policy)
        assert strategy.get_priority(node)[-len(key) :] == key
