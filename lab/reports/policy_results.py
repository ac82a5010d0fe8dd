"""The policy report's results: hit ratio per (workload, capacity, policy), forecast rows,
and their Markdown tables."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kvcast.lab.sim.trace import SimTrace


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


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _err(x: float | None, ref: float) -> str:
    return "n/a" if x is None else f"{x - ref:+.3f}"
