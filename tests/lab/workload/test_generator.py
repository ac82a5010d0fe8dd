"""The workload generator: determinism, block bookkeeping, and agreement with its ground truth."""

from __future__ import annotations

import itertools
import math

import numpy as np
import orjson
import pytest

from kvcast.lab.sim.lru import lru_conversation_hits
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.model import Delay, IntentModel, WorkloadModel, ground_truth
from kvcast.lab.workload.presets import AGENT_PRESETS, PRESETS, preset
from kvcast.stats.events import parse_event


@pytest.fixture(scope="module")
def mixed_trace():
    return generate(preset("mixed"), lambda0=4.0, duration_s=8000, seed=7)


def test_deterministic_by_seed() -> None:
    a = generate(preset("mixed"), lambda0=1.0, duration_s=300, seed=3, prompts=True)
    b = generate(preset("mixed"), lambda0=1.0, duration_s=300, seed=3, prompts=True)
    c = generate(preset("mixed"), lambda0=1.0, duration_s=300, seed=4, prompts=True)
    assert b"".join(a.jsonl_lines()) == b"".join(b.jsonl_lines())
    assert b"".join(a.jsonl_lines()) != b"".join(c.jsonl_lines())


# The agent presets' requests change intent and compact (tests/lab/workload/test_agent.py).
@pytest.mark.parametrize("name", [n for n in PRESETS if n not in AGENT_PRESETS])
def test_events_follow_the_contract_and_the_block_bookkeeping(name: str) -> None:
    bs = 16
    trace = generate(
        preset(name),
        lambda0=2.0,
        duration_s=400,
        seed=1,
        prompts=True,
        cached_capacity_blocks=500,
        block_size=bs,
    )
    events = [parse_event(line) for line in trace.jsonl_lines()]
    assert len(events) == len(trace) > 0
    ts = [e.timestamp for e in events]
    assert ts == sorted(ts)
    by_conv: dict[str, list] = {}
    for e in events:
        assert math.ceil(e.input_tokens / bs) >= 1
        assert e.prompt and e.intent
        assert e.cached_tokens is not None and 0 <= e.cached_tokens <= e.input_tokens
        by_conv.setdefault(e.session_id, []).append(e)
    assert len(by_conv) == trace.conversations
    for conv in by_conv.values():
        assert [e.turn for e in conv] == list(range(1, len(conv) + 1))
        assert len({e.intent for e in conv}) == 1
        blocks = [math.ceil(e.input_tokens / bs) for e in conv]
        assert all(b2 - b1 >= 1 for b1, b2 in itertools.pairwise(blocks))
        assert conv[0].cached_tokens == 0
    assert np.array_equal(-(-trace.input_tokens // bs), trace.blocks)
    hits = lru_conversation_hits(trace.conversation, trace.blocks, 500)
    assert np.array_equal(trace.cached_tokens, np.minimum(hits * bs, trace.input_tokens))


def test_no_prompts_no_cached_tokens_by_default() -> None:
    ev = orjson.loads(next(generate(preset("single"), lambda0=1.0, conversations=3).jsonl_lines()))
    assert "prompt" not in ev and "cached_tokens" not in ev
    assert set(ev) == {
        "session_id",
        "turn",
        "timestamp",
        "input_tokens",
        "output_tokens",
        "request_id",
        "intent",
    }


def test_arrival_rate(mixed_trace) -> None:
    n, mean = mixed_trace.conversations, 4.0 * 8000
    assert abs(n - mean) < 4 * math.sqrt(mean)
    firsts = mixed_trace.timestamp[mixed_trace.turn == 1]
    assert firsts.min() >= 0 and firsts.max() < 8000
    fixed = generate(preset("single"), lambda0=0.5, conversations=5000, seed=2)
    starts = np.sort(fixed.timestamp[fixed.turn == 1])
    assert fixed.conversations == 5000 and starts[0] == 0.0
    gaps = np.diff(starts)
    assert abs(gaps.mean() - 2.0) < 4 * 2.0 / math.sqrt(gaps.size)


def test_continuation_and_median_delay_match_the_truth(mixed_trace) -> None:
    truth = ground_truth(preset("mixed"))
    tr = mixed_trace
    order = np.lexsort((tr.turn, tr.conversation))
    conv, turn, ts = tr.conversation[order], tr.turn[order], tr.timestamp[order]
    intent = tr.intent[order]
    nxt = np.flatnonzero(conv[1:] == conv[:-1])  # row k -> k + 1 is the next turn
    delay, d_turn, d_intent = ts[nxt + 1] - ts[nxt], turn[nxt], intent[nxt]
    checked = 0
    for k, name in enumerate(tr.intent_names):
        t_true = truth[name]
        assert (intent[turn == 1] == k).mean() == pytest.approx(t_true.share, abs=0.02)
        for t in range(1, 6):
            reach = int(np.sum((intent == k) & (turn == t)))
            if reach < 300:
                continue
            p_true = float(t_true.p_continue[t - 1])
            p_hat = np.sum((intent == k) & (turn == t + 1)) / reach
            assert abs(p_hat - p_true) < 4 * math.sqrt(p_true * (1 - p_true) / reach), (name, t)
            w = delay[(d_intent == k) & (d_turn == t)]
            m_true = float(t_true.median_delay_s[t - 1])
            se = 1.0 / (2.0 * t_true.delays[t - 1].pdf(m_true) * math.sqrt(w.size))
            assert abs(np.median(w) - m_true) < 4 * se, (name, t, np.median(w), m_true)
            checked += 1
    assert checked >= 10


def test_workload_moments_match_the_truth() -> None:
    model = preset("single")
    t_true = ground_truth(model)["general_explanations_definitions"]
    tr = generate(model, lambda0=5.0, duration_s=4000, seed=9)
    n = tr.conversations
    last = np.zeros(n, np.int64)
    np.maximum.at(last, tr.conversation, tr.blocks)
    turns = np.bincount(tr.conversation, minlength=n)
    a_r = tr.blocks.sum() / n
    assert a_r == pytest.approx(t_true.A_R, rel=0.04)
    assert last.mean() == pytest.approx(t_true.E_B, rel=0.03)
    assert turns.mean() == pytest.approx(t_true.E_M, rel=0.03)
    assert a_r - last.mean() == pytest.approx(t_true.A_H, rel=0.04)  # sum_{j<M} R_j


def test_ground_truth_of_single_preset() -> None:
    t = ground_truth(preset("single"))["general_explanations_definitions"]
    assert t.p_continue[:10] == pytest.approx([0.78] * 10)
    assert t.p_continue[-1] == 0.0
    assert t.median_delay_s[0] == pytest.approx(135 * math.log(2))
    e_m, a_r = t.E_M, t.A_R
    assert e_m == pytest.approx(1 / 0.22, rel=1e-6)
    assert a_r == pytest.approx(3 / 0.22**2, rel=1e-5)
    assert t.A_H_hash == pytest.approx(t.A_H - (t.E_M - 1))
    assert float(t.delay_cdf(135.0)) == pytest.approx(1 - math.exp(-1))
    assert float(t.delays[0].distribution().cdf(135.0)) == pytest.approx(1 - math.exp(-1))


def test_per_turn_laws_and_validation() -> None:
    m = IntentModel(
        "chitchat",
        p_continue=(0.9, 0.5),
        delay=(Delay.exp(10), Delay.lognormal(3, 1)),
        delay_growth=2.0,
        max_turns=4,
    )
    assert m.continuation().tolist() == [0.9, 0.5, 0.5, 0.0]
    assert m.delay_at(1).median_s == pytest.approx(10 * math.log(2))
    assert m.delay_at(3).median_s == pytest.approx(math.exp(3) * 4)
    model = WorkloadModel((m,), (1.0,))
    tr = generate(model, lambda0=1.0, conversations=200, seed=0)
    assert tr.turn.max() <= 4
    with pytest.raises(ValueError):
        generate(model, lambda0=1.0, conversations=10, duration_s=10)
    empty = generate(model, lambda0=1e-9, duration_s=1.0, cached_capacity_blocks=5, prompts=True)
    assert len(empty) == 0 and list(empty.events()) == []
    with pytest.raises(ValueError):
        preset("nope")
    with pytest.raises(ValueError):
        IntentModel("x", block_mean=0.5)


@pytest.mark.parametrize("law", [Delay.exp(135.0), Delay.lognormal(4.6, 1.0)])
def test_a_delay_law_is_the_stats_distribution(law: Delay) -> None:
    """The workload's laws are the forecast's (kvcast.stats.delays), not a copy of them."""
    dist = law.distribution()
    x = np.array([0.0, 3.9, 135.0, 1e4])
    assert law.cdf(x).tolist() == dist.cdf(x).tolist()
    assert (law.mean_s, law.median_s) == (dist.mean, dist.median)
    assert law.pdf(60.0) == float(dist.pdf(60.0))
    with pytest.raises(ValueError, match="positive"):
        Delay.exp(float("inf"))
    with pytest.raises(ValueError, match="kind"):
        Delay("weibull", 1.0)


def test_a_delay_draws_from_one_standard_stream() -> None:
    exp, logn = Delay.exp(10.0), Delay.lognormal(3.0, 0.5)
    want_exp = 10.0 * np.random.default_rng(4).standard_exponential(5)
    want_logn = np.exp(3.0 + 0.5 * np.random.default_rng(4).standard_normal(5))
    assert exp.sample(np.random.default_rng(4), 5).tolist() == want_exp.tolist()
    assert logn.sample(np.random.default_rng(4), 5).tolist() == want_logn.tolist()
