"""Figures of the policy report (matplotlib, Agg; the ``bench`` extra)."""

from __future__ import annotations

from pathlib import Path

from kvcast.lab.reports.policy_results import Report

_STYLE = {
    "TB+S": "k--",
    "LRU": "C0-",
    "LFU": "C7-",
    "GDSF": "C1-",
    "IAC": "C3-",
    "IAC size=request": "C2--",
    "IAC rolling": "C3:",
    "density": "C4-",
}


def block_curves(report: Report, workload: str) -> dict[str, tuple[list[int], list[float]]]:
    """Per block-level policy of ``workload``: (capacities in blocks, hit ratios). The
    conversation-level rows share the labels LRU, IAC and density and are left out: drawn on the
    same line they made each curve zigzag between the two granularities."""
    curves: dict[str, tuple[list[int], list[float]]] = {}
    for r in report.policies:
        if r.workload == workload and r.granularity == "block":
            xs, ys = curves.setdefault(r.policy, ([], []))
            xs.append(r.capacity_blocks)
            ys.append(r.hit_ratio)
    return curves


def plot_workload(report: Report, workload: str, directory: Path) -> Path:
    """Left: hit ratio vs capacity (log) per policy. Right: the forecast (product and
    single-class) against simulated LRU at block and conversation granularity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.4))
    for label, (xs, ys) in block_curves(report, workload).items():
        left.plot(xs, ys, _STYLE.get(label, "-"), marker="o", ms=3, label=label)
    left.set(
        xscale="log",
        xlabel="capacity N (blocks)",
        ylabel="hit ratio (blocks)",
        title=f"{workload}: eviction policies (block level)",
    )
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    rows = [f for f in report.forecasts if f.workload == workload]
    xs = [f.capacity_blocks for f in rows]
    right.plot(xs, [f.lru_block for f in rows], "C0o-", label="LRU simulated, block level")
    right.plot(
        xs, [f.lru_conversation for f in rows], "C2s-", label="LRU simulated, conversation (Alg. 1)"
    )
    right.plot(xs, [f.forecast for f in rows], "C3--", label="forecast (hit_ratio)")
    right.plot(xs, [f.forecast_single_class for f in rows], "C1:", label="forecast (single class)")
    right.set(
        xscale="log",
        xlabel="capacity N (blocks)",
        ylabel="hit ratio (blocks)",
        title=f"{workload}: forecast vs simulated LRU",
    )
    right.grid(alpha=0.3)
    right.legend(fontsize=8)
    fig.tight_layout()
    path = directory / f"policies_{workload}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_report(report: Report, directory: str | Path) -> list[Path]:
    """Write ``policies_<workload>.png`` per workload (hit ratio vs N per policy, and the
    forecast vs simulated LRU); returns the paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return [plot_workload(report, name, directory) for name in report.workloads]
