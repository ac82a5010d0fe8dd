"""The policy report: hit ratio against capacity for every block policy, and the forecast
against simulated LRU, on the Mooncake synthetic trace and on generated intent-mixed workloads.

Hit ratios are reused input blocks / input blocks over the measured conversations (warm-up and
cool-down 0.2 of first-turn times). The IAC table is learned from the first 0.2 of the
conversations (the warm-up, so learning and measuring never share a conversation); the forecast
comes from the statistics of the whole trace, as ``docs/validation.md`` does.

``python -m kvcast.daemon.bench.policy_report [--quick] [--out docs]`` writes
``policies.md`` tables to stdout and ``policies_*.png`` into ``--out``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from kvcast.daemon.bench.validation import sample_from_events
from kvcast.stats.block_sim import block_layout
from kvcast.stats.forecast import forecast_from_sample
from kvcast.stats.generator import generate, preset
from kvcast.stats.lru_sim import SimTrace, simulate
from kvcast.stats.traces import convert_mooncake

MOONCAKE = Path(__file__).resolve().parents[3] / "shared" / "data"  # ../shared/data
MOONCAKE_FILE = "mooncake_synthetic_trace.jsonl"
# (label, policy, options): every column of the policy table.
POLICY_SET: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("LRU", "lru", {}),
    ("LFU", "lfu", {}),
    ("GDSF", "gdsf", {}),
    ("IAC", "iac", {}),
    ("IAC size=request", "iac", {"size": "request"}),
    ("IAC rolling", "iac-rolling", {}),
    ("TB+S", "tbs", {}),
)


@dataclass(frozen=True)
class Workload:
    """A trace to sweep: its events (for the forecast), its simulator view and capacities."""

    name: str
    description: str
    events: list[dict[str, Any]]
    trace: SimTrace
    block_size: int
    capacities: tuple[int, ...]


@dataclass(frozen=True)
class PolicyRow:
    workload: str
    capacity_blocks: int
    policy: str
    hit_ratio: float
    elapsed_s: float


@dataclass(frozen=True)
class ForecastRow:
    """Forecast (product and single-class) against simulated LRU at both granularities."""

    workload: str
    capacity_blocks: int
    forecast: float | None
    forecast_single_class: float | None
    lru_block: float
    lru_conversation: float


@dataclass
class Report:
    """Results of :func:`run_policy_report`."""

    policies: list[PolicyRow] = field(default_factory=list)
    forecasts: list[ForecastRow] = field(default_factory=list)
    workloads: dict[str, str] = field(default_factory=dict)
    elapsed_s: float = 0.0

    def rows(self) -> list[dict[str, Any]]:
        """Flat rows, one per (workload, capacity, policy), for JSON and the bench table."""
        return [asdict(r) for r in self.policies]

    def to_dict(self) -> dict[str, Any]:
        return {
            "policies": self.rows(),
            "forecasts": [asdict(r) for r in self.forecasts],
            "workloads": self.workloads,
            "elapsed_s": self.elapsed_s,
        }

    def hit(self, workload: str, capacity: int, policy: str) -> float:
        for r in self.policies:
            if (r.workload, r.capacity_blocks, r.policy) == (workload, capacity, policy):
                return r.hit_ratio
        raise KeyError((workload, capacity, policy))

    def to_markdown(self) -> str:
        """Per workload: hit ratio per policy and capacity (IAC gain over LRU in %), then the
        forecast's error against block- and conversation-level LRU (forecast minus sim)."""
        out: list[str] = []
        labels = list(dict.fromkeys(r.policy for r in self.policies))
        for name, desc in self.workloads.items():
            caps = sorted({r.capacity_blocks for r in self.policies if r.workload == name})
            out += [f"### {name}", "", desc, ""]
            out.append("| N (blocks) | " + " | ".join(labels) + " | IAC vs LRU |")
            out.append("|---" * (len(labels) + 2) + "|")
            for n in caps:
                vals = [self.hit(name, n, p) for p in labels]
                lru, iac = self.hit(name, n, "LRU"), self.hit(name, n, "IAC")
                gain = f"{100 * (iac / lru - 1):+.0f}%" if lru > 0 else "n/a"
                cells = " | ".join(f"{v:.3f}" for v in vals)
                out.append(f"| {n:,} | {cells} | {gain} |")
            out += [
                "",
                "| N (blocks) | LRU block | LRU conv. | forecast | error vs block | "
                "error vs conv. | single-class | its error vs conv. |",
                "|---" * 8 + "|",
            ]
            for f in (r for r in self.forecasts if r.workload == name):
                out.append(
                    f"| {f.capacity_blocks:,} | {f.lru_block:.3f} | {f.lru_conversation:.3f} | "
                    f"{_fmt(f.forecast)} | {_err(f.forecast, f.lru_block)} | "
                    f"{_err(f.forecast, f.lru_conversation)} | {_fmt(f.forecast_single_class)} | "
                    f"{_err(f.forecast_single_class, f.lru_conversation)} |"
                )
            out.append("")
        return "\n".join(out)

    def plot(self, directory: str | Path) -> list[Path]:
        """Write ``policies_<workload>.png`` per workload (hit ratio vs N per policy, and the
        forecast vs simulated LRU); returns the paths."""
        from kvcast.daemon.bench.policy_plot import plot_workload

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        return [plot_workload(self, name, directory) for name in self.workloads]


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _err(x: float | None, ref: float) -> str:
    return "n/a" if x is None else f"{x - ref:+.3f}"


def mooncake_workload(path: Path | None = None, match: str = "hashable") -> Workload:
    """The Mooncake synthetic trace (512-token blocks), conversations by ``match``."""
    path = path or MOONCAKE / MOONCAKE_FILE
    with open(path, "rb") as fh:
        records = [(k, orjson.loads(line)) for k, line in enumerate(fh, 1) if line.strip()]
    events, summary = convert_mooncake(records, match=match)
    trace = SimTrace.from_columns(
        [e["session_id"] for e in events],
        [e["turn"] for e in events],
        [e["timestamp"] for e in events],
        [e["input_tokens"] for e in events],
        512,
        block_hashes=[e["block_hashes"] for e in events],
    )
    desc = (
        f"Mooncake synthetic trace: {summary.records:,} requests, 512-token blocks, "
        f"{summary.conversations:,} conversations recovered (match={match}, "
        f"{summary.events - summary.conversations:,} continuations, up to {summary.max_turn} "
        "turns); blocks shared across conversations by their hash_ids."
    )
    caps = (500, 1000, 2000, 4000, 8000, 16000, 32000)
    return Workload("mooncake", desc, events, trace, 512, caps)


def generated_workload(
    name: str = "mixed", lambda0: float = 2.0, conversations: int = 8000, seed: int = 7
) -> Workload:
    """A generated intent-mixed workload (16-token blocks; ``kvcast.stats.generator``)."""
    gen = generate(preset(name), lambda0=lambda0, conversations=conversations, seed=seed)
    desc = (
        f"generated `{name}` preset: {conversations:,} conversations at lambda0 = {lambda0}/s "
        f"(seed {seed}), {len(gen):,} requests, 16-token blocks, one chain per conversation."
    )
    caps = (250, 500, 1000, 2000, 4000, 8000, 16000)
    return Workload(name, desc, list(gen.events()), gen.sim_trace(), 16, caps)


def run_policy_report(
    workloads: Sequence[Workload] | None = None,
    policies: Sequence[tuple[str, str, dict[str, Any]]] = POLICY_SET,
    quick: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Report:
    """Sweep every policy over every workload's capacities; forecast against LRU."""
    start = time.perf_counter()
    if workloads is None:
        convs = 2000 if quick else 8000
        workloads = [mooncake_workload(), generated_workload("mixed", conversations=convs)]
    report = Report()
    for wl in workloads:
        report.workloads[wl.name] = wl.description
        layout = block_layout(wl.trace)
        sample = sample_from_events(wl.events, wl.block_size)
        for n in wl.capacities:
            for label, policy, options in policies:
                res = simulate(wl.trace, n, policy, "block", layout=layout, **options)
                report.policies.append(PolicyRow(wl.name, n, label, res.hit_ratio, res.elapsed_s))
                if progress is not None:
                    progress(f"{wl.name} N={n} {label}: {res.hit_ratio:.3f}")
            conv = simulate(wl.trace, n, "lru", "conversation").hit_ratio
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smaller generated workload")
    parser.add_argument("--out", default="docs", help="directory for the PNG figures")
    parser.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    args = parser.parse_args(argv)
    tty = sys.stderr.isatty()
    report = run_policy_report(
        quick=args.quick,
        progress=(lambda m: print(f"\r{m:<60}", end="", file=sys.stderr)) if tty else None,
    )
    if tty:
        print(file=sys.stderr)
    paths = report.plot(args.out)
    if args.json:
        print(orjson.dumps(report.to_dict()).decode())
    else:
        print(report.to_markdown())
        print("figures: " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
