"""The IAC priority over a table: ordering, state lookup, defaults, validation, speed."""

from __future__ import annotations

import time

import pytest

from kvcast.stats.priority import PriorityIndex, TableError


def table(*states: tuple[str, int, float, float], **extra: object) -> dict[str, object]:
    """A SPEC 5 document from (intent, turn, p_continue, median_reuse_s) rows."""
    rows = [
        {"intent": i, "turn": t, "p_continue": p, "median_reuse_s": m, "mu": None,
         "sigma": None, "conversations": 10, "delay_samples": 5}
        for i, t, p, m in states
    ]  # fmt: skip
    doc = {"version": 4, "generated_at": 100.0, "window_conversations": 10,
           "defaults": {"p_continue": 0.5, "median_reuse_s": 150.0}, "states": rows}  # fmt: skip
    return {**doc, **extra}


INDEX = PriorityIndex(
    table(("coding", 1, 0.9, 60.0), ("coding", 2, 0.7, 30.0), ("chat", 1, 0.2, 400.0),
          ("chat", 32, 0.6, 90.0), ("chat", 5, 0.0, 200.0))
)  # fmt: skip


def test_priority_is_recency_then_continuation_then_size() -> None:
    assert INDEX.priority("coding", 1, 10.0, 100) == (1, 0.9, 100)
    assert INDEX.priority("coding", 1, 60.0, 100) == (0, 0.9, 100)  # age == M: past it
    assert INDEX.priority("chat", 1, 399.0, 7) == (1, 0.2, 7)
    # Lowest first: past the median beats everything, then P, then size.
    nodes = {
        "old-likely": ("coding", 1, 100.0, 5000),
        "young-unlikely": ("chat", 1, 1.0, 5000),
        "young-likely-small": ("coding", 1, 1.0, 10),
        "young-likely-big": ("coding", 1, 1.0, 9000),
        "old-unlikely": ("chat", 1, 1000.0, 9000),
    }
    order = sorted(nodes, key=lambda name: INDEX.priority(*nodes[name]))
    assert order == [
        "old-unlikely",
        "old-likely",
        "young-unlikely",
        "young-likely-small",
        "young-likely-big",
    ]


def test_rank_returns_eviction_order_and_is_stable() -> None:
    candidates = [("coding", 1, 1.0, 10), ("chat", 1, 1.0, 10), ("coding", 1, 1.0, 10)]
    assert INDEX.rank(candidates) == [1, 0, 2]
    assert INDEX.rank([]) == []


def test_turns_above_max_turn_share_its_state_and_unlisted_states_get_defaults() -> None:
    assert INDEX.max_turn == 32
    assert INDEX.state("chat", 32) == (90.0, 0.6)
    assert INDEX.state("chat", 33) == (90.0, 0.6)
    assert INDEX.state("chat", 500) == (90.0, 0.6)
    # Turn 7 is below the cap and not listed: the defaults, not the highest listed turn below
    # it (chat turn 5 has P = 0 because no conversation of the window went further).
    assert INDEX.state("chat", 7) == (150.0, 0.5)
    assert INDEX.state("coding", 40) == (150.0, 0.5)  # coding has no state at the cap
    assert INDEX.state("travel", 1) == (150.0, 0.5)
    assert INDEX.state(None, 0) == (150.0, 0.5)  # type: ignore[arg-type]
    assert INDEX.priority("travel", 3, 149.0, 64) == (1, 0.5, 64)


def test_max_turn_from_the_document_or_the_caller() -> None:
    doc = table(("chat", 8, 0.3, 50.0), max_turn=8)
    assert PriorityIndex(doc).state("chat", 12) == (50.0, 0.3)
    assert PriorityIndex(doc, max_turn=32).state("chat", 12) == (150.0, 0.5)


def test_defaults_come_from_the_table() -> None:
    doc = table(("chat", 1, 0.3, 50.0))
    doc["defaults"] = {"p_continue": 0.25, "median_reuse_s": 20.0}
    index = PriorityIndex(doc)
    assert index.state("other", 1) == (20.0, 0.25)
    empty = PriorityIndex(None)
    assert (empty.version, len(empty), empty.state("x", 1)) == (None, 0, (150.0, 0.5))


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(version="7"), "version"),
        (lambda d: d.update(states={"a": 1}), "states must be a list"),
        (lambda d: d["states"][0].update(p_continue=1.5), "p_continue"),
        (lambda d: d["states"][0].update(p_continue=None), "p_continue"),
        (lambda d: d["states"][0].update(median_reuse_s=0), "median_reuse_s"),
        (lambda d: d["states"][0].update(median_reuse_s=float("inf")), "median_reuse_s"),
        (lambda d: d["states"][0].update(turn=0), "turn"),
        (lambda d: d["states"][0].update(turn=True), "turn"),
        (lambda d: d["states"][0].update(intent=3), "intent"),
        (lambda d: d.update(defaults={"p_continue": -1}), "p_continue"),
    ],
)
def test_malformed_tables_are_rejected(mutate, message: str) -> None:
    doc = table(("chat", 1, 0.3, 50.0))
    mutate(doc)
    with pytest.raises(TableError, match=message):
        PriorityIndex(doc)


def test_a_priority_costs_about_a_dictionary_lookup() -> None:
    """Relative to a bare dict lookup timed in the same run (robust to slow machines)."""
    index = PriorityIndex(
        table(*[(f"i{i}", t, 0.5, 60.0) for i in range(31) for t in range(1, 33)])
    )
    keys = [(f"i{i % 31}", 1 + i % 32, float(i % 120), 512) for i in range(50_000)]
    lookup = index.states()

    def best(run) -> float:
        times = []
        for _ in range(5):
            started = time.perf_counter()
            run()
            times.append(time.perf_counter() - started)
        return min(times) / len(keys)

    def priorities() -> None:
        priority = index.priority
        for intent, turn, age, size in keys:
            priority(intent, turn, age, size)

    def lookups() -> None:
        get = lookup.get
        for intent, turn, _age, _size in keys:
            get((intent, turn))

    per_priority, per_lookup = best(priorities), best(lookups)
    assert per_priority < 8 * per_lookup, (per_priority, per_lookup)
