"""The one cache of table states both engine adapters read (kvcast.exporters.kit.adapters.
state_values): one object per state, valued once per table, revalued when the table changes,
bounded whatever intents requests send."""

from __future__ import annotations

from typing import Any

from kvcast.exporters.kit.adapters.request_state import FixedTable
from kvcast.exporters.kit.adapters.state_values import StateCache, StateValues
from kvcast.exporters.kit.index import PriorityIndex

TABLE: dict[str, Any] = {
    "version": 1,
    "max_turn": 4,
    "defaults": {"p_continue": 0.5, "median_reuse_s": 150.0},
    "states": [
        {"intent": "coding", "turn": 1, "p_continue": 0.9, "median_reuse_s": 30.0},
        {"intent": "coding", "turn": 4, "p_continue": 0.2, "median_reuse_s": 90.0},
    ],
}


def cache(density: bool = False, **options: Any) -> tuple[FixedTable, StateCache[StateValues]]:
    table = FixedTable(PriorityIndex(TABLE))
    return table, StateCache(table, StateValues, density=density, **options)


def test_a_state_is_valued_from_the_table_and_shared_by_every_request_of_it() -> None:
    _table, states = cache()
    found = states.get("coding", 1)
    assert (found.state, found.median_s, found.p) == (("coding", 1), 30.0, 0.9)
    assert states.get("coding", 1) is found
    unlisted = states.get("travel", 2)
    assert (unlisted.state, unlisted.median_s, unlisted.p) == (("travel", 2), 150.0, 0.5)


def test_turns_past_the_tables_max_turn_share_its_state() -> None:
    _table, states = cache()
    deep = states.get("coding", 9)
    assert deep is states.get("coding", 4) and deep.state == ("coding", 4)
    assert (deep.median_s, deep.p) == (90.0, 0.2)
    assert len(states) == 1


def test_density_values_are_the_index_curve_and_its_drops() -> None:
    table, states = cache(density=True)
    found = states.get("coding", 1)
    curve = table.index.curve("coding", 1)
    assert found.curve == curve.values and found.drop == curve.drops()
    _table, iac = cache()
    assert iac.get("coding", 1).curve == []  # iac reads no curve


def test_a_new_table_revalues_every_state_before_it_is_read() -> None:
    changes: list[int] = []
    table = FixedTable(PriorityIndex(TABLE))
    states = StateCache(
        table, StateValues, density=False, changed=lambda: changes.append(len(states))
    )
    old = states.get("coding", 1)
    assert changes == [0]  # the first table
    table.index = PriorityIndex(
        {**TABLE, "version": 2, "states": [
            {"intent": "coding", "turn": 1, "p_continue": 0.4, "median_reuse_s": 12.0}]}
    )  # fmt: skip
    again = states.get("coding", 1)
    assert again is old and (again.median_s, again.p) == (12.0, 0.4)
    assert changes == [0, 1]
    assert states.sync() is table.index and changes == [0, 1]  # unchanged: no revaluing


def test_added_sees_each_new_state_once_valued() -> None:
    seen: list[tuple[Any, float]] = []
    table = FixedTable(PriorityIndex(TABLE))
    states = StateCache(
        table, StateValues, density=False, added=lambda v: seen.append((v.state, v.p))
    )
    states.get("coding", 1)
    states.get("coding", 1)
    states.get("chat", 3)
    assert seen == [(("coding", 1), 0.9), (("chat", 3), 0.5)]


def test_unlisted_states_past_the_bound_share_the_defaults_and_listed_ones_never_do() -> None:
    _table, states = cache(max_states=3)
    own = [states.get(f"junk-{k}", 1) for k in range(3)]
    assert [v.state for v in own] == [("junk-0", 1), ("junk-1", 1), ("junk-2", 1)]
    shared = states.get("junk-3", 1)
    assert shared.state is None and (shared.median_s, shared.p) == (150.0, 0.5)
    assert all(states.get(f"junk-{k}", 1) is shared for k in range(4, 40))
    listed = states.get("coding", 1)
    assert listed.state == ("coding", 1) and listed.p == 0.9
    assert len(states) == 3 + 1 + 1


def test_requested_pairs_are_remembered_up_to_their_bound() -> None:
    _table, states = cache(max_requested=2)
    for turn in range(1, 10):  # all capped to turn 4 above it: one state, nine requests
        states.get("chat", turn)
    assert len(states._requested) == 2
    assert len(states) == 4  # chat 1..4
