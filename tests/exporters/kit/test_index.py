"""The IAC priority over a table: ordering, state lookup, defaults, validation, speed."""

from __future__ import annotations

import contextlib
import math
import random
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvcast.exporters.kit.ranking as ranking
from kvcast.exporters.kit.ages import AGE_BUCKETS, FIRST_AGES, age_bucket, bucket_start
from kvcast.exporters.kit.checks import TableError
from kvcast.exporters.kit.index import PriorityIndex


def table(*states: tuple[str, int, float, float], **extra: object) -> dict[str, object]:
    """A SPEC section 5 document from (intent, turn, p_continue, median_reuse_s) rows."""
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
        (lambda d: d.update(shared=[0.5]), "shared must be an object or null"),
        (lambda d: d.update(shared={"p_continue": 2.0, "median_reuse_s": 5.0}),
         "shared: p_continue must be in"),
        (lambda d: d.update(shared={"p_continue": 0.9, "median_reuse_s": -1}),
         "shared: median_reuse_s"),
        (lambda d: d.update(shared={"p_continue": 0.9, "median_reuse_s": 5.0, "lives": -3}),
         "shared: lives must be an int"),
        (lambda d: d.update(shared={"p_continue": 0.9, "median_reuse_s": 5.0, "sigma": "x"}),
         "shared: sigma"),
    ],
)  # fmt: skip
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


# -- the density rankings against a straightforward reference ------------------------------------

DENSITY_INDEX = PriorityIndex(
    {**table(("coding", 1, 0.9, 60.0), ("coding", 2, 0.7, 30.0), ("chat", 1, 0.2, 400.0),
             ("chat", 32, 0.6, 90.0), ("chat", 5, 0.0, 200.0), ("math", 3, 0.99, 5.0)),
     "characteristic_time_s": 240.0}
)  # fmt: skip
STATES = [("coding", 1), ("coding", 2), ("chat", 1), ("chat", 32), ("chat", 40), ("chat", 5),
          ("math", 3), ("travel", 4), ("coding", 0), ("coding", -3)]  # fmt: skip
SCALE = 8 / math.log(2.0)  # PER_OCTAVE buckets per doubling of 1 + age
LAST = 8 * 31 - 1  # AGE_BUCKETS - 1


def reference_bucket(age: float) -> int:
    """The bucket of an age as ``age_bucket`` defines it: ``floor(8 log2(1 + a))`` through
    ``log1p``, 0 at or below 0 and for NaN, the last bucket past the grid."""
    if not age > 0.0:
        return 0
    return min(int(math.log1p(age) * SCALE), LAST)


def reference_columns(
    curves: list[list[float]], ages: list[float], sizes: list[float] | None = None
) -> list[int]:
    keys = [curve[reference_bucket(age)] for curve, age in zip(curves, ages, strict=True)]
    if sizes is not None:
        keys = [key / size for key, size in zip(keys, sizes, strict=True)]
    return sorted(range(len(keys)), key=keys.__getitem__)


def reference_tuples(index: PriorityIndex, candidates: list[tuple[str, int, float, float]]):
    keys = [
        (index.curve(intent, turn).values[reference_bucket(age)] / size, -age)
        for intent, turn, age, size in candidates
    ]
    return sorted(range(len(keys)), key=keys.__getitem__)


@contextlib.contextmanager
def without_numpy() -> Iterator[None]:
    """The rankings as an engine without numpy runs them (the pure-Python way)."""
    saved, ranking.fast = ranking.fast, lambda: None
    try:
        yield
    finally:
        ranking.fast = saved


STARTS = list(FIRST_AGES[1:])  # what the numpy ranking searches in
# Ages where the bucket turns (exactly, and as bucket_start says), and one float to each side:
# an off-by-one shows there.
TURNS_AT = STARTS + [bucket_start(k) for k in range(AGE_BUCKETS)]
EDGES = sorted(
    {x for s in TURNS_AT for x in (math.nextafter(s, -1.0), s, math.nextafter(s, 2**40))}
)
AGES = st.one_of(
    st.floats(0.0, 5_000.0),
    st.floats(0.0, 1e12),
    st.sampled_from(EDGES),
    st.sampled_from(
        [0.0, -0.0, -0.5, -1.0, -7.0, -math.inf, 2.0**31 - 1, 2.0**31, 1e15, 1e300, 5e-324]
    ),
    st.integers(0, 10**6),
)
SIZES = st.one_of(
    st.sampled_from([1, 16, 16.0, 1e-320, -4.0]), st.integers(1, 8192), st.floats(0.5, 1e4)
)
CANDIDATE = st.tuples(st.sampled_from(STATES), AGES, SIZES)


def test_bucket_starts_are_where_age_bucket_turns() -> None:
    assert len(STARTS) == AGE_BUCKETS - 1
    assert FIRST_AGES[0] == 0.0
    assert sorted(STARTS) == STARTS
    for k, start in enumerate(STARTS, 1):
        assert age_bucket(start) == k, k
        assert age_bucket(math.nextafter(start, -math.inf)) == k - 1, k
        assert abs(start - bucket_start(k)) <= 1e-9 * (1 + start)


def test_column_ranking_buckets_every_edge_age_as_age_bucket() -> None:
    """Every bucket start, the float below and above it, 0, negatives, NaN and ages past the
    grid: on a curve whose value is the bucket, each such candidate must rank between two
    anchors valued its expected bucket -/+ 0.5, which an age given a neighbouring bucket
    would not."""
    ages = [0.0, -0.0, -3.0, float("nan"), 5e-324, 2.0**31, 1e15, 1e300, *EDGES]
    expected = [reference_bucket(age) for age in ages]
    assert expected == [age_bucket(age) for age in ages]
    identity = [float(k) for k in range(AGE_BUCKETS)]
    for chunk in range(0, len(ages), 300):
        part, want = ages[chunk : chunk + 300], expected[chunk : chunk + 300]
        curves = [identity] * len(part)
        curves += [[k - 0.5] * AGE_BUCKETS for k in want] + [[k + 0.5] * AGE_BUCKETS for k in want]
        column = part + [0.0] * (2 * len(part))
        keys = want + [k - 0.5 for k in want] + [k + 0.5 for k in want]
        for numpy in (True, False):
            with contextlib.nullcontext() if numpy else without_numpy():
                order = PriorityIndex.rank_by_density(curves, column)
            assert order == sorted(range(len(keys)), key=keys.__getitem__)
            assert order == reference_columns(curves, column)


def test_tuple_ranking_buckets_every_edge_age_as_age_bucket() -> None:
    """The same ages through ``rank``: candidates of one state at every edge age rank as the
    reference (a candidate given its neighbour's bucket ties or swaps with that neighbour)."""
    ages = [*EDGES, 0.0, -0.0, -3.0, 5e-324, 2.0**31, 1e15, 1e300]  # no NaN: numpy takes it
    for intent, turn in [("coding", 1), ("chat", 1), ("travel", 4)]:
        candidates = [(intent, turn, age, 16) for age in ages]
        for numpy in (True, False):
            with contextlib.nullcontext() if numpy else without_numpy():
                order = DENSITY_INDEX.rank(candidates, "density")
            assert order == reference_tuples(DENSITY_INDEX, candidates)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(CANDIDATE, max_size=80) | st.lists(CANDIDATE, min_size=60, max_size=300),
    st.booleans(),
    st.none() | st.integers(0, 299),
)
def test_density_rankings_equal_the_reference(rows, sized: bool, nan_at: int | None) -> None:
    """Random candidates, about one list in two with a NaN age (bucket 0; numpy hands such a
    list to the pure-Python way); each ranking through numpy and without it."""
    candidates = [(intent, turn, age, size) for (intent, turn), age, size in rows]
    if nan_at is not None and nan_at < len(candidates):
        intent, turn, _age, size = candidates[nan_at]
        candidates[nan_at] = (intent, turn, float("nan"), size)
    curves = [DENSITY_INDEX.curve(intent, turn).values for intent, turn, _a, _s in candidates]
    ages = [age for _i, _t, age, _s in candidates]
    sizes = [size for _i, _t, _a, size in candidates] if sized else None
    columns = reference_columns(curves, ages, sizes)
    tuples = reference_tuples(DENSITY_INDEX, candidates)
    for numpy in (True, False):
        with contextlib.nullcontext() if numpy else without_numpy():
            assert PriorityIndex.rank_by_density(curves, ages, sizes) == columns
            assert DENSITY_INDEX.rank(candidates, "density") == tuples
            assert DENSITY_INDEX.rank(iter(candidates), "density") == tuples


@settings(max_examples=100, deadline=None)
@given(st.integers(64, 400), st.integers(1, 6), st.randoms(use_true_random=False))
def test_density_rankings_break_ties_as_the_reference(n: int, ages_per_state: int, rng) -> None:
    """Many equal densities (few states, few distinct ages, one size): equal keys keep the input
    order, and among the tuples' equal densities the older goes first."""
    states = STATES[: rng.randint(1, len(STATES))]
    pool = {
        state: [rng.choice(EDGES) if rng.random() < 0.5 else rng.uniform(0, 900)
                for _ in range(ages_per_state)]
        for state in states
    }  # fmt: skip
    candidates = []
    for _ in range(n):
        intent, turn = rng.choice(states)
        candidates.append((intent, turn, rng.choice(pool[(intent, turn)]), rng.choice([16, 32])))
    curves = [DENSITY_INDEX.curve(intent, turn).values for intent, turn, _a, _s in candidates]
    ages = [age for _i, _t, age, _s in candidates]
    sizes = [size for *_, size in candidates]
    assert PriorityIndex.rank_by_density(curves, ages) == reference_columns(curves, ages)
    assert PriorityIndex.rank_by_density(curves, ages, sizes) == reference_columns(
        curves, ages, sizes
    )
    assert DENSITY_INDEX.rank(candidates, "density") == reference_tuples(DENSITY_INDEX, candidates)


def test_density_rankings_with_a_few_ties_sort_each_run_oldest_first() -> None:
    """The tuples' runs of equal densities, few among many candidates, each oldest first."""
    rng = random.Random(5)
    candidates = [(f"i{rng.randrange(200)}", 1, rng.uniform(0, 3000), rng.randint(1, 9000))
                  for _ in range(1000)]  # fmt: skip
    index = PriorityIndex(table(*[(f"i{i}", 1, rng.random(), rng.uniform(5, 500))
                                  for i in range(200)]))  # fmt: skip
    for j in range(0, 40, 4):  # a run of three: two in one bucket and size, one younger/older
        intent, turn, age, size = candidates[j]
        candidates[j + 1] = (intent, turn, age * 1.0001, size)
        candidates[j + 2] = (intent, turn, age * 1.00005, size)
    assert index.rank(candidates, "density") == reference_tuples(index, candidates)


@pytest.mark.parametrize(
    "change",
    ["nan age", "-nan age", "-inf age", "negative size", "-0.0 value", "nan value", "inf value"],
)
def test_density_rankings_of_odd_values_equal_the_reference(change: str) -> None:
    """One odd value among 200 candidates: a NaN age ranks in the first bucket, a negative key
    or -0.0 (which ties 0.0) in its place, and the order stays the reference's."""
    rng = random.Random(change)
    candidates = [(*rng.choice(STATES), rng.uniform(0, 600), rng.choice([16, 32]))
                  for _ in range(200)]  # fmt: skip
    curves = [list(DENSITY_INDEX.curve(i, t).values) for i, t, _a, _s in candidates]
    curves[7] = [0.0] * AGE_BUCKETS  # ties with the -0.0 below
    j = 50
    intent, turn, age, size = candidates[j]
    odd = {"nan age": float("nan"), "-nan age": -float("nan"), "-inf age": -math.inf}
    if change in odd:
        candidates[j] = (intent, turn, odd[change], size)
    elif change == "negative size":
        candidates[j] = (intent, turn, age, -size)
    else:
        curves[j] = [
            {"-0.0": -0.0, "nan": math.nan, "inf": math.inf}[change.split()[0]]
        ] * AGE_BUCKETS
    ages = [age for _i, _t, age, _s in candidates]
    sizes = [size for *_, size in candidates]
    assert PriorityIndex.rank_by_density(curves, ages) == reference_columns(curves, ages)
    assert PriorityIndex.rank_by_density(curves, ages, sizes) == reference_columns(
        curves, ages, sizes
    )
    if "value" not in change:
        assert DENSITY_INDEX.rank(candidates, "density") == reference_tuples(
            DENSITY_INDEX, candidates
        )


def test_density_rankings_keep_the_errors_of_the_reference() -> None:
    curve = DENSITY_INDEX.default_curve().values
    for numpy in (True, False):
        with contextlib.nullcontext() if numpy else without_numpy():
            with pytest.raises(OverflowError):  # int(log1p(inf)), as age_bucket
                PriorityIndex.rank_by_density([curve] * 100, [1.0] * 99 + [math.inf])
            with pytest.raises(ZeroDivisionError):
                PriorityIndex.rank_by_density([curve] * 100, [1.0] * 100, [1] * 99 + [0])
            with pytest.raises(ZeroDivisionError):
                DENSITY_INDEX.rank([("chat", 1, 1.0, 0)] * 100, "density")
            with pytest.raises(ValueError):
                DENSITY_INDEX.rank([("chat", 1, 1.0)] * 100, "density")
    # A short column: as many as the shortest, as zip gives them.
    assert PriorityIndex.rank_by_density([curve] * 70, [5.0] * 100) == list(range(70))


def test_density_rankings_without_numpy_installed() -> None:
    """The engine-side client loads and ranks where numpy cannot be imported."""
    script = textwrap.dedent("""
        import random, sys
        class Refuse:
            def find_spec(self, name, path=None, target=None):
                if name == "numpy" or name.startswith("numpy."):
                    raise ImportError("blocked: " + name)
        sys.meta_path.insert(0, Refuse())
        from kvcast.exporters.kit.index import PriorityIndex
        index = PriorityIndex()
        rng = random.Random(1)
        nodes = [("x", 1, rng.uniform(0, 900), rng.randint(1, 64)) for _ in range(200)]
        curves = [index.curve(i, t).values for i, t, _a, _s in nodes]
        ages, sizes = [n[2] for n in nodes], [n[3] for n in nodes]
        keys = [(index.density(i, t, a, s), -a) for i, t, a, s in nodes]
        assert index.rank(nodes, "density") == sorted(range(200), key=keys.__getitem__)
        order = index.rank_by_density(curves, ages, sizes)
        assert order == sorted(range(200), key=lambda j: keys[j][0])
        print(sorted(m for m in sys.modules if m.partition(".")[0] == "numpy"))
    """)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_column_ranking_costs_at_most_a_few_lru_sorts() -> None:
    """The hot path against an LRU sort timed in the same run (loose: a loaded machine)."""
    rng = random.Random(11)
    index = PriorityIndex(table(*[(f"i{i}", t, rng.random(), rng.uniform(5, 500))
                                  for i in range(8) for t in range(1, 33)]))  # fmt: skip
    nodes = [(f"i{rng.randrange(8)}", rng.randint(1, 32), rng.expovariate(1 / 120))
             for _ in range(1000)]  # fmt: skip
    curves = [index.curve(i, t).values for i, t, _a in nodes]
    ages = [age for _i, _t, age in nodes]
    access = [-age for age in ages]

    def best(run) -> float:
        times = []
        for _ in range(30):
            started = time.perf_counter()
            run()
            times.append(time.perf_counter() - started)
        return min(times)

    lru = best(lambda: sorted(range(len(access)), key=access.__getitem__))
    columns = best(lambda: index.rank_by_density(curves, ages))
    assert columns < 4 * lru, (columns, lru)
