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
    # The measured conversations (and the tables' history, the warm-up): fractions of the span
    # of first-turn times (SPEC section 4).
    warmup_fraction: float = 0.2
    cooldown_fraction: float = 0.2
    # Conversation starts per second over the measured window, for the forecast rows (None:
    # the statistics' own rate over the whole input).
    lambda0: float | None = None


@dataclass(frozen=True)
class PolicyRow:
    workload: str
    capacity_blocks: int
    policy: str
    hit_ratio: float
    elapsed_s: float
    granularity: str = "block"


# The policies the targets of issue 21 compare (labels of the report's columns).
LRU, IAC, DENSITY, GDSF, TBS = "LRU", "IAC", "density", "GDSF", "TB+S"
RATIO_FLOOR = 0.995  # density >= this x LRU everywhere ("allowing for noise")
GAP_SHARE = 1 / 3  # of the LRU-to-TB+S gap, where LRU holds under half of the unlimited cache


def gap_closed(value: float, lru: float, tbs: float) -> float | None:
    """The fraction of the LRU-to-TB+S gap that ``value`` closes (None: no gap to close)."""
    return None if tbs - lru < 1e-3 else (value - lru) / (tbs - lru)


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
    unlimited: dict[str, float] = field(default_factory=dict)
    """Per workload: block-level LRU's hit ratio with room for every block (the ceiling)."""
    elapsed_s: float = 0.0

    def rows(self) -> list[dict[str, Any]]:
        """Flat rows, one per (workload, capacity, policy), for JSON and the bench table."""
        return [asdict(r) for r in self.policies]

    def bench_rows(self) -> list[tuple[str, str, str, str]]:
        """(benchmark, figure, baseline, ratio) rows for ``kvcast bench``: density against
        LRU (and IAC, TB+S) at every block-level capacity."""
        out = []
        for name in self.workloads:
            caps = sorted({r.capacity_blocks for r in self.policies if r.workload == name})
            for n in caps:
                if not self._has(name, n, LRU, DENSITY):
                    continue
                lru, dens = self.hit(name, n, LRU), self.hit(name, n, DENSITY)
                others = [f"{lru:.3f} (LRU)"] + [
                    f"{self.hit(name, n, p):.3f} ({p})" for p in (IAC, TBS) if self._has(name, n, p)
                ]
                ratio = f"{dens / lru:.3f}x LRU" if lru > 0 else "n/a"
                out.append(
                    (f"policies: density, {name} N={n:,}", f"{dens:.3f}", ", ".join(others), ratio)
                )
        return out

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Report:
        """The report :meth:`to_dict` wrote (its ``--json`` output)."""
        return cls(
            policies=[PolicyRow(**r) for r in doc["policies"]],
            forecasts=[ForecastRow(**r) for r in doc["forecasts"]],
            workloads=dict(doc["workloads"]),
            unlimited=dict(doc.get("unlimited", {})),
            elapsed_s=float(doc.get("elapsed_s", 0.0)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "policies": self.rows(),
            "forecasts": [asdict(r) for r in self.forecasts],
            "workloads": self.workloads,
            "unlimited": self.unlimited,
            "targets": self.targets(),
            "elapsed_s": self.elapsed_s,
        }

    def hit(self, workload: str, capacity: int, policy: str, granularity: str = "block") -> float:
        for r in self.policies:
            if (r.workload, r.capacity_blocks, r.policy, r.granularity) == (
                workload,
                capacity,
                policy,
                granularity,
            ):
                return r.hit_ratio
        raise KeyError((workload, capacity, policy, granularity))

    def _has(self, workload: str, capacity: int, *policies: str) -> bool:
        have = {
            r.policy
            for r in self.policies
            if r.workload == workload and r.capacity_blocks == capacity and r.granularity == "block"
        }
        return all(p in have for p in policies)

    def targets(self) -> list[dict[str, Any]]:
        """Issue 21's three targets at every (workload, capacity) where they apply: density vs
        LRU (ratio >= 0.995), density vs IAC where IAC beats LRU, and the share of the
        LRU-to-TB+S gap density closes where LRU's hit ratio is under half the unlimited one's.
        Each row: workload, capacity, target, value, met."""
        out: list[dict[str, Any]] = []
        for name in self.workloads:
            caps = sorted({r.capacity_blocks for r in self.policies if r.workload == name})
            for n in caps:
                if not self._has(name, n, LRU, DENSITY):
                    continue
                lru, dens = self.hit(name, n, LRU), self.hit(name, n, DENSITY)
                ratio = dens / lru if lru > 0 else None
                out.append(
                    {"workload": name, "capacity_blocks": n, "target": "density/LRU >= 0.995",
                     "value": ratio, "met": ratio is None or ratio >= RATIO_FLOOR}
                )  # fmt: skip
                if self._has(name, n, IAC) and self.hit(name, n, IAC) > lru:
                    iac = self.hit(name, n, IAC)
                    out.append(
                        {"workload": name, "capacity_blocks": n, "target": "density >= IAC",
                         "value": dens - iac, "met": dens >= iac}
                    )  # fmt: skip
                unl = self.unlimited.get(name)
                if self._has(name, n, TBS) and unl is not None and lru < 0.5 * unl:
                    closed = gap_closed(dens, lru, self.hit(name, n, TBS))
                    out.append(
                        {"workload": name, "capacity_blocks": n,
                         "target": "density closes >= 1/3 of the LRU-to-TB+S gap",
                         "value": closed, "met": closed is not None and closed >= GAP_SHARE}
                    )  # fmt: skip
        return out

    def to_markdown(self) -> str:
        """Per workload: hit ratio per policy and capacity (IAC and density relative to LRU,
        and the share of the LRU-to-TB+S gap IAC, density and GDSF close), the
        conversation-level rows, then the forecast's error against block- and
        conversation-level LRU (forecast minus sim); last, the targets."""
        out: list[str] = []
        block = [r for r in self.policies if r.granularity == "block"]
        labels = list(dict.fromkeys(r.policy for r in block))
        for name, desc in self.workloads.items():
            caps = sorted({r.capacity_blocks for r in block if r.workload == name})
            out += [f"### {name}", "", desc, ""]
            unl = self.unlimited.get(name)
            if unl is not None:
                out += [f"Unlimited cache (LRU with room for every block): {unl:.3f}. "
                        "`*`: LRU below half of it.", ""]  # fmt: skip
            versus = [p for p in (IAC, DENSITY) if p in labels]
            gaps = [p for p in (IAC, DENSITY, GDSF) if p in labels] if TBS in labels else []
            head = labels + [f"{p} vs LRU" for p in versus] + [f"gap closed: {p}" for p in gaps]
            out.append("| N (blocks) | " + " | ".join(head) + " |")
            out.append("|---" * (len(head) + 1) + "|")
            for n in caps:
                lru = self.hit(name, n, LRU)
                cells = [f"{self.hit(name, n, p):.3f}" for p in labels]
                cells += [
                    f"{100 * (self.hit(name, n, p) / lru - 1):+.1f}%" if lru > 0 else "n/a"
                    for p in versus
                ]
                tbs = self.hit(name, n, TBS) if gaps else 0.0
                for p in gaps:
                    closed = gap_closed(self.hit(name, n, p), lru, tbs)
                    cells.append("n/a" if closed is None else f"{100 * closed:+.0f}%")
                star = "*" if unl is not None and lru < 0.5 * unl else ""
                out.append(f"| {n:,}{star} | " + " | ".join(cells) + " |")
            conv = [
                r for r in self.policies if r.granularity == "conversation" and r.workload == name
            ]
            if conv:
                clabels = list(dict.fromkeys(r.policy for r in conv))
                out += ["", "Conversation level (whole conversations, Algorithm 1's model):", "",
                        "| N (blocks) | " + " | ".join(clabels) + " |",
                        "|---" * (len(clabels) + 1) + "|"]  # fmt: skip
                for n in sorted({r.capacity_blocks for r in conv}):
                    cells = [f"{self.hit(name, n, p, 'conversation'):.3f}" for p in clabels]
                    out.append(f"| {n:,} | " + " | ".join(cells) + " |")
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
        targets = self.targets()
        if targets:
            out += ["### Targets (issue 21)", ""]
            for goal in dict.fromkeys(t["target"] for t in targets):
                rows = [t for t in targets if t["target"] == goal]
                missed = [t for t in rows if not t["met"]]
                where = ", ".join(
                    f"{t['workload']} N={t['capacity_blocks']:,} ({_target_value(t)})"
                    for t in missed
                )
                out.append(
                    f"- {goal}: met at {len(rows) - len(missed)} of {len(rows)}"
                    + (f"; missed at {where}" if missed else "")
                )
            out.append("")
        return "\n".join(out)


def _target_value(t: dict[str, Any]) -> str:
    v = t["value"]
    if v is None:
        return "n/a"
    if t["target"].startswith("density >= IAC"):
        return f"{v:+.3f}"
    if "gap" in t["target"]:
        return f"{100 * v:.0f}%"
    return f"{v:.3f}"


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def _err(x: float | None, ref: float) -> str:
    return "n/a" if x is None else f"{x - ref:+.3f}"
