"""Workloads with cross-conversation sharing: shared system prompts, nested tool prefixes and
agentic branches, and the chain-hashed ``block_hashes`` their events carry (SPEC section 2)."""

from __future__ import annotations

import functools
import itertools
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import orjson
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from kvcast.cli.main import cli
from kvcast.lab.sim.block_policies import lru_block
from kvcast.lab.sim.registry import simulate
from kvcast.lab.sim.trace import SimTrace
from kvcast.lab.workload.generator import generate, unbounded_hit_ratio
from kvcast.lab.workload.model import (
    Branching,
    Delay,
    IntentModel,
    Segment,
    SharedPrefix,
    Sharing,
    WorkloadModel,
)
from kvcast.lab.workload.presets import SHARING_PRESETS, preset
from kvcast.lab.workload.trace import Trace
from kvcast.stats.events import parse_event

BS = 16


PREFIXED = tuple(n for n in SHARING_PRESETS if preset(n).sharing.prefixes)  # type: ignore[union-attr]
BRANCHING = tuple(n for n in SHARING_PRESETS if preset(n).sharing.branching)  # type: ignore[union-attr]


@functools.cache
def drawn(name: str) -> Trace:
    """One trace per preset, shared by the tests of this module."""
    return generate(preset(name), lambda0=1.0, conversations=1500, seed=5, prompts=True)


@pytest.fixture(params=SHARING_PRESETS)
def shared(request: pytest.FixtureRequest) -> tuple[str, Trace]:
    return request.param, drawn(request.param)


def test_the_sharing_presets_cover_every_kind_of_sharing() -> None:
    assert PREFIXED and BRANCHING and set(PREFIXED) != set(BRANCHING)
    assert set(PREFIXED) & set(BRANCHING)  # one mixes both


def by_conversation(trace: Trace) -> dict[int, list[int]]:
    """Request rows (trace order) of each conversation."""
    rows: dict[int, list[int]] = defaultdict(list)
    for r, c in enumerate(trace.conversation.tolist()):
        rows[c].append(r)
    return rows


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def designed_common(p: SharedPrefix, q: SharedPrefix) -> int:
    """Blocks two prefixes share by design: their common leading segments."""
    n = 0
    for s, t in zip(p.segments, q.segments, strict=False):
        if s != t:
            break
        n += s.blocks
    return n


def check_ids(trace: Trace, hashes: list[list[int]]) -> None:
    """The contract of generated ids, from the events' point of view."""
    # Sizes: one id per KV block of the input.
    assert [len(h) for h in hashes] == trace.blocks.tolist()
    assert np.array_equal(-(-trace.input_tokens // trace.block_size), trace.blocks)
    # Chain hashes: an id fixes its position and its parent's id, so equal ids mean equal
    # prefixes (by induction) and a consumer keying on the id alone sees what the trie sees.
    where: dict[int, tuple[int, int | None]] = {}
    uses: dict[int, int] = defaultdict(int)
    for ids in hashes:
        for p, h in enumerate(ids):
            assert 0 <= h < 2**63
            assert where.setdefault(h, (p, ids[p - 1] if p else None)) == (
                p,
                ids[p - 1] if p else None,
            )
            uses[h] += 1
    # The partly filled last block of a request is its own: no other block has its id.
    assert all(uses[ids[-1]] == 1 for ids in hashes)
    # Turn j extends turn j-1: all of turn j-1 but its tail, then a different block.
    for rows in by_conversation(trace).values():
        assert trace.turn[rows].tolist() == list(range(1, len(rows) + 1))
        for a, b in itertools.pairwise(rows):
            prev, cur = hashes[a], hashes[b]
            assert cur[: len(prev) - 1] == prev[:-1]
            assert cur[len(prev) - 1] != prev[-1]


def check_branches(trace: Trace, hashes: list[list[int]]) -> int:
    """Each branch starts with its parent's turn-k input less the parent's tail, arrives after
    it, and then diverges from the parent and from its sibling branches. Returns the count."""
    lin = trace.lineage
    assert lin is not None
    rows = by_conversation(trace)
    branches = np.flatnonzero(lin.parent >= 0).tolist()
    for b in branches:
        p, k = int(lin.parent[b]), int(lin.parent_turn[b])
        assert lin.parent[p] == -1 and 1 <= k <= len(rows[p])
        at = rows[p][k - 1]
        first = rows[b][0]
        assert trace.timestamp[first] > trace.timestamp[at]
        inherited = hashes[at][:-1]
        assert lin.base[b] == len(inherited)
        assert hashes[first][: len(inherited)] == inherited
        for r in rows[p][k:]:  # the parent's own continuation shares no more than that
            assert common_prefix(hashes[r], hashes[first]) == len(inherited)
    siblings: dict[tuple[int, int], list[int]] = defaultdict(list)
    for b in branches:
        siblings[(int(lin.parent[b]), int(lin.parent_turn[b]))].append(b)
    for group in siblings.values():
        for b1, b2 in itertools.combinations(group, 2):
            shared = common_prefix(hashes[rows[b1][0]], hashes[rows[b2][0]])
            assert shared == lin.base[b1] == lin.base[b2]
    return len(branches)


def unbounded_reference(hashes: list[list[int]]) -> list[int]:
    """Hit blocks per request of an unbounded cache that keys on the id alone."""
    seen: set[int] = set()
    out = []
    for ids in hashes:
        k = 0
        while k < len(ids) and ids[k] in seen:
            k += 1
        out.append(k)
        seen.update(ids)
    return out


def test_events_carry_block_hashes_consistent_with_their_sizes(shared) -> None:
    _, trace = shared
    events = [parse_event(line) for line in trace.jsonl_lines()]
    assert len(events) == len(trace) > 0
    hashes = [e.block_hashes for e in events]
    for e in events:
        assert e.block_hashes is not None
        assert len(e.block_hashes) == math.ceil(e.input_tokens / BS)
    assert hashes == trace.block_hashes()
    check_ids(trace, hashes)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", PREFIXED)
def test_shared_prefixes_are_shared_at_the_designed_rates(name: str) -> None:
    trace = drawn(name)
    sharing = preset(name).sharing
    assert sharing is not None and trace.lineage is not None
    hashes = trace.block_hashes()
    assert hashes is not None
    lin, rows = trace.lineage, by_conversation(trace)
    roots = np.flatnonzero(lin.parent < 0)
    # Choice rates: each prefix's share of root conversations, within 4 binomial sigmas.
    n = roots.size
    for k, share in enumerate(sharing.shares):
        got = int(np.sum(lin.prefix[roots] == k))
        assert abs(got - n * share) < 4 * math.sqrt(n * share * (1 - share)) + 1, (k, got)
    # Every pair of root conversations shares exactly the designed leading blocks.
    sample = roots[:300].tolist()
    first = {c: hashes[rows[c][0]] for c in sample}
    pairs = 0
    for c1, c2 in itertools.combinations(sample, 2):
        p1, p2 = sharing.prefixes[lin.prefix[c1]], sharing.prefixes[lin.prefix[c2]]
        assert common_prefix(first[c1], first[c2]) == designed_common(p1, p2)
        pairs += designed_common(p1, p2) > 0
    assert pairs > 0
    # ... and every later turn keeps its conversation's prefix in front.
    for c in sample:
        p = sharing.prefixes[lin.prefix[c]]
        for r in rows[c]:
            assert hashes[r][: p.blocks] == first[c][: p.blocks]


def test_tool_prefixes_nest_under_one_system_prompt() -> None:
    sharing = preset("tools").sharing
    assert sharing is not None
    system = sharing.prefixes[0].segments
    assert len(system) == 1 and all(p.segments[:1] == system for p in sharing.prefixes)
    trace = generate(preset("tools"), lambda0=1.0, conversations=800, seed=2)
    hashes, lin = trace.block_hashes(), trace.lineage
    assert hashes is not None and lin is not None
    heads = {tuple(hashes[r][: system[0].blocks]) for r in np.flatnonzero(trace.turn == 1)}
    assert len(heads) == 1  # one system prompt in front of everything
    # Two tool sets: same first blocks, different at the first tool block.
    kinds = {}
    for r in np.flatnonzero(trace.turn == 1).tolist():
        kinds.setdefault(int(lin.prefix[trace.conversation[r]]), hashes[r])
    assert len(kinds) == len(sharing.prefixes)
    cut = system[0].blocks
    at_cut = {k: ids[cut] for k, ids in kinds.items()}
    assert len(set(at_cut.values())) == len(at_cut)


def test_branches_continue_their_parents_turns(shared) -> None:
    name, trace = shared
    sharing = preset(name).sharing
    assert sharing is not None and trace.lineage is not None
    hashes = trace.block_hashes()
    assert hashes is not None
    count = check_branches(trace, hashes)
    br = sharing.branching
    if br is None:
        assert count == 0 and trace.conversations == 1500
        return
    lin = trace.lineage
    roots = np.flatnonzero(lin.parent < 0)
    assert roots.size == 1500 and trace.conversations == 1500 + count
    parents, per_parent = np.unique(lin.parent[lin.parent >= 0], return_counts=True)
    n, p = roots.size, br.p_parent
    assert abs(parents.size - n * p) < 4 * math.sqrt(n * p * (1 - p))
    var = br.mean_branches - 1  # 1 + Poisson(mean - 1)
    assert abs(per_parent.mean() - br.mean_branches) < 4 * math.sqrt(var / parents.size)
    assert per_parent.max() >= 3  # several continuations from one parent
    # Conversations are numbered in arrival order, branches included.
    firsts = trace.timestamp[trace.turn == 1]
    assert np.all(np.diff(trace.conversation[trace.turn == 1]) > 0)
    assert np.all(np.diff(firsts) >= 0)


def test_block_simulator_and_id_keyed_reuse_agree(shared) -> None:
    name, trace = shared
    hashes = trace.block_hashes()
    assert hashes is not None
    sim = trace.sim_trace()
    unbounded = lru_block(sim, int(trace.blocks.sum())).tolist()
    assert unbounded == unbounded_reference(hashes)
    assert sum(unbounded) / int(trace.blocks.sum()) == pytest.approx(unbounded_hit_ratio(trace))
    # By design at unbounded capacity: a later turn reuses its previous turn less the tail; a
    # branch's first turn reuses exactly what it inherits; a root's first turn reuses the blocks
    # its prefix shares with the prefixes of earlier roots.
    lin, sharing = trace.lineage, preset(name).sharing
    assert lin is not None and sharing is not None
    seen: list[SharedPrefix] = []
    prev_blocks: dict[int, int] = {}
    for r, (c, turn) in enumerate(
        zip(trace.conversation.tolist(), trace.turn.tolist(), strict=True)
    ):
        if turn > 1:
            expected = prev_blocks[c] - 1
        elif lin.parent[c] >= 0:
            expected = int(lin.base[c])
        elif sharing.prefixes:
            mine = sharing.prefixes[lin.prefix[c]]
            expected = max((designed_common(mine, q) for q in seen), default=0)
            seen.append(mine)
        else:
            expected = 0
        assert unbounded[r] == expected, (r, c, turn)
        prev_blocks[c] = int(trace.blocks[r])


def test_hashes_without_sharing_are_the_simulators_synthesized_chains() -> None:
    trace = generate(preset("mixed"), lambda0=2.0, conversations=600, seed=8, block_hashes=True)
    hashes = trace.block_hashes()
    assert hashes is not None
    check_ids(trace, hashes)
    plain = trace.sim_trace()
    synthesized = SimTrace(**{**plain.__dict__, "block_hashes": None})
    for cap in (200, 1000, 5000):
        assert np.array_equal(lru_block(plain, cap), lru_block(synthesized, cap)), cap


@pytest.mark.parametrize("name", ["shared_system", "production"])
def test_sharing_raises_the_block_lru_hit_ratio(name: str) -> None:
    trace = generate(preset(name), lambda0=2.0, conversations=3000, seed=4)
    with_ids = trace.sim_trace()
    without = SimTrace(**{**with_ids.__dict__, "block_hashes": None})
    for cap in (500, 2000):
        a = simulate(with_ids, cap, "lru", "block")
        b = simulate(without, cap, "lru", "block")
        assert a.input_blocks == b.input_blocks
        assert a.hit_ratio > b.hit_ratio + 0.1, (cap, a.hit_ratio, b.hit_ratio)


def test_removing_sharing_leaves_the_conversations_as_they_are() -> None:
    base = generate(preset("mixed"), lambda0=1.0, conversations=500, seed=3, prompts=True)
    model = preset("shared_system")
    sys_ = generate(model, lambda0=1.0, conversations=500, seed=3, prompts=True)
    assert model.sharing is not None and sys_.lineage is not None
    for col in ("conversation", "turn", "timestamp", "output_tokens", "intent", "prompt_choice"):
        assert np.array_equal(getattr(base, col), getattr(sys_, col)), col
    added = np.array([p.blocks for p in model.sharing.prefixes])[sys_.lineage.prefix]
    assert np.array_equal(sys_.input_tokens - base.input_tokens, BS * added[sys_.conversation])
    # Without ids, the sharing preset's events are the same but for the ids.
    plain = generate(model, lambda0=1.0, conversations=500, seed=3, block_hashes=False)
    with_ids = list(generate(model, lambda0=1.0, conversations=500, seed=3).events())
    assert all("block_hashes" not in e for e in plain.events())
    assert [{k: v for k, v in e.items() if k != "block_hashes"} for e in with_ids] == list(
        plain.events()
    )
    # Branching adds conversations and leaves the roots' requests as the plain model draws them.
    agentic = generate(preset("agentic"), lambda0=1.0, conversations=500, seed=3)
    assert agentic.lineage is not None
    root_rows = agentic.lineage.parent[agentic.conversation] < 0
    for col in ("turn", "timestamp", "input_tokens", "output_tokens", "intent"):
        assert np.array_equal(getattr(agentic, col)[root_rows], getattr(base, col)), col


def test_the_same_segment_after_different_prefixes_has_different_ids() -> None:
    b = Segment("b", 3)
    sharing = Sharing(
        prefixes=(
            SharedPrefix((Segment("a", 2), b), 1.0),
            SharedPrefix((Segment("c", 2), b), 1.0),
            SharedPrefix((b,), 1.0),
        )
    )
    model = WorkloadModel((IntentModel("chitchat", p_continue=0.0),), (1.0,), sharing)
    trace = generate(model, lambda0=1.0, conversations=60, seed=1)
    hashes, lin = trace.block_hashes(), trace.lineage
    assert hashes is not None and lin is not None
    seg_b: dict[int, tuple[int, ...]] = {}
    for r, c in enumerate(trace.conversation.tolist()):
        k = int(lin.prefix[c])
        start = sharing.prefixes[k].blocks - b.blocks
        assert seg_b.setdefault(k, tuple(hashes[r][start : start + b.blocks])) == tuple(
            hashes[r][start : start + b.blocks]
        )
    assert len(seg_b) == 3
    assert len({h for ids in seg_b.values() for h in ids}) == 3 * b.blocks
    check_ids(trace, hashes)


def test_deterministic_by_seed() -> None:
    def lines(seed: int) -> bytes:
        tr = generate(preset("production"), lambda0=1.0, duration_s=400, seed=seed, prompts=True)
        return b"".join(tr.jsonl_lines())

    assert lines(6) == lines(6)
    assert lines(6) != lines(7)


def test_validation() -> None:
    with pytest.raises(ValueError):
        Segment("s", 0)
    with pytest.raises(ValueError):
        Sharing(
            prefixes=(SharedPrefix((Segment("s", 2),), 1.0), SharedPrefix((Segment("s", 3),), 1.0))
        )
    with pytest.raises(ValueError):
        Sharing(prefixes=(SharedPrefix((), 0.0),))
    with pytest.raises(ValueError):
        Branching(p_parent=1.5)
    with pytest.raises(ValueError):
        Branching(p_parent=0.5, mean_branches=0.5)
    empty = generate(preset("production"), lambda0=1e-9, duration_s=1.0, prompts=True)
    assert len(empty) == 0 and list(empty.events()) == []


def test_generate_simulate_and_replay_through_the_cli(tmp_path: Path) -> None:
    runner = CliRunner()
    out, plain = tmp_path / "s.jsonl", tmp_path / "p.jsonl"
    args = ["--preset", "shared_system", "--lambda", "2", "--conversations", "1500", "--seed", "3"]
    res = runner.invoke(cli, ["generate", str(out), *args, "--json"])
    assert res.exit_code == 0, res.output
    summary = orjson.loads(res.stdout)
    assert 0 < summary["upper_bound_trace"] < 1 and "upper_bound_model" not in summary
    res = runner.invoke(cli, ["generate", str(plain), *args, "--no-block-hashes"])
    assert res.exit_code == 0, res.output
    ratios = []
    for path in (out, plain):
        cmd = ["simulate", str(path), "--granularity", "block", "--policy", "lru"]
        res = runner.invoke(cli, [*cmd, "--capacity-blocks", "1000", "--json"])
        assert res.exit_code == 0, res.output
        got = orjson.loads(res.stdout)
        assert got["block_hashes"] is (path == out)
        ratios.append(got["hit_ratio"])
    assert ratios[0] > ratios[1] + 0.1
    res = runner.invoke(cli, ["replay", str(out), "--json"])
    assert res.exit_code == 0, res.output
    events = orjson.loads(res.stdout)["events"]
    assert events["processed"] == summary["events"] and events["rejected"] == 0


@st.composite
def sharing_models(draw: st.DrawFn) -> WorkloadModel:
    names = ["a", "b", "c"]
    sizes = {n: draw(st.integers(1, 6)) for n in names}
    prefixes = tuple(
        SharedPrefix(
            tuple(Segment(n, sizes[n]) for n in draw(st.lists(st.sampled_from(names), max_size=3))),
            draw(st.floats(0.1, 1.0)),
        )
        for _ in range(draw(st.integers(0, 4)))
    )
    branching = draw(
        st.none()
        | st.builds(
            Branching,
            p_parent=st.floats(0.0, 1.0),
            mean_branches=st.floats(1.0, 4.0),
            delay=st.sampled_from([Delay.exp(5.0), Delay.lognormal(1.0, 1.0)]),
        )
    )
    intent = IntentModel(
        "chitchat",
        p_continue=draw(st.floats(0.0, 0.9)),
        block_mean=draw(st.floats(1.0, 4.0)),
        max_turns=draw(st.integers(1, 8)),
    )
    return WorkloadModel((intent,), (1.0,), Sharing(prefixes, branching))


@settings(max_examples=30, deadline=None)
@given(
    model=sharing_models(),
    seed=st.integers(0, 2**32),
    block_size=st.integers(1, 32),
    conversations=st.integers(1, 40),
)
def test_any_sharing_model_gives_consistent_chains(
    model: WorkloadModel, seed: int, block_size: int, conversations: int
) -> None:
    trace = generate(
        model, lambda0=0.5, conversations=conversations, seed=seed, block_size=block_size
    )
    hashes = trace.block_hashes()
    assert hashes is not None
    check_ids(trace, hashes)
    check_branches(trace, hashes)
    assert lru_block(trace.sim_trace(), int(trace.blocks.sum())).tolist() == unbounded_reference(
        hashes
    )
    again = generate(
        model, lambda0=0.5, conversations=conversations, seed=seed, block_size=block_size
    )
    assert again.block_hashes() == hashes


def test_the_measurement_window_is_the_middle_of_the_roots_arrivals() -> None:
    """Branches start after their parents' turns, some long after the last root: the
    fractions measure the conversations whose first turn lies in the middle 60 % of the
    roots' arrival span, whatever the branches' tail; without branches they are 0.2 and 0.2."""
    from kvcast.lab.sim.measurement import first_times, measured_requests

    gen = generate(preset("production"), lambda0=2.0, conversations=1000, seed=7)
    assert gen.lineage is not None
    warmup, cooldown = gen.measurement_fractions()
    first = first_times(gen.conversation, gen.timestamp, gen.conversations)
    roots = gen.lineage.parent < 0
    r_lo, r_hi = first[roots].min(), first[roots].max()
    assert first.max() > r_hi + 0.5 * (r_hi - r_lo)  # the tail this is for
    mask, _ = measured_requests(gen.conversation, gen.timestamp, gen.conversations, warmup,
                                cooldown)  # fmt: skip
    starts = first[gen.conversation[mask]]
    assert starts.min() >= r_lo + 0.2 * (r_hi - r_lo) - 1e-6
    assert starts.max() <= r_hi - 0.2 * (r_hi - r_lo) + 1e-6
    middle = (first >= r_lo + 0.2 * (r_hi - r_lo) + 1e-6) & (
        first <= r_hi - 0.2 * (r_hi - r_lo) - 1e-6
    )
    assert set(np.flatnonzero(middle)) <= set(gen.conversation[mask].tolist())
    plain = generate(preset("shared_system"), lambda0=2.0, conversations=300, seed=7)
    assert plain.measurement_fractions() == (0.2, 0.2)
