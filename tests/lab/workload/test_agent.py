"""The ``agent`` preset reproduces the coding-agent sessions' figures (issue 33 item 2).

The targets are the sessions' own: requests per conversation quartiles 19/45/101, input tokens
P10/P50/P90 43 K/110 K/300 K, think time quartiles 6/10/30 s (mean ~199 s), 85% tool calls,
6% ends of turn, 93-96% of a request in the next, 1 conversation in 40 spawning 3-4
sub-agents, a 15,000-token prefix in every conversation. Tolerances are about two and a half
standard errors of the fixed-seed sample (stated per test), so a wrong law fails.
"""

from __future__ import annotations

import math

import numpy as np
import orjson
import pytest
from scipy.special import ndtr

from kvcast.lab.workload.agent import TurnLaw
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.model import ground_truth
from kvcast.lab.workload.presets import AGENT_INTENTS, agent_model, preset
from kvcast.lab.workload.trace import Trace
from kvcast.stats.events import parse_event

ROOTS = 10_000  # ~0.75 M requests: the quantiles' standard errors are ~3%


@pytest.fixture(scope="module")
def big() -> Trace:
    return generate(preset("agent"), lambda0=0.05, conversations=ROOTS, seed=5, block_hashes=False)


@pytest.fixture(scope="module")
def small() -> Trace:
    return generate(preset("agent"), lambda0=0.05, conversations=300, seed=9)


def per_conversation(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Rows in (conversation, turn) order and the mask of consecutive rows of one conversation."""
    order = np.lexsort((trace.turn, trace.conversation))
    conv = trace.conversation[order]
    return order, conv[1:] == conv[:-1]


def roots_mask(trace: Trace) -> np.ndarray:
    assert trace.lineage is not None
    return trace.lineage.parent < 0


def test_requests_per_conversation_have_the_sessions_quartiles(big: Trace) -> None:
    counts = np.bincount(big.conversation, minlength=big.conversations)[roots_mask(big)]
    assert counts.size == ROOTS
    p25, p50, p75 = np.percentile(counts, [25, 50, 75])
    assert p25 == pytest.approx(19, rel=0.08)
    assert p50 == pytest.approx(45, rel=0.08)
    assert p75 == pytest.approx(101, rel=0.08)
    assert counts.max() <= 1178 and counts.min() >= 1
    # The Pareto tail above P75 (index 2) gives the sessions' maximum among ~600 of them.
    assert 0.001 < np.mean(counts >= 1000) < 0.004


def test_turn_law_cdf_matches_its_quantiles_and_its_draws() -> None:
    law = agent_model().turns
    assert law.cdf(np.array([19.0, 45.0, 101.0])) == pytest.approx([0.25, 0.5, 0.75])
    draws = law.draw(np.random.default_rng(0), 400_000)
    m = np.array([1, 5, 19, 30, 45, 80, 101, 300, 1000, 1177])
    empirical = (draws[:, None] <= m).mean(axis=0)
    assert np.max(np.abs(empirical - law.cdf(m.astype(float)))) < 0.004
    # E[M] from the survival function against the draws' mean (SE ~0.2 requests).
    assert law.mean == pytest.approx(draws.mean(), rel=0.02)
    assert law.survival()[0] == 1.0


def test_turn_law_rejects_bad_knots() -> None:
    with pytest.raises(ValueError, match="increasing quantile levels"):
        TurnLaw(((0.5, 45.0), (0.25, 19.0)), 2.0, 100)
    with pytest.raises(ValueError, match="max_turns"):
        TurnLaw(((0.5, 45.0),), 2.0, 10)


def test_input_tokens_have_the_sessions_deciles(big: Trace) -> None:
    rows = roots_mask(big)[big.conversation]
    p10, p50, p90 = np.percentile(big.input_tokens[rows], [10, 50, 90])
    assert p10 == pytest.approx(43_000, rel=0.08)
    assert p50 == pytest.approx(110_000, rel=0.08)
    assert p90 == pytest.approx(300_000, rel=0.08)


def test_each_request_holds_93_to_96_percent_of_the_next(big: Trace) -> None:
    order, same = per_conversation(big)
    tokens = big.input_tokens[order]
    share = (tokens[:-1] / tokens[1:])[same]
    grown = share < 1.0  # the rest are compactions
    # A compaction about every 40 requests of a long conversation: ln(400 K / 40 K) / ln(1.058).
    assert 0.01 < np.mean(~grown) < 0.03
    p25, p50, p75 = np.percentile(share[grown], [25, 50, 75])
    assert 0.925 <= p25 <= 0.935 and 0.94 <= p50 <= 0.95 and 0.955 <= p75 <= 0.965
    # A compacted request restarts at the prefix plus a summary, far below the window.
    assert np.all(tokens[1:][same][~grown] < 200_000)


def mixture_cdf(x: float) -> float:
    """The think time's CDF in closed form: the endings' shares times their shifted laws."""
    am = agent_model()
    total = 0.0
    for share, e in zip(am.shares, am.endings, strict=True):
        z = (math.log(max(x - am.response_s, 1e-300)) - e.delay.a) / e.delay.b
        total += share * float(ndtr(z))
    return total


def test_think_time_has_the_sessions_quartiles_and_mean(big: Trace) -> None:
    # The closed-form mixture is what the parameters were solved for...
    assert [mixture_cdf(x) for x in (6.0, 10.0, 30.0)] == pytest.approx(
        [0.25, 0.5, 0.75], abs=0.003
    )
    # ...and the generated waits reproduce it.
    order, same = per_conversation(big)
    wait = np.diff(big.timestamp[order])[same]
    p25, p50, p75 = np.percentile(wait, [25, 50, 75])
    assert (p25, p50, p75) == pytest.approx((6.0, 10.0, 30.0), rel=0.03)
    assert wait.mean() == pytest.approx(199.0, rel=0.1)  # SE ~1.5 s over ~0.75 M waits
    assert wait.min() >= agent_model().response_s
    assert wait.max() > 10 * 3600  # the heavy tail: hours (the sessions' maximum is 22 h)


def test_endings_are_the_events_intents_and_set_the_next_wait(big: Trace) -> None:
    assert big.intent_names == AGENT_INTENTS
    shares = np.bincount(big.intent, minlength=3) / len(big)
    assert shares == pytest.approx([0.85, 0.06, 0.09], abs=0.003)
    order, same = per_conversation(big)
    wait = np.diff(big.timestamp[order])[same]
    ending = big.intent[order][:-1][same]
    tool, stop = np.median(wait[ending == 0]), np.median(wait[ending == 1])
    assert tool < 15.0 < 300.0 < stop  # a machine answers in seconds, a person in minutes


def test_one_conversation_in_forty_spawns_three_or_four_short_subagents(big: Trace) -> None:
    lin = big.lineage
    assert lin is not None
    subs = np.flatnonzero(lin.parent >= 0)
    parents, count = np.unique(lin.parent[subs], return_counts=True)
    assert np.all(lin.parent[parents] < 0)  # sub-agents are a root's
    # 250 parents expected among 10,000 roots (SE 15.6).
    assert len(parents) / ROOTS == pytest.approx(1 / 40, abs=0.004)
    assert set(count.tolist()) == {3, 4} and abs(np.mean(count == 3) - 0.5) < 0.1
    sizes = np.bincount(big.conversation, minlength=big.conversations)[subs]
    assert np.median(sizes) == pytest.approx(8, abs=1.5)
    assert len(subs) / (big.conversations) < 0.1  # a small share of the conversations


def test_subagents_share_their_parents_prefix_and_every_root_the_system_prefix(
    small: Trace,
) -> None:
    lin = small.lineage
    hashes = small.block_hashes()
    assert lin is not None and hashes is not None
    first: dict[int, list[int]] = {}
    by_turn: dict[tuple[int, int], list[int]] = {}
    for c, t, ids in zip(small.conversation.tolist(), small.turn.tolist(), hashes, strict=True):
        by_turn[(c, t)] = ids
        if t == 1:
            first[c] = ids
    prefix = agent_model().prefix_tokens // small.block_size
    roots = np.flatnonzero(lin.parent < 0).tolist()
    heads = {tuple(first[c][:prefix]) for c in roots}
    assert len(heads) == 1 and prefix == 14  # one shared 15,000-token prefix: 14 full blocks
    # The block after the prefix is every conversation's own (prefix tokens and message).
    assert len({first[c][prefix] for c in roots}) == len(roots)
    subs = np.flatnonzero(lin.parent >= 0).tolist()
    assert subs, "the fixture's seed must give sub-agents"
    for s in subs:
        parent_ids = by_turn[(int(lin.parent[s]), int(lin.parent_turn[s]))]
        base = int(lin.base[s])
        assert base == len(parent_ids) - 1
        assert first[s][:base] == parent_ids[:base]  # the parent's full blocks at request k
        assert first[s][base] not in parent_ids


def test_block_ids_follow_the_growth_and_the_compactions(small: Trace) -> None:
    hashes = small.block_hashes()
    assert hashes is not None
    order, same = per_conversation(small)
    prefix = agent_model().prefix_tokens // small.block_size
    compacted = grown = 0
    for k in np.flatnonzero(same).tolist():
        a, b = hashes[order[k]], hashes[order[k + 1]]
        match = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
        if len(b) >= len(a):  # grown: all of the previous request but its partly filled tail
            assert match == len(a) - 1
            grown += 1
        else:  # compacted: only the shared prefix survives
            assert match == prefix
            compacted += 1
    assert grown > 10 * compacted > 0
    for ids, r, tokens in zip(
        hashes, small.blocks.tolist(), small.input_tokens.tolist(), strict=True
    ):
        assert len(ids) == r == math.ceil(tokens / 1024)


def test_events_follow_the_contract(small: Trace) -> None:
    lines = list(
        generate(
            preset("agent"), lambda0=0.05, conversations=40, seed=2, prompts=True
        ).jsonl_lines()
    )
    events = [parse_event(line) for line in lines]
    assert [e.timestamp for e in events] == sorted(e.timestamp for e in events)
    assert {e.intent for e in events} == set(AGENT_INTENTS)
    by_session: dict[str, list[int]] = {}
    for e in events:
        by_session.setdefault(e.session_id, []).append(e.turn)
        assert e.block_hashes is not None and len(e.block_hashes) == math.ceil(
            e.input_tokens / 1024
        )
    assert all(turns == list(range(1, len(turns) + 1)) for turns in by_session.values())
    assert orjson.loads(lines[0])["prompt"]


def test_deterministic_and_block_size_in_tokens() -> None:
    a = generate(preset("agent"), lambda0=0.05, conversations=50, seed=4)
    b = generate(preset("agent"), lambda0=0.05, conversations=50, seed=4)
    assert b"".join(a.jsonl_lines()) == b"".join(b.jsonl_lines())
    small_blocks = generate(preset("agent"), lambda0=0.05, conversations=50, seed=4, block_size=512)
    # The same conversations in tokens; only the blocks change.
    assert np.array_equal(a.input_tokens, small_blocks.input_tokens)
    assert np.array_equal(small_blocks.blocks, -(-a.input_tokens // 512))


def test_prompts_change_no_other_field() -> None:
    plain = generate(preset("agent"), lambda0=0.05, conversations=200, seed=8)
    texts = generate(preset("agent"), lambda0=0.05, conversations=200, seed=8, prompts=True)
    assert plain.lineage is not None and (plain.lineage.parent >= 0).any()  # sub-agents too
    for a, b in zip(plain.events(), texts.events(), strict=True):
        assert b.pop("prompt") and a == b


def test_cached_tokens_are_block_level_lru_hits() -> None:
    trace = generate(
        preset("agent"), lambda0=0.05, conversations=30, seed=6, cached_capacity_blocks=2000
    )
    assert trace.cached_tokens is not None
    assert np.all(trace.cached_tokens <= trace.input_tokens)
    first = trace.turn == 1
    roots = roots_mask(trace)[trace.conversation]
    # Only the shared prefix can hit on a root's first request, once another root stored it.
    assert np.all(trace.cached_tokens[first & roots] <= 14 * 1024)
    assert trace.cached_tokens[~first].sum() > 0.8 * trace.input_tokens[~first].sum()


def test_an_agent_model_has_no_closed_form_ground_truth() -> None:
    with pytest.raises(ValueError, match="agent model"):
        ground_truth(preset("agent"))
