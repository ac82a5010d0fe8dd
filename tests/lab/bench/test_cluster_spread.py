"""The cluster-spread benchmark counts every commit once, on the master owning its slot."""

from __future__ import annotations

import pytest

from kvcast.lab.bench.cluster_spread import run_cluster_spread

pytestmark = pytest.mark.integration


def test_every_commit_is_one_exec_and_they_spread(redis_cluster) -> None:
    rows = run_cluster_spread(redis_cluster, partitions=(1, 16), conversations=200)
    one, sixteen = rows
    # The session's cluster is this process's own (each pytest-xdist worker starts one) and
    # its tests run one at a time: the EXECs counted are exactly these commits.
    assert sum(one.execs.values()) == one.commits and max(one.execs.values()) == one.commits
    assert sum(sixteen.execs.values()) == sixteen.commits
    assert sum(1 for calls in sixteen.execs.values() if calls) >= 2
