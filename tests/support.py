"""Helpers shared by tests: a valid event, comparable forms of results, producing events, a
daemon's readiness, the native replay engine's presence."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from kvcast.stats.documents import ForecastDocument
from kvcast.stats.forecast import Forecast
from kvcast.stats.native.replay import native_available
from kvcast.stats.snapshot import Snapshot
from tests import services

if TYPE_CHECKING:
    from pathlib import Path

    from kvcast.lab.bench.processes import DaemonProcess
    from kvcast.lab.bench.soak import Records


# A well-formed event with only the required fields (the event contract's tests start from it).
VALID = {
    "session_id": "s-1",
    "turn": 2,
    "timestamp": 1700000000.25,
    "input_tokens": 300,
    "output_tokens": 40,
}


class Served(Protocol):
    url: str


def canonical(snapshot: Snapshot) -> tuple:
    """Everything a snapshot says, as a tuple that compares exactly (arrays as bytes)."""
    s = snapshot.sample
    return (
        snapshot.states,
        s.intents,
        s.by_intent,
        s.delay_s.tobytes(),
        s.prev_blocks.tobytes(),
        s.intent.tobytes(),
        s.turn.tobytes(),
        None if s.prev_shared is None else s.prev_shared.tobytes(),
        None if s.shared_gap_s is None else s.shared_gap_s.tobytes(),
        None if s.shared_gap_blocks is None else s.shared_gap_blocks.tobytes(),
        s.lambda0,
        s.observed_hit_ratio,
        snapshot.window_conversations,
    )


def produce(bootstrap: str, topic: str, lines: list[bytes], records: Records) -> None:
    """Send ``lines`` keyed by session (hostile ones under one key); append (partition, offset,
    line) of each, acknowledged, to ``records``."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    futures = [(producer.send(topic, key=_key(line), value=line), line) for line in lines]
    producer.flush()
    for future, line in futures:
        metadata = future.get(timeout=10)
        records.append((metadata.partition, metadata.offset, line))
    producer.close()


def _key(line: bytes) -> bytes:
    try:
        return str(orjson.loads(line)["session_id"]).encode()
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return b"hostile"


def readiness(daemon: Served) -> tuple[int, dict]:
    """(HTTP status, body) of the daemon's ``/readyz``."""
    try:
        with urllib.request.urlopen(daemon.url + "/readyz", timeout=5) as response:
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, orjson.loads(error.read())


def require_native() -> None:
    """Fail (in CI) or skip (elsewhere) unless the native replay engine was built."""
    if not native_available():
        services.unavailable(
            "kvcast.stats.native._replay is not built (make setup builds it; needs a C compiler)"
        )


def daemon_args(
    bootstrap: str, topic: str, store_url: str, namespace: str, *extra: str
) -> list[str]:
    """``kvcast run`` flags for a Kafka topic and a store namespace, with the suite's fast
    intervals and statistics settings (``FAST_FLAGS``, ``STATS_FLAGS``) after ``extra``."""
    from kvcast.lab.bench.soak import FAST_FLAGS, STATS_FLAGS

    return ["--source", f"kafka://{bootstrap}/{topic}", "--store", store_url,
            "--namespace", namespace, *extra, *FAST_FLAGS, *STATS_FLAGS]  # fmt: skip


def start_daemon(
    log_dir: Path, bootstrap: str, topic: str, store_url: str, namespace: str, *extra: str
) -> DaemonProcess:
    """``kvcast run`` started on :func:`daemon_args`, logging to ``log_dir/daemon.log``."""
    from kvcast.lab.bench.processes import DaemonProcess

    return DaemonProcess(
        daemon_args(bootstrap, topic, store_url, namespace, *extra), log_dir / "daemon.log"
    )


def shared_prefix_events(
    conversations: int = 300,
    *,
    seed: int = 0,
    rate_per_s: float = 1.0,
    prompts: int = 3,
    prompt_blocks: int = 4,
    fork_share: float = 0.2,
    block_size: int = 16,
) -> list[dict]:
    """Events with ``block_hashes`` whose conversations share prefixes, in timestamp order.

    Each conversation starts with one of ``prompts`` system prompts (``prompt_blocks`` blocks,
    the first ones twice as popular as the next), or, with probability ``fork_share``, with the
    full blocks of an earlier request of any conversation (a branch); then its own blocks, 1-3
    more a turn, and a partly filled last block of its own. Every request repeats the full
    blocks of the one before it (ids are whole-prefix ids).
    """
    import random

    rng = random.Random(seed)
    weights = [2.0**-k for k in range(prompts)]
    branch_points: list[list[int]] = []  # every request's full blocks so far
    events = []
    start = 0.0
    next_id = 1_000_000
    for c in range(conversations):
        start += rng.expovariate(rate_per_s)
        if branch_points and rng.random() < fork_share:
            ids = list(rng.choice(branch_points))
        else:
            prompt = rng.choices(range(prompts), weights)[0]
            ids = [prompt * 1000 + k for k in range(prompt_blocks)]
        t = start
        turns = 1 + min(int(rng.expovariate(0.5)), 6)
        for turn in range(1, turns + 1):
            for _ in range(rng.randint(1, 3)):
                ids.append(next_id)
                next_id += 1
            branch_points.append(list(ids))
            # The last block is partly filled: its id is the request's own (the next turn's
            # longer prompt fills it, under another id).
            events.append(
                {
                    "session_id": f"c{c}",
                    "turn": turn,
                    "timestamp": round(t, 3),
                    "input_tokens": len(ids) * block_size + block_size // 2,
                    "output_tokens": 10,
                    "block_hashes": [*ids, next_id],
                }
            )
            next_id += 1
            t += rng.expovariate(1 / 40.0)
    events.sort(key=lambda e: (e["timestamp"], e["turn"]))
    return events


def forecast_doc(computed_at: float = 1_000.0, **model: Any) -> ForecastDocument:
    """A published forecast document whose model has the given ``Forecast`` fields (the rest:
    an intent forecast of 1,000 blocks of 16 tokens, one instance), computed at
    ``computed_at`` (Unix s), with no target, event time or window."""
    fields: dict[str, Any] = {
        "status": "ok",
        "variant": "intent",
        "displacement": "whole",
        "capacity_blocks": 1_000.0,
        "block_size": 16,
        "instances": 1,
        **model,
    }
    return ForecastDocument(Forecast(**fields), (), None, 0, computed_at)
