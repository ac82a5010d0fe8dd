"""The soak (``python -m kvcast.lab.bench.soak``) in a short version: about a minute of
steady load with kill -9 of the daemon and Redis restarts (SIGTERM and SIGKILL alternately);
the published statistics must equal the offline reference at the end."""

from __future__ import annotations

import pytest

from kvcast.lab.bench.soak import SoakResult, soak
from tests.reliability.tally import TALLY


@pytest.mark.integration
@pytest.mark.slow
def test_short_soak_with_kills_and_redis_restarts(tmp_path, kafka_bootstrap) -> None:
    result = soak(kafka_bootstrap, tmp_path, duration_s=45, kill_every_s=18,
                  redis_restart_every_s=12, rate=200, seed=3, say=lambda _: None)  # fmt: skip
    print(result.line())
    TALLY.add(
        faults=result.kills + result.redis_restarts, iterations=result.restarts_joined,
        events_compared=result.events, differences=len(result.differences),
    )  # fmt: skip
    assert result.differences == []
    assert result.kills >= 1 and result.redis_restarts >= 2
    assert result.restarts_joined == result.kills
    assert result.memory() is not None  # resident memory was sampled


def test_memory_summary_reads_the_longest_lived_daemon() -> None:
    mib = 1 << 20
    result = SoakResult(rss_samples=[(0, 0.0, 90 * mib), (0, 10.0, 95 * mib),
                                     (1, 0.0, 80 * mib), (1, 10.0, 85 * mib),
                                     (1, 20.0, 88 * mib), (1, 30.0, 89 * mib)])  # fmt: skip
    assert result.memory() == (95.0, 88.0, 89.0)
    assert "peak RSS 95 MiB" in result.line()
