"""Producer intents count the same in every process: the taxonomy decides, not arrival order.

Against a real broker, Redis and ``kvcast run``: 80 junk intents sent first on both partitions
(label squatting: before, a process kept the first 64 labels it saw and folded everything
after, real intents included, into ``unknown``), then a workload of taxonomy intents and a
deployment's own (``--taxonomy-file``). The published table equals the offline reference of
the same records, and the real intents are states of their own.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from kvcast.lab.bench.processes import wait_until
from kvcast.lab.bench.soak import STATS, Records, workload
from kvcast.stats.replay import offline_statistics
from kvcast.stats.taxonomy import label_map
from tests.reliability.tally import TALLY
from tests.support import produce, readiness, start_daemon

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OWN = ("billing", "triage")


def squatting_then_real(events: int) -> list[bytes]:
    """80 events with junk intents, then ``events`` with taxonomy and own intents."""
    junk = [
        orjson.dumps({"session_id": f"junk-{n}", "turn": 1, "timestamp": 0.5 + n / 1000,
                      "input_tokens": 64, "output_tokens": 8, "intent": f"junk-{n}"})
        for n in range(80)
    ]  # fmt: skip
    real = []
    for n, line in enumerate(workload(events, seed=51)):
        event = orjson.loads(line)
        if n % 5 == 0:
            event["intent"] = OWN[n % 2]
        real.append(orjson.dumps(event))
    return junk + real


@pytest.mark.parametrize("kafka_topic", [2], indirect=True)
def test_junk_intents_sent_first_cannot_squat_the_table(
    tmp_path: Path, kafka_bootstrap: str, kafka_topic: str, redis_url: str, redis_namespace: str
) -> None:
    own = tmp_path / "intents.txt"
    own.write_text("\n".join(OWN) + "\n")
    records: Records = []
    produce(kafka_bootstrap, kafka_topic, squatting_then_real(1200), records)
    daemon = start_daemon(tmp_path, kafka_bootstrap, kafka_topic, redis_url, redis_namespace,
                          "--taxonomy-file", str(own))  # fmt: skip
    try:
        snapshot, _ = offline_statistics(records, STATS, label_map(30, OWN))
        expected = {(s.intent, s.turn): s.conversations for s in snapshot.states}

        def published() -> dict[tuple[str, int], int] | None:
            try:
                table = daemon.get("/v1/table")
            except OSError:
                return None
            return {(s["intent"], s["turn"]): s["conversations"] for s in table["states"]}

        wait_until(lambda: published() == expected, 60, "the table of the offline reference")
        intents = {intent for intent, _ in expected}
        assert {"billing", "triage", "code_debugging", "chitchat"} <= intents
        assert not any(intent.startswith("junk-") for intent in intents)
        assert readiness(daemon)[0] == 200
        TALLY.add(hostile_inputs=80, events_compared=len(records))
        assert daemon.stop() == 0
    finally:
        if daemon.process.poll() is None:
            daemon.stop()
