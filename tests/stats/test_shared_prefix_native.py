"""The shared-prefix index in C gives exactly the Python index's results.

``kvcast.stats.shared_prefix.PySharedPrefixIndex`` is the reference; the C one
(``NativeSharedPrefixIndex``, ``SharedIndexCore`` in stats/native/_replay.c) is what the
tracker uses where the extension is built. Both are driven by the same drawn operations
(requests with shared prefixes, restarts, late turns, releases, expiry by watermark, a restore
from a checkpoint, the end of the input) and every output is compared: each request's run and
held ids, ``continues``, the shared table and the checkpoint's changes (in their order, since
the partition delta and the snapshot read them in it), the size and ``next_due``.
"""

from __future__ import annotations

import gc
import itertools
import random
import subprocess
import sys
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcast.stats import conversations
from kvcast.stats.config import StatsConfig
from kvcast.stats.engine import StatsEngine
from kvcast.stats.events import parse_event
from kvcast.stats.partition import PartitionEngine
from kvcast.stats.shared_prefix import PySharedPrefixIndex, SharedPrefixIndex
from tests.support import canonical, require_native, shared_prefix_events

try:
    from kvcast.stats.shared_prefix import NativeSharedPrefixIndex
except ImportError:  # no extension: require_native skips (or fails in CI)
    NativeSharedPrefixIndex = None  # type: ignore[assignment, misc]


@pytest.fixture(autouse=True)
def _native() -> None:
    require_native()


def state(index: PySharedPrefixIndex) -> tuple:
    """Everything a caller reads from an index, in order."""
    return (
        list(index.shared_table.items()),
        list(index.changes.upserts.items()),
        sorted(index.changes.removals, key=repr),
        len(index),
        index.next_due,
    )


class Pair:
    """One Python and one C index fed the same calls; each call's results must agree."""

    def __init__(self, capacity: int, timeout_s: float, dense: int) -> None:
        self.args = (capacity, timeout_s, dense)
        self.py = PySharedPrefixIndex(*self.args)
        self.c = NativeSharedPrefixIndex(*self.args)
        # Per session: newest event time and held ids (the tracker's conversations).
        self.last_ts: dict[str, float] = {}
        self.held: dict[str, tuple] = {}

    def call(self, name: str, *args: object) -> object:
        expected = getattr(self.py, name)(*args)
        got = getattr(self.c, name)(*args)
        assert got == expected, (name, args)
        assert repr(got) == repr(expected), (name, args)  # same types: floats stay floats
        assert state(self.c) == state(self.py), (name, args)
        return expected

    def request(self, session: str, ts: float, hashes: list, newest: bool) -> None:
        held = self.held.get(session, ())
        if newest and not self.call("continues", hashes, held):
            self.release(session)
            held = ()
        last_seen: Callable[[str], float] = self.last_ts.__getitem__
        run, mine = self.call("observe", session, ts, hashes, held, last_seen, newest)
        self.held[session] = mine
        self.last_ts[session] = max(self.last_ts.get(session, ts), ts)
        assert run.blocks <= len(hashes)

    def release(self, session: str) -> None:
        if session in self.held:
            self.call("release", session, self.held.pop(session))
            del self.last_ts[session]

    def restore(self) -> None:
        """A checkpoint: the shared table and each open conversation's held ids, into new
        indexes of both kinds."""
        shared = dict(self.py.shared_table)
        held = list(self.held.items())
        self.py = PySharedPrefixIndex(*self.args)
        self.c = NativeSharedPrefixIndex(*self.args)
        self.call("restore", shared, held)


BLOCKS = st.one_of(st.integers(0, 40), st.sampled_from(["a", "b", "c", "0", "1"]))


@st.composite
def operations(draw: st.DrawFn) -> list[tuple]:
    """Requests of a few conversations that grow turn by turn from shared prompts (or start
    anew), at times that mostly advance, with releases, expiries, restores and clears."""
    prompts = draw(st.lists(st.lists(BLOCKS, min_size=1, max_size=6), min_size=1, max_size=3))
    rng = random.Random(draw(st.integers(0, 2**32)))
    contexts: dict[str, list] = {}
    ops: list[tuple] = []
    ts = 0.0
    for _ in range(draw(st.integers(1, 60))):
        kind = draw(st.sampled_from("rrrrrrrrlxeEsC"))
        session = f"s{draw(st.integers(0, 5))}"
        if kind in "rl":
            context = contexts.get(session)
            if context is None or rng.random() < 0.1:  # a new conversation or a new context
                context = list(rng.choice(prompts)) if rng.random() < 0.8 else []
            grown = context + [rng.choice([rng.randrange(1000), f"x{rng.randrange(50)}"])
                               for _ in range(rng.randrange(0, 4))]  # fmt: skip
            if not grown:
                grown = [rng.randrange(1000)]
            contexts[session] = grown[:-1] if rng.random() < 0.7 else grown  # a partial last
            ts += draw(st.sampled_from((0.0, 0.25, 1.0, 7.5, 40.0)))
            late = kind == "l"
            ops.append(("request", session, ts - 5.0 if late else ts, list(grown), not late))
        elif kind == "x":
            ops.append(("release", session))
        elif kind in "eE":
            # Time passes (about a timeout of 1 or 30 s, give or take a fraction), then the
            # watermark: where a block referenced again since it was scheduled is due or not.
            ts += draw(st.sampled_from((0.5, 1.0, 1.5, 29.5, 30.0, 30.75, 31.0, 60.0)))
            ops.append(("expire", ts - draw(st.sampled_from((0.0, 0.25, 0.5, 10.0, 100.0)))))
        elif kind == "s":
            ops.append(("restore",))
        else:
            ops.append(("clear",))
    return ops


@settings(max_examples=300, deadline=None)
@given(
    operations(),
    st.sampled_from((0, 3, 8, 10**6)),
    st.sampled_from((1.0, 30.0, 1e9)),
    st.sampled_from((1, 2, 3, 16, 10**9)),
)
def test_the_c_index_gives_the_python_indexs_results(
    ops: list[tuple], capacity: int, timeout_s: float, dense: int
) -> None:
    pair = Pair(capacity, timeout_s, dense)
    for op in ops:
        if op[0] == "request":
            pair.request(*op[1:])
        elif op[0] == "release":
            pair.release(op[1])
        elif op[0] == "expire":
            pair.call("expire", op[1])
        elif op[0] == "restore":
            pair.restore()
        else:
            pair.call("clear")
            pair.held.clear()
            pair.last_ts.clear()
    for blocks in (0, 1, 5, 100, 5000):
        pair.call("positions", blocks)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 6), max_size=8), st.lists(st.integers(0, 6), max_size=6)),
        max_size=20,
    ),
    st.sampled_from((1, 2, 10**9)),
)
def test_continues_agrees_on_any_ids(cases: list[tuple[list, list]], dense: int) -> None:
    pair = Pair(100, 1.0, dense)
    for hashes, held in cases:
        pair.call("continues", hashes, tuple(held))


class _IntId(int):
    """An int that is not an exact int: the C index's general path (``hash()``, ``==``)."""


_EDGES = [0, 1, -1, -2, 2**30 - 1, 2**30, 2**60, 2**61 - 2, 2**61 - 1, 2**61, 2**62, 2**63 - 1]
WIDE_IDS = st.one_of(
    st.sampled_from(_EDGES + [-v for v in _EDGES] + [2**63, 2**64 - 1, -(2**63)]),
    st.integers(-(2**64), 2**64),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(WIDE_IDS, min_size=1, max_size=40, unique=True))
def test_a_wide_int_is_the_same_block_as_an_equal_int_hashed_by_python(ids: list[int]) -> None:
    """Block ids are 64-bit hashes, signed or not: the C index compares two exact ints by
    value and anything else with ``==``, so an equal id of another int type (a subclass here)
    is the same block at every width, the edges of ``hash()``'s modulus included."""
    pair = Pair(1000, 30.0, 10**9)
    pair.request("exact", 1.0, list(ids), True)
    pair.request("general", 2.0, [_IntId(v) for v in ids], True)
    run, _ = pair.c.observe("third", 3.0, list(ids), (), lambda _: 2.0)
    assert run.blocks == len(ids)


@pytest.mark.parametrize("width", [2**20, 2**62, 2**63 - 2**10, -(2**40)])
def test_a_remembered_run_is_checked_against_the_table_every_time(width: int) -> None:
    """The C index remembers the entries of the last shared run that began with each first id
    (``SpRunMemo``), to skip hashing and probing them on the next request. A memory is a hint
    only: here the remembered prompts expire, their entries are taken by other ids (shared)
    or by the same ids (private), a prompt comes back changed in its middle, and runs outgrow
    the memory's 64 ids; every result stays the Python index's. Ids of several widths: one,
    two and three 30-bit digits, and negative ones."""
    prompt = [width + i for i in range(80)]
    other = [width + 1000 + i for i in range(80)]
    cases = [(10**6, 20), (10**6, 80), (130, 80)]
    for (capacity, length), others in itertools.product(cases, ("", "de")):
        pair = Pair(capacity, 30.0, 64)
        ts = 0.0
        for session in ("a", "b", "c"):  # the prompt becomes shared, then is remembered
            ts += 1.0
            pair.request(session, ts, [*prompt[:length], session], True)
        for session in ("a", "b", "c"):
            pair.release(session)
        ts += 100.0
        pair.call("expire", ts)  # the prompt's entries are free
        assert len(pair.c) == 0
        for session in others:  # another prompt takes the freed entries, or none does
            ts += 1.0
            pair.request(session, ts, [*other[:length], session], True)
        ts += 1.0
        pair.request("f", ts, [*prompt[:length], "f"], True)  # private now, in freed entries
        ts += 1.0
        pair.request("g", ts, [*prompt[:length], "g"], True)  # shared again: remembered
        changed = [*prompt[:length]]
        changed[length // 2] = "middle"
        ts += 1.0
        pair.request("h", ts, [*changed, "h"], True)  # the run ends in the middle
        ts += 1.0
        pair.request("i", ts, [*prompt[:length], "i"], True)
        for session in others + "fghi":
            pair.release(session)
        ts += 100.0
        pair.call("expire", ts)


def test_the_c_indexs_results_of_ids_leave_the_garbage_collector_nothing_to_walk() -> None:
    """A request's run, gaps and held ids are tuples of ints and floats (one set a request):
    untracked as they are made, as the collector would untrack them at its first look; a
    tuple holding an object that may be in a cycle stays tracked."""
    index = NativeSharedPrefixIndex(1000, 30.0)
    _, held = index.observe("a", 1.0, [1, 2, 3, 4], (), lambda _: 0.0)
    result = index.observe("b", 5.0, [1, 2, 3, 9], (), {"a": 1.0}.__getitem__)
    (run, mine), gaps = result, result[0].gaps
    assert run.blocks == 3 and mine == (9,)
    for made in (held, result, run, mine, gaps, *gaps):
        assert not gc.is_tracked(made), made
    cyclic = _IntId(7)
    cyclic.self_ref = cyclic  # an int subclass with a __dict__ can be in a cycle
    _, held = index.observe("c", 6.0, [cyclic], (), lambda _: 0.0)
    assert held == (cyclic,) and gc.is_tracked(held)


def test_every_reference_the_c_index_took_is_given_back_once() -> None:
    """An entry keeps its owner (private) or its last reference (shared) in one slot, and a
    free entry keeps the free list there: owners handed on when a block becomes shared, last
    references replaced, entries freed by release and expiry and reused, the index dropped
    with free entries in it; every object's reference count ends where it began."""
    owners = [f"session-{n}".encode().decode() for n in range(3)]  # not interned
    ids = [int(str(10**12 + n)) for n in range(6)]  # not the small-int cache
    times = [float(n) + 0.5 for n in range(8)]
    before = [sys.getrefcount(o) for o in (*owners, *ids, *times)]
    index = NativeSharedPrefixIndex(1000, 1.0)
    newest = dict(zip(owners, times, strict=False))
    _, held_a = index.observe(owners[0], times[0], ids[:4], (), newest.__getitem__)
    # b shares a's first three: a's owner passes on, the last reference is a's newest time
    _, held_b = index.observe(owners[1], times[1], [*ids[:3], ids[4]], (), newest.__getitem__)
    # a again: the shared entries take a new last reference, its own block stays private
    _, held_a = index.observe(owners[0], times[2], ids[:4], held_a, newest.__getitem__)
    index.release(owners[1], held_b)
    index.expire(times[7] + 10.0)  # the shared entries go: free entries, free list through them
    _, held_c = index.observe(owners[2], times[3], [ids[5], *ids[:2]], (), newest.__getitem__)
    del held_a, held_b, held_c, newest
    del index
    gc.collect()
    assert [sys.getrefcount(o) for o in (*owners, *ids, *times)] == before


def test_the_tracker_uses_the_c_index_where_it_is_built() -> None:
    assert SharedPrefixIndex is NativeSharedPrefixIndex
    assert isinstance(conversations.ConversationTracker(StatsConfig()).shared_index,
                      NativeSharedPrefixIndex)  # fmt: skip


def test_the_c_index_checks_its_arguments_as_the_python_one_does() -> None:
    for cls in (PySharedPrefixIndex, NativeSharedPrefixIndex):
        with pytest.raises(ValueError, match="capacity must be >= 0"):
            cls(-1, 1.0)
        with pytest.raises(ValueError, match="dense_blocks must be >= 1"):
            cls(1, 1.0, dense_blocks=0)


def test_expiry_at_clocks_beyond_exact_floats_agrees() -> None:
    """``floor + 1 <= watermark`` is an int comparison in Python; at 2**53 s and beyond
    floor + 1 is no double, and the C index still decides as Python does."""
    for base in (2.0**52, 2.0**53, 2.0**60):
        pair = Pair(100, 1.0, 4)
        pair.request("a", base, [1, 2, 3], True)
        pair.request("b", base, [1, 2, 4], True)
        for w in (base, base + 1.0, base + 2.0, base * 1.5):
            pair.call("expire", w)


def engine_statistics(index: type, monkeypatch: pytest.MonkeyPatch, events: list[dict]) -> tuple:
    """A partition's deltas (with the shared table's changes) and its snapshot, with the
    tracker's index of class ``index``."""
    monkeypatch.setattr(conversations, "SharedPrefixIndex", index)
    config = StatsConfig(completion_timeout_s=30.0, allowed_lateness_s=5.0)
    partition = PartitionEngine(config, partition="0")
    deltas = []
    for offset, raw in enumerate(events):
        partition.apply(parse_event(raw), "unknown", offset)
        if offset % 97 == 0:
            delta = partition.take_delta()
            deltas.append((delta.shared_upserts, delta.shared_removals, delta.upserts))
    engine = StatsEngine(config)
    for raw in events:
        engine.apply(parse_event(raw), "unknown")
    engine.finish()
    return deltas, canonical(engine.snapshot())


@pytest.mark.parametrize("seed", [0, 1])
def test_the_engine_gives_the_same_statistics_with_either_index(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = shared_prefix_events(300, seed=seed, rate_per_s=0.5, fork_share=0.3)
    python = engine_statistics(PySharedPrefixIndex, monkeypatch, events)
    native = engine_statistics(NativeSharedPrefixIndex, monkeypatch, events)
    assert native == python
    assert any(upserts for upserts, _, _ in python[0])
    assert any(removals for _, removals, _ in python[0])


def test_without_the_extension_the_tracker_uses_the_python_index() -> None:
    """The extension is optional (no compiler, no C): then the Python index is the one."""
    code = (
        "import sys; sys.modules['kvcast.stats.native._replay'] = None\n"
        "from kvcast.stats import conversations, shared_prefix as s\n"
        "from kvcast.stats.config import StatsConfig\n"
        "assert s.SharedPrefixIndex is s.PySharedPrefixIndex\n"
        "assert not hasattr(s, 'NativeSharedPrefixIndex')\n"
        "index = conversations.ConversationTracker(StatsConfig()).shared_index\n"
        "assert type(index) is s.PySharedPrefixIndex\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
