"""A rolling restart: one of three replicas restarts, the other two keep their partitions.

Three ``kvcast run`` processes share a 6-partition topic and a Redis (real broker, real Redis).
One is stopped and started again while events keep coming. With ``--partition-assignment
cooperative-sticky`` (the default) the two that stayed keep the partitions they held: only the
restarted replica's share moves (straight back to it, or, when it is slow to rejoin, through the
others and then as many partitions on to it). With ``range`` (eager rebalancing,
kafka-python's default and kvcast's before) every rebalance revokes every partition of every
member, and the survivors reload. Either way, the statistics equal the offline reference. The
figures (partitions reloaded by each replica, seconds to caught-up) are printed.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from kvcast.lab.bench.soak import compare, last_offsets, stored_offsets, workload
from tests.support import produce, start_daemon

PARTITIONS = 6
LINE = re.compile(r"kvcast\.daemon\.runner: (assigned|revoked) (.+)$", re.M)


def moves(text: str) -> dict[str, int]:
    """Partitions assigned and revoked in a replica's log text."""
    counts = {"assigned": 0, "revoked": 0}
    for kind, names in LINE.findall(text):
        counts[kind] += len(names.split(", "))
    return counts


def held(text: str) -> set[str]:
    """The partitions a replica holds at the end of its log text."""
    holding: set[str] = set()
    for kind, names in LINE.findall(text):
        (holding.update if kind == "assigned" else holding.difference_update)(names.split(", "))
    return holding


def revoked(text: str) -> set[str]:
    return {name for kind, names in LINE.findall(text) if kind == "revoked"
            for name in names.split(", ")}  # fmt: skip


# Found by this test, once in a fresh-clone CI run (two xdist workers): the range case's
# replicas all published a hit ratio of 0.7505 where the offline reference gives 0.7507. The
# refresher expired window buckets below the oldest one its read had seen, and a partition
# behind the others (eager rebalancing pauses some partitions longer) committed older buckets
# between that read and the expiry: they were deleted. Now the bound holds for buckets
# committed in between (daemon/refresh.py expiry_bounds; tests/daemon/test_publisher.py
# reproduces it deterministically).


@pytest.mark.parametrize("kafka_topic", [PARTITIONS], indirect=True)
@pytest.mark.parametrize("assignment", ["cooperative-sticky", "range"])
def test_one_replica_restarts_and_the_others_keep_their_partitions(
    tmp_path: Path, kafka_bootstrap: str, kafka_topic: str, redis_url: str, redis_client,
    redis_namespace: str, assignment: str,
) -> None:  # fmt: skip
    lines = workload(4000, seed=11)
    records: list = []
    produce(kafka_bootstrap, kafka_topic, lines[:3000], records)
    flags = ("--partition-assignment", assignment)
    replicas = []
    for k in range(3):
        (tmp_path / str(k)).mkdir()
        replicas.append(start_daemon(tmp_path / str(k), kafka_bootstrap, kafka_topic, redis_url,
                                     redis_namespace, *flags))  # fmt: skip
    try:
        wait_stored(redis_client, redis_namespace, kafka_topic, records, 90)
        wait_settled(replicas, 60)
        marks = [len(r.text()) for r in replicas[:2]]
        assert replicas[2].stop() == 0
        restarted_at = time.monotonic()
        (tmp_path / "2b").mkdir()
        replicas[2] = start_daemon(tmp_path / "2b", kafka_bootstrap, kafka_topic, redis_url,
                                   redis_namespace, *flags)  # fmt: skip
        produce(kafka_bootstrap, kafka_topic, lines[3000:], records)
        wait_stored(redis_client, redis_namespace, kafka_topic, records, 90)
        caught_up_s = time.monotonic() - restarted_at
        wait_settled(replicas, 60)
        survivors = [moves(r.text()[mark:]) for r, mark in zip(replicas[:2], marks, strict=True)]
        restarted = moves(replicas[2].text())
        print(f"\n{assignment}: survivors {survivors}, restarted {restarted}, "
              f"caught up {caught_up_s:.1f} s after the restart")  # fmt: skip
        if assignment == "cooperative-sticky":
            # The two that stayed give up nothing they held before the restart. When the new
            # process is slow to join (a loaded machine), the stopped one's partitions pass
            # through them first, and as many move on to it (the assignor picks which).
            for replica, mark, moved in zip(replicas[:2], marks, survivors, strict=True):
                before, after = replica.text()[:mark], replica.text()[mark:]
                given_up = held(before) & revoked(after)
                assert len(given_up) <= moved["assigned"], (held(before), after)
            assert 1 <= restarted["assigned"] <= PARTITIONS // 2 + 1
        else:
            assert sum(m["revoked"] for m in survivors) >= 2, survivors  # all of theirs, twice
        assert compare(replicas[0], records) == []
    finally:
        for replica in replicas:
            replica.stop()


def wait_settled(replicas: list, timeout_s: float) -> None:
    """Until every replica holds a share and together they hold each partition once
    (cooperative rebalancing hands out a joining member's share in a second round)."""
    deadline = time.monotonic() + timeout_s
    while True:
        shares = [held(replica.text()) for replica in replicas]
        if all(shares) and sum(map(len, shares)) == len(set().union(*shares)) == PARTITIONS:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the group did not settle: {shares}")
        time.sleep(0.2)


def wait_stored(client, namespace: str, topic: str, records: list, timeout_s: float) -> None:
    want = last_offsets(records, PARTITIONS)
    deadline = time.monotonic() + timeout_s
    while stored_offsets(client, namespace, topic, PARTITIONS) != want:
        if time.monotonic() > deadline:
            got = stored_offsets(client, namespace, topic, PARTITIONS)
            raise TimeoutError(f"stored offsets {got}, want {want}")
        time.sleep(0.2)
