"""Demo producer for the compose stack: a generated workload written to Kafka in paced time.

    python demo_producer.py --bootstrap kafka:9092 --topic requests --lambda 2 --speedup 4

Runs `kvcast generate` (intent-mixed preset, event times starting now, cached_tokens from an
LRU simulation so the observed hit ratio has data), then sends each event keyed by its
session_id when the wall clock reaches its timestamp, compressed by --speedup. Exits when the
workload is sent. Needs kvcast and kafka-python (both in the kvcast image).
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

import orjson
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="kafka:9092")
    parser.add_argument("--topic", default="requests")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--lambda", dest="rate", type=float, default=2.0, help="conversations/s")
    parser.add_argument("--duration", type=float, default=14400, help="arrival window (s)")
    parser.add_argument("--speedup", type=float, default=4.0, help="event s per wall s")
    parser.add_argument("--capacity-blocks", type=int, default=2275, help="for cached_tokens")
    return parser.parse_args()


def ensure_topic(bootstrap: str, topic: str, partitions: int, wait_s: float = 120) -> None:
    """Create the topic (keyed by session) unless it exists; retry while the broker starts."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap)
            try:
                admin.create_topics([NewTopic(topic, partitions, 1)])
            except TopicAlreadyExistsError:
                pass
            finally:
                admin.close()
            return
        except KafkaError as exc:
            if time.monotonic() > deadline:
                raise
            print(f"demo-producer: waiting for Kafka at {bootstrap} ({exc})", flush=True)
            time.sleep(2)


def generate(args: argparse.Namespace, out: Path, start: float) -> None:
    command = ["kvcast", "generate", str(out), "--preset", "mixed", "--lambda", str(args.rate)]
    command += ["--duration", str(args.duration), "--start-time", f"{start:.3f}"]
    command += ["--cached-capacity-blocks", str(args.capacity_blocks)]
    subprocess.run(command, check=True)


def main() -> None:
    args = parse_args()
    ensure_topic(args.bootstrap, args.topic, args.partitions)
    producer = KafkaProducer(bootstrap_servers=args.bootstrap, linger_ms=50)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "workload.jsonl"
        start = time.time()
        generate(args, path, start)
        sent = 0
        with path.open("rb") as lines:
            for line in lines:
                event = orjson.loads(line)
                delay = start + (event["timestamp"] - start) / args.speedup - time.time()
                if delay > 0:
                    time.sleep(delay)
                producer.send(args.topic, key=event["session_id"].encode(), value=line.strip())
                sent += 1
                if sent % 10000 == 0:
                    print(f"demo-producer: sent {sent} events", flush=True)
    producer.flush()
    print(f"demo-producer: done, {sent} events to {args.topic}", flush=True)


if __name__ == "__main__":
    main()
