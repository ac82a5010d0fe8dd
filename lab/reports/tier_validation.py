"""Validation of the tiered forecast against the tiered block simulator (docs/validation.md).

For every generator preset (the sharing presets, the conversation presets ``mixed``, ``single``
and ``lognormal``, and ``agent`` with its own blocks, rate and capacities) and the Mooncake
synthetic trace in ``data/traces/``, the events go through the product's statistics path
(``sample_from_events``, as ``kvcast.lab.reports.sharing_validation`` does; ``agent``'s steady
part, as ``kvcast.lab.reports.big_context_validation`` does) and ``forecast_from_sample`` gives
each tier's share of the input blocks at a grid of (GPU, host) capacities, both tier modes; the
tiered LRU block cache (``kvcast.lab.sim.tiered_cache``, what ``kvcast simulate --granularity
block --tier host=N2`` runs) measures the same on the same requests. Errors are forecast minus
simulation, per tier.

``python -m kvcast.lab.reports.tier_validation [--quick] [--markdown F] [--json F]
[--plot docs/validation_tiers.png] [--jobs N]``
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvcast.lab.reports.tasks import report_main, run_per_workload
from kvcast.lab.reports.workloads import (
    AGENT_DURATION_S,
    DEFAULT_MOONCAKE,
    ValidationWorkload,
    agent_workload,
    generated_workload,
    mooncake_workload,
)
from kvcast.lab.sim.block_cache import block_layout
from kvcast.lab.sim.tiered_cache import measure_tiers, tiered_block_hits
from kvcast.lab.workload.presets import SHARING_PRESETS
from kvcast.stats.forecast import forecast_from_sample
from kvcast.stats.tiers import TIER_MODES, Tier

TARGET = 0.02  # |forecast - simulation| per tier (issue 34's done-when)


@dataclass(frozen=True)
class TierGrid:
    """Workloads and the (GPU, host) capacities (blocks) of the tier validation."""

    presets: tuple[str, ...] = (*SHARING_PRESETS, "mixed", "single", "lognormal", "agent")
    lambda0: float = 0.5
    duration_s: float = 40_000.0
    gpu: tuple[int, ...] = (1000, 2000, 4000)
    host: tuple[int, ...] = (4000, 8000, 16000)  # >= every GPU size: inclusive is defined
    # The `agent` preset's own (1,024-token blocks, contexts of ~137 blocks on average):
    # from two contexts' worth of GPU blocks to a host tier of ~30 contexts.
    agent_gpu: tuple[int, ...] = (250, 500, 1000)
    agent_host: tuple[int, ...] = (1000, 2000, 4000)
    agent_duration_s: float = AGENT_DURATION_S
    modes: tuple[str, ...] = TIER_MODES
    mooncake: str | None = str(DEFAULT_MOONCAKE)
    block_size: int = 16
    seed: int = 1
    jobs: int = 2

    @classmethod
    def quick(cls) -> TierGrid:
        return cls(
            presets=("shared_system",),
            duration_s=3_000.0,
            gpu=(300, 600, 1200),
            host=(1200, 2400, 4800),
            mooncake=None,
        )


@dataclass(frozen=True)
class TierPoint:
    """One (workload, mode, GPU, host) point: forecast and simulated share per tier."""

    workload: str
    mode: str
    gpu_blocks: int
    host_blocks: int
    simulated_gpu: float
    simulated_host: float
    forecast_gpu: float
    forecast_host: float

    @property
    def errors(self) -> tuple[float, float]:
        return self.forecast_gpu - self.simulated_gpu, self.forecast_host - self.simulated_host

    @property
    def total_error(self) -> float:
        return sum(self.errors)


@dataclass
class TierReport:
    grid: TierGrid
    points: list[TierPoint] = field(default_factory=list)
    elapsed_s: float = 0.0

    def workloads(self) -> list[str]:
        return list(dict.fromkeys(p.workload for p in self.points))

    def max_error(self, workload: str, mode: str) -> float:
        """Largest |forecast - simulation| of any tier of the workload in ``mode``."""
        return max(
            max(abs(e) for e in p.errors)
            for p in self.points
            if p.workload == workload and p.mode == mode
        )

    def passed(self, workload: str | None = None) -> bool:
        names = [workload] if workload else self.workloads()
        return all(self.max_error(w, m) <= TARGET for w in names for m in self.grid.modes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "grid": asdict(self.grid),
            "points": [asdict(p) for p in self.points],
            "max_error": {
                f"{w} {m}": self.max_error(w, m) for w in self.workloads() for m in self.grid.modes
            },
            "target": TARGET,
            "passed": self.passed(),
            "elapsed_s": self.elapsed_s,
        }

    def to_markdown(self) -> str:
        lines = [
            "| workload | mode | GPU | host | simulated gpu | host | forecast gpu | host "
            "| error gpu | error host | error total |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for p in self.points:
            eg, eh = p.errors
            lines.append(
                f"| {p.workload} | {p.mode} | {p.gpu_blocks:,} | {p.host_blocks:,} "
                f"| {p.simulated_gpu:.4f} | {p.simulated_host:.4f} | {p.forecast_gpu:.4f} "
                f"| {p.forecast_host:.4f} | {eg:+.4f} | {eh:+.4f} | {p.total_error:+.4f} |"
            )
        lines += [
            "",
            "| workload | max abs error per tier, exclusive | inclusive | target |",
            "|---|---|---|---|",
        ]
        for w in self.workloads():
            errs = [self.max_error(w, m) for m in self.grid.modes]
            ok = "met" if self.passed(w) else "**missed**"
            cells = " | ".join(f"{e:.4f}" for e in errs)
            lines.append(f"| {w} | {cells} | {TARGET} ({ok}) |")
        return "\n".join(lines)


def _points(
    name: str,
    w: ValidationWorkload,
    grid: TierGrid,
    measured: tuple[float, float],
    gpus: tuple[int, ...],
    hosts: tuple[int, ...],
) -> list[TierPoint]:
    layout = block_layout(w.trace)  # one layout for every run on this trace
    steady = w.steady_requests()  # None: whole conversations by the measured fractions
    out = []
    for mode in grid.modes:
        for gpu in gpus:
            for host in hosts:
                caps = [gpu, host]
                served = tiered_block_hits(w.trace, caps, mode, layout=layout)
                sim = measure_tiers(
                    w.trace, served, ["gpu", "host"], caps, mode, *measured, requests=steady
                ).tiers
                f = forecast_from_sample(
                    w.sample, gpu, w.block_size, tiers=[Tier("host", host)], tier_mode=mode
                )
                out.append(
                    TierPoint(
                        workload=name,
                        mode=mode,
                        gpu_blocks=gpu,
                        host_blocks=host,
                        simulated_gpu=sim[0].hit_ratio,
                        simulated_host=sim[1].hit_ratio,
                        forecast_gpu=float(f.tiers[0].hit_ratio or 0.0),
                        forecast_host=float(f.tiers[1].hit_ratio or 0.0),
                    )
                )
    return out


def evaluate_preset(name: str, grid: TierGrid) -> list[TierPoint]:
    if name == "agent":
        w = agent_workload(grid.agent_duration_s)
        return _points(name, w, grid, w.measured, grid.agent_gpu, grid.agent_host)
    w = generated_workload(name, grid)
    return _points(name, w, grid, w.measured, grid.gpu, grid.host)


def evaluate_mooncake(path: str, grid: TierGrid) -> list[TierPoint]:
    w = mooncake_workload(path)
    # As in the sharing validation: the trace drifts (its load doubles in 17 minutes), so it
    # is measured both as the other workloads are and whole (the conversations its statistics
    # come from).
    name = "mooncake synthetic"
    return _points(name, w, grid, w.measured, grid.gpu, grid.host) + _points(
        f"{name}, measured whole", w, grid, (0.0, 0.0), grid.gpu, grid.host
    )


def run_tier_validation(
    grid: TierGrid | None = None, progress: Callable[[str], None] | None = None
) -> TierReport:
    report = TierReport(grid or TierGrid())
    return run_per_workload(report, evaluate_preset, evaluate_mooncake, "tiers", progress)


def plot_tiers(report: TierReport, path: str | Path) -> None:
    """Per workload: forecast against simulated share of each tier, both modes (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = report.workloads()
    modes = report.grid.modes
    fig, axes = plt.subplots(
        len(modes), len(workloads), figsize=(3.0 * len(workloads), 3.0 * len(modes)),
        squeeze=False,
    )  # fmt: skip
    for row, mode in enumerate(modes):
        for col, w in enumerate(workloads):
            ax = axes[row][col]
            pts = [p for p in report.points if p.workload == w and p.mode == mode]
            sim_g = np.array([p.simulated_gpu for p in pts])
            sim_h = np.array([p.simulated_host for p in pts])
            ax.plot(sim_g, [p.forecast_gpu for p in pts], "o", color="tab:blue", label="gpu")
            ax.plot(sim_h, [p.forecast_host for p in pts], "s", color="tab:orange", label="host")
            ax.plot(
                sim_g + sim_h, [p.forecast_gpu + p.forecast_host for p in pts], "^",
                color="tab:green", label="total",
            )  # fmt: skip
            lim = [0.0, 1.0]
            ax.plot(lim, lim, color="black", linewidth=0.6)
            ax.fill_between(
                lim, [v - TARGET for v in lim], [v + TARGET for v in lim], color="tab:green",
                alpha=0.12,
            )  # fmt: skip
            ax.set_xlim(lim)
            ax.set_ylim(lim)
            ax.set_title(f"{w}\n{mode}", fontsize=8)
            ax.set_xlabel("simulated share", fontsize=8)
            ax.set_ylabel("forecast share", fontsize=8)
            ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    grids = (TierGrid(), TierGrid.quick())
    return report_main(
        argv, (__doc__ or "").splitlines()[0], grids, run_tier_validation, plot_tiers
    )


if __name__ == "__main__":
    raise SystemExit(main())
