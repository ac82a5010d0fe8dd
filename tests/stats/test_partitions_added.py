"""What adding partitions to the topic does to the conversations open at that moment (the
docs/operating.md's "Adding partitions"): each is counted as two, the turns before the change in the
old partition and the turns after it in the new one; the rest of the statistics stay exact.

Kafka's key hashing moves a session to another partition when the partition count changes.
The test broker cannot add partitions (no CreatePartitions), so the records are laid out as
the producer's partitioner would lay them out before and after, and go through the offline
path the daemon's tests compare against (one pipeline per partition, merged).
"""

from __future__ import annotations

import orjson

from kvcast.exporters.kit.index import PriorityIndex
from kvcast.stats.config import StatsConfig
from kvcast.stats.replay import offline_statistics
from kvcast.stats.table import table_document

CONFIG = StatsConfig(completion_timeout_s=900, allowed_lateness_s=30)
SESSIONS, TURNS, MOVED_AFTER = 20, 4, 2


def event(session: str, turn: int, t: float) -> bytes:
    return orjson.dumps({"session_id": session, "turn": turn, "timestamp": t,
                         "intent": "code_debugging", "input_tokens": 64 * turn,
                         "output_tokens": 32})  # fmt: skip


def records(partitions_added: bool) -> list[tuple[int, int, bytes]]:
    by_partition: dict[int, list[bytes]] = {}
    for s in range(SESSIONS):
        for turn in range(1, TURNS + 1):
            moved = partitions_added and turn > MOVED_AFTER
            partition = s % 2 + (2 if moved else 0)
            by_partition.setdefault(partition, []).append(
                event(f"s{s}", turn, 1000.0 * s + 60 * turn)
            )
    for partition in list(by_partition):  # a later event in each: its watermark moves on
        by_partition[partition].append(event(f"late-{partition}", 1, 1000.0 * SESSIONS + 5000))
    return [(p, offset, payload) for p, payloads in by_partition.items()
            for offset, payload in enumerate(payloads)]  # fmt: skip


def statistics(partitions_added: bool) -> tuple[int, PriorityIndex]:
    snapshot, rejected = offline_statistics(records(partitions_added), CONFIG)
    assert not rejected
    return snapshot.window_conversations, PriorityIndex(table_document(snapshot, CONFIG, 1))


def test_an_open_conversation_moved_to_a_new_partition_counts_as_two() -> None:
    stable_count, stable = statistics(partitions_added=False)
    split_count, split = statistics(partitions_added=True)
    assert stable_count == SESSIONS
    assert split_count == 2 * SESSIONS  # turns 1-2 in the old partition, 3-4 in the new
    # Before: every conversation went on after turn 2. After: the old partition saw each stop.
    assert stable.state("code_debugging", MOVED_AFTER)[1] == 1.0
    assert split.state("code_debugging", MOVED_AFTER)[1] == 0.0
    # Turn 3 on: the new partition's halves start there and go on as before.
    assert split.state("code_debugging", 3)[1] == stable.state("code_debugging", 3)[1] == 1.0
