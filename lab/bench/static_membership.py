"""What static membership (``group.instance.id``, KIP-345) does to a restart, against a broker.

    bash scripts/services.sh run .venv/bin/python -m kvcast.lab.bench.static_membership

Two members of one consumer group share a topic's partitions, with the consumer settings kvcast
uses (session 6 s, heartbeat 1 s, max poll 10 s). One stops (a static member leaves no
LeaveGroup behind: that is the point of it) and a new one starts under the same name, as a
restarted pod does. Printed per assignment and membership: seconds from the stop until the
restarted member holds partitions again (or ``never`` within ``--wait``), and how many
partitions the member that stayed had revoked meanwhile. On a broker that implements KIP-345
a static member gets its old partitions back at once, with no revocation anywhere; this is
the measurement kvcast's decision not to offer it rests on (docs/operating.md, "Rolling restarts").
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import uuid
from dataclasses import dataclass

from kafka import ConsumerRebalanceListener, KafkaConsumer
from kafka.admin import KafkaAdminClient, NewTopic

from kvcast.daemon.sources.kafka_source import ASSIGNORS


@dataclass(frozen=True)
class Restart:
    assignment: str
    static: bool
    back_after_s: float | None  # None: not within the wait
    revoked_from_the_other: int


class _Member(threading.Thread):
    """A consumer polling in its own thread (a join blocks the polling thread)."""

    def __init__(self, bootstrap: str, topic: str, group: str, assignment: str,
                 instance: str | None) -> None:  # fmt: skip
        super().__init__(daemon=True)
        self.revoked = 0
        self.held: list[int] = []
        self._stopping = threading.Event()
        options = {"group_instance_id": instance} if instance else {}
        self._consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
            session_timeout_ms=6000, heartbeat_interval_ms=1000, max_poll_interval_ms=10000,
            partition_assignment_strategy=(ASSIGNORS[assignment],), **options,
        )  # fmt: skip
        member = self

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked) -> None:  # type: ignore[no-untyped-def]
                member.revoked += len(revoked)

            def on_partitions_assigned(self, assigned) -> None:  # type: ignore[no-untyped-def]
                pass

        self._consumer.subscribe([topic], listener=Listener())
        self.start()

    def run(self) -> None:
        while not self._stopping.is_set():
            self._consumer.poll(timeout_ms=200)
            self.held = sorted(p.partition for p in self._consumer.assignment())
        self._consumer.close(autocommit=False)

    def stop(self) -> None:
        self._stopping.set()
        self.join()


def _wait_for(condition, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def measure(bootstrap: str, assignment: str, static: bool, partitions: int = 4,
            wait_s: float = 30.0) -> Restart:  # fmt: skip
    """One restart of one of two members (seconds, partitions)."""
    topic = f"static-membership-{uuid.uuid4().hex[:8]}"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(topic, partitions, 1)])
    admin.close()
    group = f"{topic}-group"
    names = ("pod-0", "pod-1") if static else (None, None)
    first = _Member(bootstrap, topic, group, assignment, names[0])
    other = _Member(bootstrap, topic, group, assignment, names[1])
    try:
        settled = _wait_for(lambda: len(first.held) + len(other.held) == partitions, wait_s)
        assert settled, f"the two members never held all {partitions} partitions"
        revoked_before = other.revoked
        first.stop()
        stopped = time.monotonic()
        restarted = _Member(bootstrap, topic, group, assignment, names[0])
        back = _wait_for(lambda: bool(restarted.held), wait_s)
        back_after = time.monotonic() - stopped if back else None
        revoked = other.revoked - revoked_before
        restarted.stop()
    finally:
        other.stop()
    return Restart(assignment, static, back_after, revoked)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--bootstrap", default=os.environ.get("KVCAST_TEST_KAFKA", "127.0.0.1:19092")
    )
    parser.add_argument("--wait", type=float, default=30.0, help="seconds to wait for a rejoin")
    args = parser.parse_args(argv)
    print("| assignment | membership | restarted member holds partitions after | "
          "partitions revoked from the other |")  # fmt: skip
    print("|---|---|---|---|")
    for assignment in ("cooperative-sticky", "range"):
        for static in (False, True):
            row = measure(args.bootstrap, assignment, static, wait_s=args.wait)
            back = "never" if row.back_after_s is None else f"{row.back_after_s:.1f} s"
            kind = "static" if static else "dynamic"
            print(f"| {assignment} | {kind} | {back} | {row.revoked_from_the_other} |")


if __name__ == "__main__":
    main()
