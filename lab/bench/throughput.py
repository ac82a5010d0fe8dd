"""Throughput of the statistics path, against merely decoding the same JSON lines.

The baseline is ``orjson.loads`` over the same lines in the same run, so the ratio says how
much of the per-event budget the contract, the tracker and the window take on this machine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import orjson

from kvcast.lab.bench.timing import best_in_turn
from kvcast.lab.sim.registry import simulate
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import preset
from kvcast.stats.config import StatsConfig
from kvcast.stats.events import parse_event
from kvcast.stats.native.replay import native_available
from kvcast.stats.replay import Pipeline, replay_lines


@dataclass(frozen=True)
class ThroughputResult:
    """Events per second of each stage over ``events`` lines (best of ``repeats`` runs)."""

    events: int
    decode_per_s: float
    parse_per_s: float
    pipeline_per_s: float
    python_pipeline_per_s: float
    simulate_per_s: float
    replay_engine: str
    # The daemon pipeline on events with block_hashes (preset shared_system), the shared-prefix
    # index on (the default) and off: what the index costs per event.
    shared_events: int = 0
    shared_index_per_s: float = 0.0
    shared_index_off_per_s: float = 0.0

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(benchmark, figure, baseline, ratio) rows for the benchmark table."""
        decode = f"{self.decode_per_s:,.0f} lines/s (orjson.loads)"

        def ratio(value: float) -> str:
            return f"{value / self.decode_per_s:.2f}"

        return [
            (
                "parse_event (contract)",
                f"{self.parse_per_s:,.0f} events/s",
                decode,
                ratio(self.parse_per_s),
            ),
            (
                f"replay pipeline (parse + track + window, {self.replay_engine} engine)",
                f"{self.pipeline_per_s:,.0f} events/s",
                decode,
                ratio(self.pipeline_per_s),
            ),
            (
                "daemon pipeline (the same, Python engine, per event)",
                f"{self.python_pipeline_per_s:,.0f} events/s",
                decode,
                ratio(self.python_pipeline_per_s),
            ),
            (
                "daemon pipeline, events with block_hashes (shared_system, 16-token blocks), "
                "shared-prefix index on",
                f"{self.shared_index_per_s:,.0f} events/s",
                f"{self.shared_index_off_per_s:,.0f} events/s (index off: --shared-index-blocks 0)",
                f"{self.shared_index_per_s / self.shared_index_off_per_s:.2f}",
            ),
            (
                "Algorithm 1 simulator (from arrays)",
                f"{self.simulate_per_s:,.0f} requests/s",
                decode,
                ratio(self.simulate_per_s),
            ),
        ]

    def to_dict(self) -> dict[str, float | str]:
        return {
            "events": self.events,
            "decode_per_s": self.decode_per_s,
            "parse_per_s": self.parse_per_s,
            "pipeline_per_s": self.pipeline_per_s,
            "replay_engine": self.replay_engine,
            "python_pipeline_per_s": self.python_pipeline_per_s,
            "simulate_per_s": self.simulate_per_s,
            "shared_events": self.shared_events,
            "shared_index_per_s": self.shared_index_per_s,
            "shared_index_off_per_s": self.shared_index_off_per_s,
            "pipeline_vs_decode": self.pipeline_per_s / self.decode_per_s,
            "python_pipeline_vs_decode": self.python_pipeline_per_s / self.decode_per_s,
        }


def _best_rates(
    count: int, works: dict[str, Callable[[], object]], repeats: int
) -> dict[str, float]:
    """Best rate of each stage (per second); the stages take turns in each round."""
    return {name: count / seconds for name, seconds in best_in_turn(repeats, works).items()}


def daemon_pipeline(lines: Iterable[bytes | str], config: StatsConfig) -> None:
    """What the daemon runs per event, over ``lines``: each offered on its own (not the
    replay's native engine), the input finished, one snapshot."""
    runner = Pipeline(config)
    for line in lines:
        runner.offer(line)
    runner.engine.finish()
    runner.engine.snapshot()


def run_throughput(
    conversations: int = 20_000, seed: int = 0, repeats: int = 5
) -> ThroughputResult:
    """Generate a ``mixed`` workload and time each stage on its JSON lines."""
    trace = generate(preset("mixed"), lambda0=2.0, conversations=conversations, seed=seed)
    lines = list(trace.jsonl_lines())
    config = StatsConfig()

    def decode() -> None:
        for line in lines:
            orjson.loads(line)

    def parse() -> None:
        for line in lines:
            parse_event(line)

    def pipeline() -> None:  # what `kvcast replay` runs
        replay_lines(lambda: [lines], config).snapshot()

    def python_pipeline() -> None:  # what the daemon runs per event
        daemon_pipeline(lines, config)

    sim_trace = trace.sim_trace()

    def sim() -> None:
        simulate(sim_trace, 4000)

    shared = generate(
        preset("shared_system"), lambda0=2.0, conversations=max(1, conversations // 4), seed=seed
    )
    shared_lines = list(shared.jsonl_lines())

    def daemon_on(config: StatsConfig) -> Callable[[], None]:
        def run() -> None:
            daemon_pipeline(shared_lines, config)

        return run

    works = {"decode": decode, "parse": parse, "pipeline": pipeline}
    works |= {"python_pipeline": python_pipeline, "sim": sim}
    rates = _best_rates(len(lines), works, repeats)
    shared_rates = _best_rates(
        len(shared_lines),
        {
            "on": daemon_on(config),
            "off": daemon_on(StatsConfig(shared_index_blocks=0)),
        },
        repeats,
    )
    return ThroughputResult(
        events=len(lines),
        decode_per_s=rates["decode"],
        parse_per_s=rates["parse"],
        pipeline_per_s=rates["pipeline"],
        python_pipeline_per_s=rates["python_pipeline"],
        simulate_per_s=rates["sim"],
        replay_engine="native" if native_available() else "python",
        shared_events=len(shared_lines),
        shared_index_per_s=shared_rates["on"],
        shared_index_off_per_s=shared_rates["off"],
    )
