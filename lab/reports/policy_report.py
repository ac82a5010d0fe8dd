"""The policy report: hit ratio against capacity for every block policy, and the forecast
against simulated LRU, on the Mooncake synthetic trace, the generated intent-mixed workload,
the generated presets with shared prefixes and the coding-agent preset (1,024-token blocks).

Hit ratios are reused input blocks / input blocks over the measured conversations (warm-up and
cool-down 0.2 of first-turn times). The IAC table is learned from the first 0.2 of the
conversations (the warm-up, so learning and measuring never share a conversation); the forecast
comes from the statistics of the whole trace, as ``docs/validation.md`` does.

``python -m kvcast.lab.reports.policy_report [--quick] [--jobs N] [--out docs]`` writes
``policies.md`` tables to stdout and ``policies_*.png`` into ``--out``; with ``--markdown
FILE`` it also regenerates FILE's results between the ``<!-- policy-report -->`` markers (so
``--out docs --markdown docs/policies.md`` regenerates the document in one command).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from kvcast.lab.reports.policy_plot import plot_report
from kvcast.lab.reports.policy_results import ForecastRow, PolicyRow, Report, Workload
from kvcast.lab.reports.samples import sample_from_events
from kvcast.lab.reports.tasks import map_tasks
from kvcast.lab.sim.block_cache import block_layout
from kvcast.lab.sim.measurement import first_times
from kvcast.lab.sim.registry import simulate
from kvcast.lab.sim.trace import SimTrace
from kvcast.lab.traces import convert_mooncake
from kvcast.lab.workload.generator import generate
from kvcast.lab.workload.presets import AGENT_PRESETS, SHARING_PRESETS, preset
from kvcast.stats.forecast import forecast_from_sample

# The repository's data/traces (shipped with the source: the lab runs from a checkout).
MOONCAKE = Path(__file__).resolve().parents[2] / "data" / "traces"
MOONCAKE_FILE = "mooncake_synthetic_trace.jsonl"
# (label, policy, options): every column of the policy table.
POLICY_SET: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("LRU", "lru", {}),
    ("LFU", "lfu", {}),
    ("GDSF", "gdsf", {}),
    ("IAC", "iac", {}),
    ("IAC size=request", "iac", {"size": "request"}),
    ("IAC rolling", "iac-rolling", {}),
    ("density", "density", {}),
    ("TB+S", "tbs", {}),
)
# (label, policy) at conversation granularity (Algorithm 1's whole-content cache).
CONVERSATION_SET: tuple[tuple[str, str], ...] = (
    ("LRU", "lru"),
    ("IAC", "iac"),
    ("density", "density"),
)


def mooncake_workload(path: Path | None = None, match: str = "hashable") -> Workload:
    """The Mooncake synthetic trace (512-token blocks), conversations by ``match``."""
    path = path or MOONCAKE / MOONCAKE_FILE
    with open(path, "rb") as fh:
        records = [(k, orjson.loads(line)) for k, line in enumerate(fh, 1) if line.strip()]
    events, summary = convert_mooncake(records, match=match)
    trace = SimTrace.from_event_dicts(events, 512)
    desc = (
        f"Mooncake synthetic trace: {summary.records:,} requests, 512-token blocks, "
        f"{summary.conversations:,} conversations recovered (match={match}, "
        f"{summary.events - summary.conversations:,} continuations, up to {summary.max_turn} "
        "turns); blocks shared across conversations by their hash_ids."
    )
    caps = (500, 1000, 2000, 4000, 8000, 16000, 32000)
    return Workload("mooncake", desc, events, trace, 512, caps)


# Capacities (blocks) of the generated workloads' sweeps. Agent contexts are ~110 blocks of
# 1,024 tokens (median), so its smallest capacity holds about one of them (issue 33: fewer
# blocks than two median contexts) and its largest nearly the unlimited cache.
CAPACITIES = (250, 500, 1000, 2000, 4000, 8000, 16000)
AGENT_CAPACITIES = (125, 250, 500, 1000, 2000, 4000, 16000)
# The agent preset's conversations are hours long: 0.02 roots/s gives a few dozen at once.
AGENT_LAMBDA0 = 0.02


def generated_workload(
    name: str = "mixed",
    lambda0: float = 2.0,
    conversations: int = 8000,
    seed: int = 7,
    block_size: int | None = None,
    capacities: tuple[int, ...] | None = None,
) -> Workload:
    """A generated workload (``kvcast.lab.workload.generator``) on ``block_size``-token blocks
    (None: the preset's own, 16 or the agent presets' 1,024); ``capacities`` (None: the
    agent presets' :data:`AGENT_CAPACITIES`, else :data:`CAPACITIES`)."""
    model = preset(name)
    gen = generate(
        model, lambda0=lambda0, conversations=conversations, seed=seed, block_size=block_size
    )
    desc = (
        f"generated `{name}` preset: {conversations:,} conversations at lambda0 = {lambda0}/s "
        f"(seed {seed}), {len(gen):,} requests, {gen.block_size:,}-token blocks, "
        + (
            "one chain per conversation."
            if gen.sim_trace().block_hashes is None
            else "block ids shared across conversations (its shared prefixes)."
        )
    )
    if capacities is None:
        capacities = AGENT_CAPACITIES if model.agent is not None else CAPACITIES
    warmup, cooldown = gen.measurement_fractions()
    trace = gen.sim_trace()
    rate = window_rate(trace, warmup, cooldown)
    return Workload(
        name, desc, list(gen.events()), trace, gen.block_size, capacities, warmup, cooldown, rate
    )


def window_rate(trace: SimTrace, warmup: float, cooldown: float) -> float:
    """Conversation starts per second within the measured window of first-turn times: the
    rate a daemon measures in steady traffic (branches' late tail and the empty start left
    out, as the sharing validation's ``steady_rate`` does)."""
    first = first_times(trace.conversation, trace.timestamp, trace.conversations)
    first = first[np.isfinite(first)]
    lo, hi = float(first.min()), float(first.max())
    start, end = lo + warmup * (hi - lo), hi - cooldown * (hi - lo)
    inside = np.count_nonzero((first >= start) & (first <= end))
    return inside / (end - start) if end > start else 0.0


def default_workloads(quick: bool = False, seed: int | None = None) -> list[Workload]:
    """Mooncake, the generated ``mixed`` workload, the presets with shared prefixes and the
    coding-agent presets (on their 1,024-token blocks), smaller under ``quick``; ``seed``
    generates every preset from that seed instead of the report's (7, and 3 for the agents)."""
    convs = 2000 if quick else 8000
    preset_seed = 7 if seed is None else seed
    out = [mooncake_workload(), generated_workload("mixed", conversations=convs, seed=preset_seed)]
    names = SHARING_PRESETS[-1:] if quick else SHARING_PRESETS
    out += [generated_workload(name, conversations=convs // 2, seed=preset_seed) for name in names]
    # Agent conversations run ~45 requests of ~110 blocks: 150 of them are 12,538 requests,
    # 1.75 M block references (seed 3: the workload of issue 33's last round).
    agents, caps = (60, (250, 1000, 4000)) if quick else (150, None)
    return out + [
        generated_workload(
            name,
            lambda0=AGENT_LAMBDA0,
            conversations=agents,
            seed=3 if seed is None else seed,
            capacities=caps,
        )
        for name in AGENT_PRESETS
    ]


def run_policy_report(
    workloads: Sequence[Workload] | None = None,
    policies: Sequence[tuple[str, str, dict[str, Any]]] = POLICY_SET,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
    conversation_policies: Sequence[tuple[str, str]] = CONVERSATION_SET,
    jobs: int = 1,
) -> Report:
    """Sweep every policy over every workload's capacities; forecast against LRU. The
    workloads are independent: with ``jobs`` > 1 they run in that many worker processes
    (``progress`` then hears one line per workload, as each comes back)."""
    start = time.perf_counter()
    if workloads is None:
        workloads = default_workloads(quick)
    report = Report()
    if jobs > 1:
        sweep = functools.partial(
            sweep_workload, policies=policies, conversation_policies=conversation_policies
        )
        parts = map_tasks(sweep, workloads, jobs)
    else:
        parts = [sweep_workload(wl, policies, conversation_policies, progress) for wl in workloads]
    for wl, part in zip(workloads, parts, strict=True):
        report.workloads.update(part.workloads)
        report.unlimited.update(part.unlimited)
        report.policies += part.policies
        report.forecasts += part.forecasts
        if jobs > 1 and progress is not None:
            progress(f"{wl.name}: {time.perf_counter() - start:.0f} s")
    report.elapsed_s = time.perf_counter() - start
    return report


def sweep_workload(
    wl: Workload,
    policies: Sequence[tuple[str, str, dict[str, Any]]] = POLICY_SET,
    conversation_policies: Sequence[tuple[str, str]] = CONVERSATION_SET,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """One workload's part of the report: every policy at every capacity, the unlimited
    cache, the forecast rows."""
    start = time.perf_counter()
    report = Report()
    report.workloads[wl.name] = wl.description
    layout = block_layout(wl.trace)
    sample = sample_from_events(wl.events, wl.block_size)
    if wl.lambda0 is not None:
        sample = replace(sample, lambda0=wl.lambda0)
    everything = int(wl.trace.blocks.sum()) + 1
    window = (wl.warmup_fraction, wl.cooldown_fraction)
    report.unlimited[wl.name] = simulate(
        wl.trace, everything, "lru", "block", *window, layout=layout
    ).hit_ratio
    for n in wl.capacities:
        for label, policy, options in policies:
            res = simulate(
                wl.trace, n, policy, "block", *window, layout=layout,
                **_learning(policy, wl), **options,
            )  # fmt: skip
            report.policies.append(PolicyRow(wl.name, n, label, res.hit_ratio, res.elapsed_s))
            if progress is not None:
                progress(f"{wl.name} N={n} {label}: {res.hit_ratio:.3f}")
        for label, policy in conversation_policies:
            learning = _learning(policy, wl)
            res = simulate(wl.trace, n, policy, "conversation", *window, **learning)
            report.policies.append(
                PolicyRow(wl.name, n, label, res.hit_ratio, res.elapsed_s, "conversation")
            )
        conv = (
            report.hit(wl.name, n, "LRU", "conversation")
            if any(label == "LRU" for label, _ in conversation_policies)
            else simulate(wl.trace, n, "lru", "conversation", *window).hit_ratio
        )
        fc = forecast_from_sample(sample, n, wl.block_size)
        report.forecasts.append(
            ForecastRow(
                wl.name,
                n,
                fc.hit_ratio,
                fc.hit_ratio_single_class,
                report.hit(wl.name, n, "LRU"),
                conv,
            )
        )
    report.elapsed_s = time.perf_counter() - start
    return report


def _learning(policy: str, wl: Workload) -> dict[str, Any]:
    """A learned table's history is the warm-up: never a measured conversation."""
    return {"learn_fraction": wl.warmup_fraction} if policy in ("iac", "density") else {}


BEGIN, END = "<!-- policy-report:begin -->", "<!-- policy-report:end -->"


def write_between_markers(path: Path, text: str, begin: str = BEGIN, end: str = END) -> None:
    """Replace what lies between the ``begin`` and ``end`` markers in ``path`` with ``text``."""
    doc = path.read_text()
    if begin not in doc or end not in doc:
        raise SystemExit(f"{path}: no {begin} ... {end} markers to write the tables between")
    head, rest = doc.split(begin, 1)
    _, tail = rest.split(end, 1)
    path.write_text(f"{head}{begin}\n{text.rstrip()}\n{end}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller generated workload")
    parser.add_argument("--out", default="docs", help="directory for the PNG figures")
    parser.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    parser.add_argument(
        "--jobs", type=int, default=1, help="worker processes, one workload each (default 1)"
    )
    parser.add_argument(
        "--markdown",
        metavar="FILE",
        help="also write the tables into FILE between its policy-report markers",
    )
    args = parser.parse_args(argv)
    tty = sys.stderr.isatty()
    report = run_policy_report(
        quick=args.quick,
        progress=(lambda m: print(f"\r{m:<60}", end="", file=sys.stderr)) if tty else None,
        jobs=max(1, args.jobs),
    )
    if tty:
        print(file=sys.stderr)
    paths = plot_report(report, args.out)
    if args.markdown:
        target = Path(args.markdown)
        figures = "\n\n".join(
            f"![{p.stem.removeprefix('policies_')}]({os.path.relpath(p, target.parent)})"
            for p in paths
        )
        write_between_markers(target, f"{figures}\n\n{report.to_markdown()}")
    if args.json:
        print(orjson.dumps(report.to_dict()).decode())
    else:
        print(report.to_markdown())
        print("figures: " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
