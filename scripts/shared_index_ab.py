"""The daemon's Python pipeline on events with block_hashes: the shared-prefix index in C, in
Python and off, in one process, in turns.

    .venv/bin/python scripts/shared_index_ab.py [CONVERSATIONS] [ROUNDS]

The workload is `kvcast bench --suite throughput`'s (`shared_system`, lambda 2, seed 0; the
bench takes a quarter of its 20,000 conversations). Rates are per second of this process's CPU
time, best of ROUNDS, so that other work on a shared machine moves them less than the wall
clock's; each is printed with its ratio to the rate with the index off. The rounds run the
three in turns, forward and backward.
"""

from __future__ import annotations

import sys
import time

from kvcast.lab.bench.throughput import daemon_pipeline
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from kvcast.stats import conversations, shared_prefix
from kvcast.stats.config import StatsConfig


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    trace = generate(preset("shared_system"), lambda0=2.0, conversations=count, seed=0)
    lines = list(trace.jsonl_lines())
    works = {"off": (StatsConfig(shared_index_blocks=0), shared_prefix.SharedPrefixIndex)}
    if hasattr(shared_prefix, "NativeSharedPrefixIndex"):
        works["c"] = (StatsConfig(), shared_prefix.NativeSharedPrefixIndex)
    works["python"] = (StatsConfig(), shared_prefix.PySharedPrefixIndex)
    best = dict.fromkeys(works, float("inf"))
    for round_ in range(rounds):
        # Forward, then backward: what runs after what (the allocator's, the caches' state)
        # moved a rate by up to 10 %, so each order gets half the rounds.
        order = list(works.items()) if round_ % 2 == 0 else list(works.items())[::-1]
        for name, (config, index) in order:
            conversations.SharedPrefixIndex = index  # the class the tracker builds
            started = time.process_time()
            daemon_pipeline(lines, config)
            best[name] = min(best[name], time.process_time() - started)
    off = len(lines) / best["off"]
    print(f"{len(lines):,} events")
    for name, seconds in best.items():
        rate = len(lines) / seconds
        print(f"{name:>6}: {rate:,.0f} events/s, {rate / off:.3f} of the rate with the index off")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
