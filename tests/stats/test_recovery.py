"""Statistics recover the generator's known parameters within their sampling error."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.model import ground_truth
from kvcast.lab.workload.presets import preset
from kvcast.stats.config import StatsConfig
from kvcast.stats.engine import StatsEngine
from kvcast.stats.events import parse_event

# Generated delays can exceed the product's 1800 s default; a longer timeout keeps every
# generated conversation whole so the truth applies unchanged.
CONFIG = StatsConfig(completion_timeout_s=1e6, max_turn=64, window_conversations=10**9)


@pytest.fixture(scope="module")
def mixed_run() -> tuple[StatsEngine, dict]:
    model = preset("mixed")
    trace = generate(model, lambda0=2.0, conversations=12_000, seed=42)
    engine = StatsEngine(CONFIG)
    for raw in trace.events():
        event = parse_event(raw)
        engine.apply(event, event.intent or "unknown")
    engine.finish()
    return engine, ground_truth(model)


def test_continuation_probabilities_within_sampling_error(mixed_run) -> None:
    engine, truth = mixed_run
    checked = 0
    for state in engine.snapshot().states:
        p = truth[state.intent].p_continue[state.turn - 1]
        if state.conversations < 200:
            continue
        standard_error = math.sqrt(p * (1 - p) / state.conversations)
        assert abs(state.p_continue - p) <= 4 * standard_error + 1e-9, state
        checked += 1
    assert checked >= 10


def test_median_reuse_delays_within_sampling_error(mixed_run) -> None:
    engine, truth = mixed_run
    checked = 0
    for state in engine.snapshot().states:
        if state.delay_samples < 200:
            continue
        law = truth[state.intent].delays[state.turn - 1]
        true_median = law.median_s
        # Sampling error of the log-mean of n draws: sd(log W) / sqrt(n).
        log_sd = law.b if law.kind == "lognormal" else math.pi / math.sqrt(6)
        tolerance = 4 * log_sd / math.sqrt(state.delay_samples)
        if law.kind == "lognormal":
            assert abs(math.log(state.median_reuse_s) - math.log(true_median)) <= tolerance
        else:
            # exp(mean log W) of an exponential is mean * exp(-euler_gamma), not its median.
            expected = law.mean_s * math.exp(-np.euler_gamma)
            assert abs(math.log(state.median_reuse_s) - math.log(expected)) <= tolerance
        checked += 1
    assert checked >= 10


def test_workload_moments_match_the_truth(mixed_run) -> None:
    engine, truth = mixed_run
    sample = engine.snapshot().sample
    for name, moments in zip(sample.intents, sample.by_intent, strict=True):
        t = truth[name]
        n = moments.conversations
        assert moments.sum_R / n == pytest.approx(t.A_R, rel=0.08)
        assert moments.sum_H_hash / n == pytest.approx(t.A_H_hash, rel=0.1)
        assert moments.sum_B / n == pytest.approx(t.E_B, rel=0.05)
        assert moments.sum_M / n == pytest.approx(t.E_M, rel=0.05)
    shares = {
        name: m.conversations / sample.conversations
        for name, m in zip(sample.intents, sample.by_intent, strict=True)
    }
    for name, t in truth.items():
        assert shares[name] == pytest.approx(t.share, abs=0.02)
    assert sample.lambda0 is not None
