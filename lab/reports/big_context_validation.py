"""The forecast where one conversation's context is a sizeable share of the cache (issue 33).

Block-level LRU (``kvcast simulate --granularity block --policy lru``) against the forecast
with each finite-size refinement, measured by request time once the stream is stationary
(from ``warmup_fraction`` of the arrival window to its end: agent conversations run for hours,
so the first hours of a generated stream are lighter than the rest, and a measurement by
first-turn times would count the drain after the arrivals stop). The forecast's rate is the
conversation starts per second over the same interval (``steady_sample``).

Workloads: ``tool_loop`` (agents calling tools every few seconds, 6-16 requests, ~45-block
contexts: stationary within an hour, the test's workload, seeds 1 and 2) and the ``agent``
preset (coding agents: a 15,000-token shared prefix, sub-agents, compaction at 400 K tokens).

``python -m kvcast.lab.reports.big_context_validation [--quick]`` prints a Markdown table.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from kvcast.lab.reports.samples import steady_sample
from kvcast.lab.reports.workloads import AGENT_BLOCK_SIZE as BLOCK_SIZE
from kvcast.lab.reports.workloads import (
    AGENT_DURATION_S,
    AGENT_LAMBDA0,
    AGENT_SEED,
    AGENT_WARMUP,
)
from kvcast.lab.sim.registry import get_policy
from kvcast.lab.workload.agent import TurnLaw
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.model import IntentModel, WorkloadModel
from kvcast.lab.workload.presets import agent
from kvcast.stats.forecast import forecast_from_sample

REFINEMENTS = ("tagged", "fluctuation", "partial")


def tool_loop() -> WorkloadModel:
    """Agents that call tools every few seconds: 6-16 requests, ~45-block contexts."""
    model = agent()
    am = model.agent
    assert am is not None
    am = replace(
        am,
        prefix_tokens=0,
        subagent_share=0.0,
        turns=TurnLaw(((0.25, 6.0), (0.5, 10.0), (0.75, 16.0)), tail_alpha=3.0, max_turns=60),
        endings=(replace(am.endings[0], share=1.0),),
    )
    return replace(model, intents=(IntentModel("agent_tool_call"),), weights=(1.0,), agent=am)


def rows(
    name: str, model: WorkloadModel, lambda0: float, duration_s: float, seed: int,
    capacities: tuple[int, ...], warmup_fraction: float,
) -> list[str]:  # fmt: skip
    trace = generate(model, lambda0=lambda0, duration_s=duration_s, seed=seed,
                     block_size=BLOCK_SIZE)  # fmt: skip
    sim = trace.sim_trace()
    steady = sim.timestamp >= warmup_fraction * duration_s
    steady &= sim.timestamp < duration_s
    sample = steady_sample(
        list(trace.events()), BLOCK_SIZE, warmup_fraction * duration_s, duration_s
    )
    lru = get_policy("lru", "block")
    out = []
    mean_blocks = float(np.mean(sim.blocks))
    for capacity in capacities:
        hits = lru(sim, capacity)
        simulated = float(hits[steady].sum() / sim.blocks[steady].sum())
        cells = []
        for refinement in REFINEMENTS:
            try:
                h = forecast_from_sample(
                    sample, capacity, BLOCK_SIZE, refinement=refinement
                ).hit_ratio
                cells.append(f"{h:.3f} ({h - simulated:+.3f})")
            except ValueError:  # the shared-prefix forecast takes no fluctuation refinement
                cells.append("-")
        out.append(f"| {name} | {capacity:,} ({capacity / mean_blocks:.1f}) | {simulated:.3f} | "
                   + " | ".join(cells) + " |")  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tool_loop only")
    args = parser.parse_args(argv)
    print("| workload | capacity, blocks (mean contexts) | block-level LRU | "
          + " | ".join(REFINEMENTS) + " |")  # fmt: skip
    print("|---|---|---|" + "---|" * len(REFINEMENTS))
    caps = (60, 125, 250, 500, 1000, 2000)
    for seed in (1, 2):
        for line in rows(f"tool_loop, seed {seed}", tool_loop(), 0.05, 20_000.0, seed, caps, 0.2):
            print(line, flush=True)
    if not args.quick:
        agent_caps = (125, 250, 500, 1000, 2000, 4000, 16000)
        for line in rows(
            "agent", agent(), AGENT_LAMBDA0, AGENT_DURATION_S, AGENT_SEED, agent_caps, AGENT_WARMUP
        ):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
